"""tfmem beside the pytest plugins TensorFlow suites use (docs/compatibility.md): one real pytest
run per plugin, on numpy tests where TensorFlow adds nothing.

pytest-xdist is covered by ``test_gates_reports.py``, ``test_mixed.py`` and ``test_workers.py``,
pytest-html by ``test_html_report.py``, pytest-split by ``test_gates_merge.py``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_tfmem.units import DEFAULT_TOLERANCE, parse_tolerance

MB = 10**6
MiB = 2**20


def near(peak: int, size: int) -> bool:
    """A numpy block of ``size`` bytes, as tfmem reads it (whole pages, the array's header)."""
    return abs(peak - size) < 2 * MiB


def report_records(path: Path) -> dict[str, dict]:
    return {test["nodeid"].split("::")[-1]: test for test in json.loads(path.read_text())["tests"]}


# pytest-timeout


SLOW_TEST = """
import time
import numpy as np

def test_stopped():
    block = np.ones(50 * 10**6 // 8)
    time.sleep(30)
"""


def test_a_test_stopped_by_pytest_timeout_keeps_its_figure(pytester: pytest.Pytester):
    pytest.importorskip("pytest_timeout")
    pytester.makepyfile(SLOW_TEST)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--timeout=2", "--timeout-method=signal", "--tfmem-budget=1GB",
        "--tfmem-report=report.json",
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    note = "stopped by pytest-timeout after 2.0 s: the figures are the test's until then"
    output = result.stdout.str()
    assert "Failed: Timeout (>2.0s) from pytest-timeout." in output
    section = output[output.index("- tfmem -") : output.index("short test summary")]
    assert note in section  # the failure section says it
    record = report_records(pytester.path / "report.json")["test_stopped"]
    assert near(record["measurement"]["peak"], 50 * MB) and record["outcome"] == "failed"
    assert 1.5 < record["measurement"]["duration_s"] < 10
    assert any(line.startswith(note) for line in record["notes"])
    journal = [json.loads(line) for line in (pytester.path / ".tfmem" / "results.jsonl").read_text().splitlines()]
    finish = next(event for event in journal if event["event"] == "finish")
    assert finish["record"]["measurement"]["peak"] == record["measurement"]["peak"]
    assert finish["record"]["notes"] == record["notes"] and "Timeout" in finish["message"]


def test_pytest_timeouts_thread_method_leaves_the_journal_s_last_reading(pytester: pytest.Pytester):
    """The thread method ends the process: ``tfmem last`` names the test and its last reading."""
    pytest.importorskip("pytest_timeout")
    pytester.makepyfile(SLOW_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--timeout=2", "--timeout-method=thread", "--tfmem-budget=1GB")
    assert result.ret != 0 and "Timeout" in result.stderr.str() + result.stdout.str()
    last = subprocess.run(
        [sys.executable, "-m", "pytest_tfmem.cli.main", "last"], cwd=pytester.path, capture_output=True, text=True, check=False
    )
    assert last.returncode == 1, last.stdout + last.stderr  # the session did not finish
    assert "test_stopped" in last.stdout and "MiB" in last.stdout


# pytest-cov


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_pytest_cov_measures_and_reports_alongside(pytester: pytest.Pytester):
    pytest.importorskip("pytest_cov")
    pytester.makepyfile(
        test_cov="""
        import numpy as np
        import pytest

        def test_fits():
            block = np.ones(40 * 10**6 // 8)

        @pytest.mark.tfmem(budget="20MB")
        def test_over():
            block = np.ones(40 * 10**6 // 8)
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--cov=.", "--cov-report=term", "--tfmem-budget=1GB", "--tfmem-report=report.json"
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*coverage: platform*", "TOTAL*", "FAILED test_cov.py::test_over - tfmem: peak *"])
    records = report_records(pytester.path / "report.json")
    assert near(records["test_fits"]["measurement"]["peak"], 40 * MB)
    assert near(records["test_over"]["measurement"]["peak"], 40 * MB)


# pytest-repeat


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_pytest_repeat_measures_each_repetition(pytester: pytest.Pytester):
    pytest.importorskip("pytest_repeat")
    pytester.makepyfile(
        test_repeat="""
        import numpy as np
        import pytest

        @pytest.mark.tfmem(budget="20MB")
        def test_again():
            block = np.ones(30 * 10**6 // 8)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--count=3", "--tfmem-report=report.json")
    result.assert_outcomes(failed=3)
    records = report_records(pytester.path / "report.json")
    assert sorted(records) == ["test_again[1-3]", "test_again[2-3]", "test_again[3-3]"]
    for record in records.values():
        assert near(record["measurement"]["peak"], 30 * MB)
        assert [v["check"] for v in record["verdicts"] if not v["ok"]] == ["budget"]


# pytest-benchmark


def test_pytest_benchmark_rounds_count_once(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """The call phase runs every round: the peak is the heaviest round's, not their sum."""
    pytest.importorskip("pytest_benchmark")
    # pytest-benchmark turns itself off in a process that inherits an xdist worker's variable
    # (this suite's own -n 2): the inner session is not a worker.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makepyfile(
        test_bench="""
        import numpy as np

        def test_timed(benchmark):
            benchmark.pedantic(lambda: float(np.ones(30 * 10**6 // 8).sum()), rounds=5, iterations=1)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB", "--tfmem-report=report.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*benchmark: 1 tests*", "test_timed *"])
    assert near(report_records(pytester.path / "report.json")["test_timed"]["measurement"]["peak"], 30 * MB)


# pytest-randomly


ORDER_TESTS = """
import time

import numpy as np
import tensorflow as tf  # at module level: the import is no test's

def test_tensors_200():
    tensors = [tf.ones((2_500_000,)) for _ in range(20)]  # 200 MB of float32
    del tensors

def test_tensors_80():
    tensors = [tf.ones((2_500_000,)) for _ in range(8)]
    del tensors

def test_numpy_120():
    block = np.ones(120 * 10**6 // 8)

def test_both_120():
    block = np.ones(60 * 10**6 // 8)
    tensors = [tf.ones((2_500_000,)) for _ in range(6)]
    time.sleep(0.05)  # both held longer than the 10 ms the NumPy-and-tensors sampler needs to see them
    del tensors
"""


def junit_order_and_peaks(path: Path) -> tuple[list[str], dict[str, int]]:
    order, peaks = [], {}
    for case in ET.parse(path).getroot().iter("testcase"):
        order.append(case.get("name"))
        for prop in case.iter("property"):
            if prop.get("name") == "tfmem_peak_bytes":
                peaks[case.get("name")] = int(prop.get("value"))
    return order, peaks


def test_this_suite_s_inner_runs_keep_file_order(pytester: pytest.Pytester):
    """With pytest-randomly installed, tests/conftest.py keeps it out of inner runs unless asked."""
    pytest.importorskip("pytest_randomly")
    pytester.makepyfile("".join(f"def test_{name}():\n    pass\n" for name in "abcdefgh"))
    in_order = [f"test_{name}" for name in "abcdefgh"]
    inline = pytester.inline_run("-p", "no:cacheprovider")
    assert [r.nodeid.split("::")[1] for r in inline.getreports("pytest_runtest_logreport") if r.when == "call"] == in_order
    for shuffle in ([], ["-p", "randomly", "--randomly-seed=5"]):
        result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider", *shuffle)
        ran = [line.split("::")[1].split()[0] for line in result.stdout.lines if " PASSED" in line]
        assert (ran == in_order) is not shuffle and sorted(ran) == in_order, ran
        assert ("Using --randomly-seed=5" in result.stdout.str()) is bool(shuffle)


@pytest.mark.linux  # malloc_trim hands freed heap back before each reading
@pytest.mark.slow  # three sessions that import TensorFlow: ~35 s on 2 busy cores
@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
# looked up, not imported: pytester removes at teardown the modules its test imported, and importing
# TensorFlow again in the same process aborts it
@pytest.mark.forked_sessions  # its inner sessions import TensorFlow
def test_figures_stay_within_tolerance_in_any_order(pytester: pytest.Pytester):
    """Each test's peak in file order and in two of pytest-randomly's orders, within the baseline's
    default tolerance (10%+16MB) of each other."""
    pytest.importorskip("pytest_randomly")
    pytester.makepyfile(test_order=ORDER_TESTS)
    runs = {}
    for seed in (None, 1, 2):
        shuffle = [] if seed is None else ["-p", "randomly", f"--randomly-seed={seed}"]
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "--tfmem-budget=2GB", f"--junitxml=run-{seed}.xml", *shuffle
        )
        result.assert_outcomes(passed=4)
        runs[seed] = junit_order_and_peaks(pytester.path / f"run-{seed}.xml")
    orders = {tuple(order) for order, _ in runs.values()}
    assert len(orders) == 3, orders  # the seeds really shuffled
    tolerance = parse_tolerance(DEFAULT_TOLERANCE)
    for name in runs[None][1]:
        peaks = [run_peaks[name] for _, run_peaks in runs.values()]
        assert max(peaks) - min(peaks) <= tolerance.allowance(min(peaks)), (name, peaks)
        size = int(name.rsplit("_", 1)[1]) * MB
        assert 0.9 * size <= min(peaks) <= 1.25 * size, (name, peaks)  # the test's own memory, in every order
