"""As many pytest-xdist workers as the memory holds: real pytest sessions with real workers.

The count follows from the memory available on this machine and the tests' budgets; the
budgets are sized from what is available now, so the expected count holds on any machine.
``PYTEST_XDIST_AUTO_NUM_WORKERS`` raises xdist's own count (one per CPU) where a test needs
more CPUs than this machine has.
"""

from __future__ import annotations

import json
import math
import re

import psutil
import pytest

from pytest_tfmem.gates.baseline import Baseline, BaselineEntry, save_baseline
from pytest_tfmem.probes.system import MemoryLimit
from pytest_tfmem.units import parse_size
from pytest_tfmem.workers.fit import BUDGET, Need, WorkerFit

GiB = 2**30
MiB = 2**20

# One plain test and one unittest.TestCase method; budgets come from the marker arguments.
TESTS = """
import unittest

import pytest

@pytest.mark.tfmem(budget={small!r})
def test_function():
    assert sum(range(10)) == 45

class TestCaseStyle(unittest.TestCase):
    @pytest.mark.tfmem(budget={large!r})
    def test_method(self):
        self.assertEqual(len(bytearray(1000)), 1000)
"""

AUTO_LINE = re.compile(
    r"^-n (?:auto|logical): (?P<count>\d+) workers? \((?P<why>[^)]*)\): (?P<room>[\d.]+ \w+) (?:available|limit less "
    r"(?P<controller>[\d.]+ \w+) controller), each worker (?P<baseline>[\d.]+ \w+) \+ (?P<need>[\d.]+ \w+) "
    r"(?P<source>budget|baseline peak) \+ 10% margin = (?P<per_worker>[\d.]+ \w+)$",
    re.MULTILINE,
)


def _size(text: str) -> int:
    return parse_size(text.replace(" ", ""))


def _auto_line(result: pytest.RunResult) -> re.Match[str]:
    match = AUTO_LINE.search(result.stdout.str())
    assert match is not None, result.stdout.str()
    return match


def _created(result: pytest.RunResult) -> int:
    created = re.search(r"^created: (\d+)/\d+ workers?$", result.stdout.str(), re.MULTILINE)
    assert created is not None, result.stdout.str()
    return int(created.group(1))


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:benchmark", *args)


def _budget(fraction: float) -> str:
    """A budget of this fraction of the memory available now, in MiB."""
    return f"{int(psutil.virtual_memory().available * fraction / MiB)}MiB"


def test_auto_starts_as_many_workers_as_fit(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "8")  # xdist's own count: 8 "CPUs"
    pytester.makepyfile(TESTS.format(small="1MB", large=_budget(0.27)))
    result = _run(pytester, "-n", "auto", "--tfmem-workers=fit")
    result.assert_outcomes(passed=2)
    line = _auto_line(result)
    count = int(line["count"])
    assert _created(result) == count
    assert line["why"] == "as many as fit; 8 CPUs"
    assert line["source"] == BUDGET
    # The worker's measured baseline: pytest with its plugins, no TensorFlow here.
    assert 20 * MiB < _size(line["baseline"]) < 400 * MiB
    # The count is what the printed figures give (each rounded to 0.1 of its unit).
    room, per_worker = _size(line["room"]), _size(line["per_worker"])
    assert math.floor(room * 0.99 / (per_worker * 1.01)) <= count <= math.floor(room * 1.01 / (per_worker * 0.99))
    assert 2 <= count <= 4  # each needs ~0.3 of the memory available
    result.stdout.fnmatch_lines(
        [
            "tfmem workers: room from memory available now (limit: physical memory); worker baseline measured "
            "in a collect-only pytest process after importing the test modules (* s); the largest need is "
            "the budget of test_auto_starts_as_many_workers_as_fit.py::TestCaseStyle::test_method",
        ]
    )


def test_n_logical_starts_one_worker_per_cpu_at_most_and_the_ini_value(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "2")
    pytester.makeini("[pytest]\ntfmem_workers = fit\n")
    pytester.makepyfile(TESTS.format(small="1MB", large="10MB"))
    result = _run(pytester, "-n", "logical")
    result.assert_outcomes(passed=2)
    line = _auto_line(result)
    assert line.group(0).startswith("-n logical: 2 workers")
    assert line["count"] == "2"
    assert re.fullmatch(r"one per CPU; \d+ would fit", line["why"])
    assert _created(result) == 2


def test_without_the_option_xdist_keeps_its_count(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    pytester.makeini("[pytest]\ntfmem_workers = fit\n")
    pytester.makepyfile(TESTS.format(small="1MB", large=_budget(0.6)))  # one would fit
    result = _run(pytester, "-n", "auto", "--tfmem-workers=off")
    result.assert_outcomes(passed=2)
    assert _created(result) == 3
    assert "-n auto:" not in result.stdout.str()
    assert "tfmem workers" not in result.stdout.str()
    assert "do not fit" not in result.stdout.str()


def test_an_explicit_n_that_does_not_fit_is_warned_about_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TESTS.format(small="1MB", large=_budget(0.6)))  # one fits
    result = _run(pytester, "-n", "2", "--tfmem-workers=fit")
    result.assert_outcomes(passed=2)
    assert _created(result) == 2  # the explicit count is kept
    assert "-n auto:" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*MemoryLimitWarning: pytest-tfmem: -n 2: 2 workers do not fit in memory (1 would fit): "
            "* available, each worker * + * budget + 10% margin = *; -n auto with --tfmem-workers=fit starts 1",
        ]
    )
    assert result.stdout.str().count("workers do not fit") == 1


def test_an_explicit_n_that_fits_says_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TESTS.format(small="1MB", large="10MB"))
    result = _run(pytester, "-n", "1", "--tfmem-workers=fit")
    result.assert_outcomes(passed=2)
    assert "do not fit" not in result.stdout.str()
    assert "warning" not in result.stdout.str()


def test_with_a_baseline_the_largest_baseline_peak_is_the_need(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TESTS.format(small="1MB", large="2MB"))
    method = "test_with_a_baseline_the_largest_baseline_peak_is_the_need.py::TestCaseStyle::test_method"
    function = "test_with_a_baseline_the_largest_baseline_peak_is_the_need.py::test_function"
    save_baseline(
        Baseline(tests={method: BaselineEntry(peak=300 * MiB), function: BaselineEntry(peak=500 * MiB)}),
        pytester.path / "baseline.json",
    )
    before = (pytester.path / "baseline.json").read_text()
    result = _run(pytester, "-n", "auto", "--tfmem-workers=fit", "--tfmem-baseline=baseline.json")
    line = _auto_line(result)
    assert line["source"] == "baseline peak"
    assert line["need"] == "500.0 MiB"
    result.stdout.fnmatch_lines([f"*the largest need is the baseline peak of {function}"])
    assert (pytester.path / "baseline.json").read_text() == before
    # The collect-only process wrote nothing of the session's: one session in the journal.
    assert not (pytester.path / ".tfmem" / "results.previous.jsonl").exists()
    header = json.loads((pytester.path / ".tfmem" / "results.jsonl").read_text().splitlines()[0])
    assert header["event"] == "session"


def test_without_budgets_the_count_stays_xdists_and_a_warning_says_why(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "2")
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = _run(pytester, "-n", "auto", "--tfmem-workers=fit")
    result.assert_outcomes(passed=1)
    assert _created(result) == 2
    result.stdout.fnmatch_lines(["*pytest-tfmem: --tfmem-workers=fit: no collected test has a budget*"])


def test_a_bad_value_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    pass\n")
    result = _run(pytester, "-n", "auto", "--tfmem-workers=max")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*pytest-tfmem: invalid --tfmem-workers value 'max': expected 'fit' (*) or 'off' (xdist's own count)*"]
    )


def _fit(limit: int, available: int, controller: int, baseline: int, need: int, cpus: int) -> WorkerFit:
    return WorkerFit(MemoryLimit(limit, "cgroup v1 memory.limit_in_bytes (x)"), available, controller, baseline,
                     Need(need, BUDGET, "t.py::test_big"), cpus)


def test_the_arithmetic() -> None:
    # 8 GiB limit less 0.5 GiB controller = 7.5 GiB; each worker (0.5 + 2) * 1.1 = 2.75 GiB: 2 fit
    fit = _fit(8 * GiB, 20 * GiB, GiB // 2, GiB // 2, 2 * GiB, cpus=16)
    assert (fit.room, fit.per_worker, fit.fitting, fit.count) == (7.5 * GiB, int(2.75 * GiB), 2, 2)
    assert fit.auto_line() == (
        "-n auto: 2 workers (as many as fit; 16 CPUs): 8.0 GiB limit less 512.0 MiB controller, "
        "each worker 512.0 MiB + 2.0 GiB budget + 10% margin = 2.8 GiB"
    )
    assert fit.explicit_warning(2) is None
    assert fit.explicit_warning(3) == (
        "pytest-tfmem: -n 3: 3 workers do not fit in memory (2 would fit): 8.0 GiB limit less 512.0 MiB "
        "controller, each worker 512.0 MiB + 2.0 GiB budget + 10% margin = 2.8 GiB; -n auto with "
        "--tfmem-workers=fit starts 2"
    )
    # Memory available now binds when it is below the limit; CPUs cap the count.
    assert _fit(64 * GiB, 6 * GiB, GiB, GiB, GiB, cpus=16).auto_line().startswith(
        "-n auto: 2 workers (as many as fit; 16 CPUs): 6.0 GiB available, each worker"
    )
    assert _fit(64 * GiB, 60 * GiB, GiB, GiB, GiB, cpus=4).auto_line().startswith(
        "-n auto: 4 workers (one per CPU; 27 would fit)"
    )
    # Not even one fits: one worker all the same, and the header says what to expect.
    none = _fit(2 * GiB, 20 * GiB, GiB // 2, GiB, GiB, cpus=4)
    assert (none.fitting, none.count) == (0, 1)
    assert "not even one fits" in none.auto_line()
    assert "(not even one fits)" in (none.explicit_warning(1) or "")


# Each test holds memory a moment, then dies as the kernel's OOM killer would kill it.
KILLED_TESTS = """
import os
import signal
import time
import unittest

import pytest

def _hold_then_die(megabytes):
    block = bytearray(megabytes * 10**6)  # zero pages: written below so that they count
    for offset in range(0, len(block), 4096):
        block[offset] = 1
    time.sleep(0.5)  # long enough for the journal's readings to see it
    os.kill(os.getpid(), signal.SIGKILL)

@pytest.mark.tfmem(budget="1GB")
def test_function():
    _hold_then_die(150)

class TestCaseStyle(unittest.TestCase):
    def test_method(self):
        _hold_then_die(100)
"""


@pytest.mark.linux  # a memory cgroup's OOM-kill count
def test_a_killed_worker_is_explained(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(KILLED_TESTS)
    result = _run(pytester, "-n", "1")
    result.assert_outcomes(failed=2)
    for worker, test, held in (("gw0", "test_function", 150), ("gw1", "TestCaseStyle::test_method", 100)):
        result.stdout.fnmatch_lines(
            [
                f"worker '{worker}' crashed while running '*::{test}'",
                f"tfmem: worker {worker}'s process was killed by SIGKILL (not sent by pytest-tfmem): SIGKILL is "
                "what the kernel's OOM killer sends when memory runs out, but this cgroup's oom_kill count did "
                "not change: more likely another process (kill -9, a CI timeout)",
                "last reading * MiB (+* MiB since the test started) at * s into the test (*); "
                "peak * MiB (process tree RSS, sampled every 0.1 s)",
                "memory limit: * (*)",
            ]
        )
        growth = re.search(rf"{worker}'s process was.*\n.*\(\+([\d.]+ MiB) since the test started\)", result.stdout.str())
        assert growth is not None
        assert held * 10**6 * 0.9 <= _size(growth.group(1)) < held * 10**6 + 64 * MiB


def test_without_tfmem_a_killed_worker_keeps_xdists_words(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(KILLED_TESTS.replace('@pytest.mark.tfmem(budget="1GB")', ""))
    result = _run(pytester, "-n", "1", "-k", "test_function")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["worker 'gw0' crashed while running '*::test_function'"])
    assert "tfmem:" not in result.stdout.str()
    assert "last reading" not in result.stdout.str()
    assert not (pytester.path / ".tfmem").exists()
