"""Subtests (pytest's ``subtests`` fixture and ``unittest``'s ``self.subTest``): every subtest gets
a figure of its own, listed under its test, in process and isolated; the test's budget and marker
apply to the test as a whole.

The subtests hold plain NumPy arrays of known sizes: TensorFlow adds nothing here.
"""

from __future__ import annotations

import json

import pytest

MIB = 2**20
RETAINED = r"[+-]?[\d.]+ \w?i?B"  # a signed size in the retained column

SUBTESTS = '''
import unittest

import numpy as np
import pytest

MIB = 2**20


class Case(unittest.TestCase):
    def test_method(self):
        for i in range(3):
            with self.subTest(i=i):
                block = np.ones((i + 1) * 10 * MIB, dtype=np.uint8)
                del block


def test_function(subtests):
    for i in range(2):
        with subtests.test("sized", i=i):
            block = np.ones((i + 1) * 20 * MIB, dtype=np.uint8)
            assert i == 0, "the second subtest fails on its own"
            del block


@pytest.mark.tfmem(budget="100MB")
def test_marked(subtests):
    with subtests.test(size="60MB"):
        block = np.ones(60 * MIB, dtype=np.uint8)
        del block
    with subtests.test("skipped"):
        pytest.skip("a subtest skipped on its own")
'''


def subtest_peaks(test: dict) -> dict[str, int]:
    return {subtest["description"]: subtest["measurement"]["peak"] for subtest in test["subtests"]}


def _host_view(measurement: dict) -> dict:
    return next(view for view in measurement["views"] if view["view"] == "host")


# An isolated test runs in a fresh fork, whose first window also pays that process's start: the
# stacks and malloc arenas of tfmem's reading threads and the first allocations of NumPy and of
# the subtests' bookkeeping there. A test's first subtest read +1.0 to +1.2 MiB above its array
# on one 2-core machine, +3.1 to +3.3 MiB on another under load; in a warm process +0.0 to +0.6 MiB.
FRESH_PROCESS_START = 5 * MIB


def assert_close(peak: int, size: int, fresh_process: bool = False) -> None:
    """A NumPy array of ``size`` bytes, seen by the kernel's high-water mark: within 3 MiB above
    (``FRESH_PROCESS_START`` in an isolated test's process) and 1 MiB below (pages handed back)."""
    assert size - MIB <= peak <= size + (FRESH_PROCESS_START if fresh_process else 3 * MIB), (peak, size)


def check_report(path, fresh_process: bool = False) -> dict[str, dict]:
    """The JSON report's tests, by name, with the figures every subtest must have."""
    tests = {test["nodeid"].split("::")[-1]: test for test in json.loads(path.read_text())["tests"]}
    method, function, marked = (subtest_peaks(tests[name]) for name in ("test_method", "test_function", "test_marked"))
    assert list(method) == ["(i=0)", "(i=1)", "(i=2)"]  # in the order they ran
    for i, peak in enumerate(method.values()):
        assert_close(peak, (i + 1) * 10 * MIB, fresh_process)
    assert list(function) == ["[sized] (i=0)", "[sized] (i=1)"]
    assert_close(function["[sized] (i=0)"], 20 * MIB, fresh_process)
    assert_close(function["[sized] (i=1)"], 40 * MIB, fresh_process)
    assert [s["outcome"] for s in tests["test_function"]["subtests"]] == ["passed", "failed"]
    assert_close(marked["(size='60MB')"], 60 * MIB, fresh_process)
    assert [s["outcome"] for s in tests["test_marked"]["subtests"]] == ["passed", "skipped"]
    # The budget is the test's: its window covers its subtests' (the highest host level it saw is
    # no lower than any subtest's; the increases are compared below, within a few pages).
    host_peak = _host_view(tests["test_method"]["measurement"])["peak"]
    assert all(host_peak >= _host_view(sub["measurement"])["peak"] for sub in tests["test_method"]["subtests"])
    # Heap handed back between two windows may include pages resident when the test started: a
    # subtest's increase may start a few pages lower (8 KiB once).
    assert tests["test_method"]["measurement"]["peak"] >= max(method.values()) - 16 * 1024
    assert tests["test_marked"]["budget"] == 100_000_000
    return tests


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_each_subtest_has_its_figure_under_its_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sub=SUBTESTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--tfmem-budget=25MB", "--tfmem-subtests", f"--tfmem-report={report}"
    )
    result.assert_outcomes(failed=3, passed=1)  # two tests over budget, and one subtest failed on its own
    assert "not measured" not in result.stdout.str()
    tests = check_report(report)
    assert [t["outcome"] for t in tests.values()] == ["failed", "failed", "passed"]
    # The results journal has each test's outcome, and each failed test's record (not its subtests').
    finished = {
        entry["nodeid"].split("::")[-1]: entry
        for entry in map(json.loads, (pytester.path / ".tfmem" / "results.jsonl").read_text().splitlines())
        if entry.get("event") == "finish"
    }
    assert {name: entry["outcome"] for name, entry in finished.items()} == {
        "test_method": "failed", "test_function": "failed", "test_marked": "passed"
    }
    failed = [entry for entry in finished.values() if entry["outcome"] == "failed"]
    assert all(len(entry["record"]["subtests"]) >= 2 for entry in failed)
    # a test that passed within every limit gets a short line: its peak, not its whole record
    assert "record" not in finished["test_marked"] and finished["test_marked"]["peak"] > 0
    # The failure section of a test over budget lists its subtests, the one over the budget marked.
    result.stdout.re_match_lines(
        [
            r"_+ Case.test_method _+",
            r"tfmem: peak \d+\.\d MiB > budget 25MB \(23\.8 MiB\) \(host RSS \d+\.\d MiB\)",
            r"-+ tfmem -+",
            r"test +peak .* result",
            # The retained column: the test's is known after its teardown, each subtest's already.
            r"test_sub\.py::Case::test_method +\d+\.\d MiB .* 23\.8 MiB +1\d\d% +- +over budget",
            rf"  \(i=2\) +\d+\.\d MiB .* 1\d\d% +{RETAINED} +subtest passed, over budget",
            rf"  \(i=1\) +\d+\.\d MiB .* \d\d% +{RETAINED} +subtest passed",
            rf"  \(i=0\) +\d+\.\d MiB .* \d\d% +{RETAINED} +subtest passed",
        ]
    )
    # The terminal summary lists them on request (--tfmem-subtests), heaviest first under each test.
    summary = result.stdout.str().split("tfmem: peak memory need per test")[1]
    assert "  [sized] (i=1)" in summary and "subtest failed, over budget" in summary
    result.stdout.re_match_lines(
        [
            r"test_sub\.py::test_marked +\d+\.\d MiB .* 95\.4 MiB +\d\d% .*passed",  # the retained column before the result
            rf"  \(size='60MB'\) +\d+\.\d MiB .* \d\d% +{RETAINED} +subtest passed",
        ]
    )


def test_subtests_are_listed_only_on_request(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sub=SUBTESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfmem-budget=1GB", "-k", "marked")
    result.assert_outcomes(passed=1)
    assert "size=" not in result.stdout.str().split("tfmem: peak memory need per test")[1]
    assert "not measured" not in result.stdout.str()


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_isolated_tests_bring_their_subtests_figures_back(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sub=SUBTESTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--tfmem-budget=25MB", "--tfmem-isolate", f"--tfmem-report={report}"
    )
    result.assert_outcomes(failed=3, passed=1)
    assert "not measured" not in result.stdout.str()
    tests = check_report(report, fresh_process=True)
    assert all("isolated" in test["extra"] for test in tests.values())
    result.stdout.fnmatch_lines(["*  (i=2) *subtest passed, over budget"])  # the failure section, from the child


def test_the_rerun_after_a_memory_failure_reports_no_subtest_again(pytester: pytest.Pytester) -> None:
    """The line tracer's re-run of the body runs its subtests quietly: each is reported once."""
    pytester.makepyfile(test_sub=SUBTESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfmem-budget=25MB", "--tfmem-explain", "-k", "function")
    # The test and its failing subtest, as without the re-run (which would report that subtest again).
    result.assert_outcomes(failed=2, deselected=2)
    result.stdout.fnmatch_lines(["*memory by line (test_sub.py::test_function)*", "re-run once after the failure*"])


KEEPING = '''
import unittest

import numpy as np

MIB = 2**20
KEPT = []


class Case(unittest.TestCase):
    def test_method(self):
        for i in range(3):
            with self.subTest(i=i):
                KEPT.append(np.ones((i + 1) * 10 * MIB, dtype=np.uint8))


def test_function(subtests):
    with subtests.test("kept"):
        kept = np.ones(30 * MIB, dtype=np.uint8)
    with subtests.test("freed"):
        del kept
'''


@pytest.mark.parametrize(
    "where", [[], ["--tfmem-isolate"], ["-n", "2"]], ids=["in process", "isolated", "under xdist"]
)
def test_each_subtest_says_what_it_left_for_the_rest_of_its_test(pytester: pytest.Pytester, where: list[str]):
    pytester.makepyfile(test_keep=KEEPING)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--tfmem-budget=1GB", "--tfmem-subtests", f"--tfmem-report={report}", *where
    )
    result.assert_outcomes(passed=2)
    tests = {test["nodeid"].split("::")[-1]: test for test in json.loads(report.read_text())["tests"]}
    kept = {
        name: {sub["description"]: sub["retained_bytes"] for sub in tests[name]["subtests"]}
        for name in ("test_method", "test_function")
    }
    assert list(kept["test_method"]) == ["(i=0)", "(i=1)", "(i=2)"]
    fresh_process = "--tfmem-isolate" in where
    for i, left in enumerate(kept["test_method"].values()):
        # like a peak, it counts what the test did before the subtest
        assert_close(left, (i + 1) * 10 * MIB, fresh_process)
    assert_close(kept["test_function"]["[kept]"], 30 * MIB, fresh_process)
    assert -31 * MIB <= kept["test_function"]["[freed]"] <= -29 * MIB
    for test in tests.values():
        for sub in test["subtests"]:
            assert sub["retained_bytes"] == sub["retained_host_bytes"] + sub["retained_tf_bytes"]
    # Beside their peaks in the terminal summary (the table has a retained column in every case).
    result.stdout.re_match_lines([r"  \(i=2\) +\d+\.\d MiB .* \+30\.\d MiB +subtest passed"])


KEEPING_TENSORS = '''
import tensorflow as tf

KEPT = []


class Case(tf.test.TestCase):
    def test_tensors(self):
        for i in range(2):
            with self.subTest(i=i):
                KEPT.append(tf.ones([(i + 1) * 2 * 2**20], dtype=tf.float32))  # 8 MiB, then 16 MiB
'''


@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_a_subtests_kept_tensors_are_in_the_tensorflow_view(pytester: pytest.Pytester):
    """Tensors kept live in TensorFlow's pool: they count in its allocator, not in host memory
    outside the pool, as in a test's retained figure."""
    pytester.makepyfile(test_tensors=KEEPING_TENSORS)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB", f"--tfmem-report={report}")
    result.assert_outcomes(passed=1, skipped=1)  # tf.test.TestCase's own test_session is skipped
    (test,) = [test for test in json.loads(report.read_text())["tests"] if test["nodeid"].endswith("test_tensors")]
    for i, sub in enumerate(test["subtests"]):
        size = (i + 1) * 8 * MIB
        assert size <= sub["retained_tf_bytes"] <= size + MIB, sub
        assert abs(sub["retained_host_bytes"]) <= 2 * MIB, sub
