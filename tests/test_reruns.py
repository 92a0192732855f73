"""pytest-rerunfailures (``--reruns N``): one entry per test in every table and report, with the
last attempt's figures and how often the test was rerun; a test that fails a memory check in
several attempts is re-run by tfmem (for a trace, an explanation) once, on its first failure.

Each body appends a line to a file every time it runs, so the file says how often it ran.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import runs

MIB = 2**20

ATTEMPTS = '''
import os

import numpy as np

MIB = 2**20


def ran(name):
    """How often the body ran before, counting this run."""
    path = os.path.join(os.environ["RUNS_DIR"], name)
    with open(path, "a") as runs:
        runs.write("ran\\n")
    with open(path) as runs:
        return len(runs.read().splitlines())


def test_flaky():
    """60 MiB in its first attempt (over the budget) and in tfmem's re-run that confirms it, 10 MiB
    in the next attempt."""
    block = np.ones((60 if ran("test_flaky") <= 2 else 10) * MIB, dtype=np.uint8)
    del block


def test_always_over():
    ran("test_always_over")
    block = np.ones(50 * MIB, dtype=np.uint8)
    del block


def test_steady():
    block = np.ones(5 * MIB, dtype=np.uint8)
    del block
'''


def outcomes(result: pytest.RunResult) -> dict[str, int]:
    """The inner session's outcomes, without its warning count: in process, that depends on what
    ran before it (a module imported already cannot be rewritten, and pytest warns)."""
    counts = result.parseoutcomes()
    counts.pop("warnings", None)
    return counts


def assert_close(peak: int, size: int) -> None:
    assert size - MIB <= peak <= size + 3 * MIB, (peak, size)


def report_tests(path: Path) -> dict[str, dict]:
    """The JSON report's tests by name; every node id once."""
    tests = json.loads(path.read_text())["tests"]
    nodeids = [test["nodeid"] for test in tests]
    assert len(nodeids) == len(set(nodeids)) == 3, nodeids
    return {nodeid.split("::")[-1]: test for nodeid, test in zip(nodeids, tests)}


def check_last_attempts(tests: dict[str, dict]) -> None:
    assert {name: (t["outcome"], t["reruns"]) for name, t in tests.items()} == {
        "test_always_over": ("failed", 1),
        "test_flaky": ("passed", 1),
        "test_steady": ("passed", 0),
    }
    assert_close(tests["test_flaky"]["measurement"]["peak"], 10 * MIB)  # its last attempt's, not 60 MiB


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_one_entry_per_test_with_the_last_attempts_figures(pytester: pytest.Pytester, runs_dir: Path) -> None:
    pytester.makepyfile(test_attempts=ATTEMPTS)
    report, baseline, markdown, junit = (pytester.path / name for name in ("r.json", "b.json", "s.md", "j.xml"))
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--reruns=1", "--tfmem-budget=30MB", "--tfmem-explain",
        f"--tfmem-report={report}", f"--tfmem-save-baseline={baseline}", f"--tfmem-markdown={markdown}",
        f"--junitxml={junit}",
    )
    assert outcomes(result) == {"passed": 2, "failed": 1, "rerun": 2}
    check_last_attempts(report_tests(report))
    summary = result.stdout.str().split("tfmem: peak memory need per test")[1]
    assert summary.count("test_attempts.py::test_flaky") == 1
    result.stdout.re_match_lines(
        [
            r"test_attempts\.py::test_always_over +\d+\.\d MiB .* over budget \(rerun 1 time\)",
            r"test_attempts\.py::test_flaky +\d+\.\d MiB .* passed \(rerun 1 time\)",
            r"test_attempts\.py::test_steady +\d+\.\d MiB .* passed",
        ]
    )
    # The baseline takes the last attempt (the flaky test passed then; the test over budget is not saved).
    saved = json.loads(baseline.read_text())["tests"]
    assert sorted(saved) == ["test_attempts.py::test_flaky", "test_attempts.py::test_steady"]
    assert_close(saved["test_attempts.py::test_flaky"]["peak"], 10 * MIB)
    rows = [line for line in markdown.read_text().splitlines() if line.startswith("| test_attempts.py::")]
    assert len(rows) == 3 and "| passed (rerun 1 time) |" in rows[1], rows
    # JUnit XML (pytest's, with pytest-rerunfailures) has a test case per attempt, each with its own figures.
    cases = [case for case in ET.parse(junit).getroot().iter("testcase") if case.get("name") == "test_flaky"]
    peaks = [int(p.get("value")) for case in cases for p in case.iter("property") if p.get("name") == "tfmem_peak_bytes"]
    assert len(peaks) == 2
    assert_close(peaks[0], 60 * MIB)
    assert_close(peaks[1], 10 * MIB)
    # Explained once: two attempts and one re-run under the line tracer, not one per attempt.
    assert runs(runs_dir, "test_always_over") == 3
    failures = result.stdout.str().split("tfmem: peak memory need per test")[0]
    assert failures.count("memory by line (test_attempts.py::test_always_over)") == 1
    result.stdout.fnmatch_lines(
        [
            "not re-run again: the memory-by-line table below is from its first memory failure, "
            "in an earlier attempt (pytest-rerunfailures)",
            "*memory by line (test_attempts.py::test_always_over)*",
        ]
    )


def test_one_entry_per_test_under_xdist(pytester: pytest.Pytester, runs_dir: Path) -> None:
    pytester.makepyfile(test_attempts=ATTEMPTS)
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "--reruns=1", "--tfmem-budget=30MB", f"--tfmem-report={report}"
    )
    assert outcomes(result) == {"passed": 2, "failed": 1, "rerun": 2}
    check_last_attempts(report_tests(report))
    assert result.stdout.str().split("tfmem: peak memory need per test")[1].count("::test_flaky") == 1


def test_without_reruns_asked_nothing_changes(pytester: pytest.Pytester, runs_dir: Path) -> None:
    """pytest-rerunfailures installed, but no --reruns: each test runs once, no count is shown."""
    pytester.makepyfile(test_attempts=ATTEMPTS)
    report = pytester.path / "r.json"
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfmem-budget=30MB", f"--tfmem-report={report}")
    result.assert_outcomes(passed=1, failed=2)
    assert "rerun" not in result.stdout.str().split("tfmem: peak memory need per test")[1]
    assert {test["reruns"] for test in report_tests(report).values()} == {0}
    assert runs(runs_dir, "test_flaky") == 2  # its run and tfmem's re-run, which confirmed the failure


TRACED = '''
import os

import numpy as np
import tensorflow as tf

MIB = 2**20


def test_over_budget_every_time():
    with open(os.path.join(os.environ["RUNS_DIR"], "traced"), "a") as runs:
        runs.write("ran\\n")
    tensor = tf.ones([40 * MIB // 4])
    block = np.ones(40 * MIB, dtype=np.uint8)
    del tensor, block
'''


@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_a_test_over_budget_in_every_attempt_is_traced_once(pytester: pytest.Pytester, runs_dir: Path) -> None:
    pytester.makepyfile(test_traced=TRACED)
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--reruns=1", "--tfmem-budget=30MB", f"--tfmem-report={report}"
    )
    assert outcomes(result) == {"failed": 1, "rerun": 1}
    assert runs(runs_dir, "traced") == 3  # two attempts, one traced re-run
    result.stdout.fnmatch_lines(["*tfmem: 1 TensorBoard trace(s), 1 of failing tests*"])
    (test,) = json.loads(report.read_text())["tests"]
    trace = Path(test["extra"]["trace"]["directory"])
    assert test["reruns"] == 1 and test["extra"]["trace"]["traced"] == "rerun"
    assert [path.name for path in trace.parent.iterdir() if path.is_dir()] == [trace.name]
    assert test["notes"] == [
        "not re-run again: the TensorBoard trace below is from its first memory failure, "
        "in an earlier attempt (pytest-rerunfailures)",
        "the verdict stands unconfirmed: an earlier attempt ran the test already (pytest-rerunfailures)",
    ]


KILLED = '''
import os

import numpy as np
import pytest

MIB = 2**20


@pytest.mark.tfmem(kill_at="200MB")
def test_killed_first():
    blocks = [np.ones(50 * MIB, dtype=np.uint8) for _ in range(10)]


@pytest.mark.tfmem(kill_at="200MB")
def test_killed_second():
    if not os.path.exists(os.path.join(os.environ["RUNS_DIR"], "failed once")):
        open(os.path.join(os.environ["RUNS_DIR"], "failed once"), "w").close()
        raise AssertionError("an ordinary failure in the first attempt")
    blocks = [np.ones(50 * MIB, dtype=np.uint8) for _ in range(10)]
'''


def test_isolated_attempts_and_kills(pytester: pytest.Pytester, runs_dir: Path) -> None:
    """Isolated, the attempts run in the test's process: one row per test in both tables, and a
    process killed in any attempt fails its test in the call phase (a killed process makes no
    further attempt)."""
    pytester.makepyfile(test_attempts=ATTEMPTS, test_killed=KILLED)
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--reruns=1", "--tfmem-budget=30MB", "--tfmem-isolate", f"--tfmem-report={report}"
    )
    assert outcomes(result) == {"passed": 2, "failed": 3, "rerun": 3}
    tests = {test["nodeid"].split("::")[-1]: test for test in json.loads(report.read_text())["tests"]}
    assert {name: (t["outcome"], t["reruns"]) for name, t in tests.items()} == {
        "test_always_over": ("failed", 1),
        "test_flaky": ("passed", 1),
        "test_steady": ("passed", 0),
        "test_killed_first": ("failed", 0),
        "test_killed_second": ("failed", 1),
    }
    assert tests["test_killed_second"]["extra"]["isolated"]["death"] == "killed at kill_at"
    assert_close(tests["test_flaky"]["extra"]["isolated"]["process_peak_increase"], 10 * MIB)  # the last attempt's
    isolated_table = result.stdout.str().split("tfmem: isolated tests")[1].split("short test summary")[0]
    assert isolated_table.count("::test_flaky") == isolated_table.count("::test_killed_second") == 1
    result.stdout.fnmatch_lines(["FAILED test_killed.py::test_killed_first - tfmem: killed at kill_at*"])
    assert "ERROR" not in result.stdout.str()  # a kill is the call phase's failure, whenever the reports come


def test_an_isolated_test_killed_without_reruns(pytester: pytest.Pytester, runs_dir: Path) -> None:
    """pytest-rerunfailures installed, no --reruns: the kill is reported, no internal error."""
    pytester.makepyfile(test_killed=KILLED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "first")
    result.assert_outcomes(failed=1, deselected=1)
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["FAILED test_killed.py::test_killed_first - tfmem: killed at kill_at*"])
