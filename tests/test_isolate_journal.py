"""Crash-safe results: a pytest session SIGKILLed mid-test, then ``tfmem last``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pytest_tfmem.units import parse_size

SESSION_TESTS = """
import time
import numpy as np
import pytest

def test_one():
    pass

def test_two():
    assert 0, "two went wrong"

def test_hangs():
    block = np.ones(150 * 10**6, dtype=np.uint8)  # 150 MB, then the session is killed
    time.sleep(120)
"""


def _wait_for_reading(journal: Path, nodeid: str, growth: int, timeout_s: float = 90) -> None:
    """Until the journal shows ``nodeid`` running with its RSS grown by ``growth`` bytes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if journal.exists():
            entries = [json.loads(line) for line in journal.read_text().splitlines() if line.endswith("}")]
            start = next((e for e in entries if e.get("event") == "start" and e["nodeid"] == nodeid), None)
            if start and any(
                e.get("event") == "reading" and e["nodeid"] == nodeid and e["rss"] - start["rss"] >= growth
                for e in entries
            ):
                return
        time.sleep(0.2)
    raise AssertionError(f"{journal} never showed {nodeid} running with +{growth} bytes")


def _tfmem_last(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_tfmem.cli.main", "last"], check=False, cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "isolate",
    [pytest.param([], id="in process"), pytest.param(["--tfmem-isolate"], id="isolated", marks=pytest.mark.slow)],
)
def test_tfmem_last_tells_which_test_was_running_when_the_session_was_killed(pytester: pytest.Pytester, isolate):
    pytester.makepyfile(test_session=SESSION_TESTS)
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--tfmem-budget=1GB", *isolate],
        cwd=pytester.path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_reading(pytester.path / ".tfmem" / "results.jsonl", "test_session.py::test_hangs", 140 * 10**6)
        children = psutil.Process(session.pid).children(recursive=True)
        os.kill(session.pid, signal.SIGKILL)  # as the OOM killer would
    finally:
        session.kill()
        session.wait()
    psutil.wait_procs(children, timeout=10)
    assert not [child for child in children if child.is_running() and child.status() != psutil.STATUS_ZOMBIE]

    last = _tfmem_last(pytester.path)
    assert last.returncode == 1, last.stderr  # 1: the session did not finish
    lines = pytest.LineMatcher(last.stdout.splitlines())
    lines.fnmatch_lines(
        [
            "tfmem: results of the pytest session started * (pid *)",
            "*the session did NOT finish: the pytest process is gone (killed, or crashed)",
            "running when the journal ends:",
            "  test_session.py::test_hangs: started *, still running * s later at the journal's last entry",
            "    last reading * MiB (+* MiB since the test started) at * s into the test *",
            "finished: 2 test(s): 1 failed, 1 passed",
            "  passed   test_session.py::test_one  peak *",
            "  failed   test_session.py::test_two  peak *  AssertionError: two went wrong",
        ]
    )
    growth = re.search(r"\(\+([\d.]+ MiB) since the test started\)", last.stdout)
    assert growth is not None and parse_size(growth.group(1).replace(" ", "")) >= 140 * 10**6


def test_a_finished_session_and_the_previous_journal(pytester: pytest.Pytester):
    pytester.makepyfile("def test_a(): pass\ndef test_b(): pass\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB").assert_outcomes(passed=2)
    first = (pytester.path / ".tfmem" / "results.jsonl").read_text()
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB", "-k", "not test_b")
    assert (pytester.path / ".tfmem" / "results.previous.jsonl").read_text() == first  # kept, not lost
    last = _tfmem_last(pytester.path)
    assert last.returncode == 0
    lines = pytest.LineMatcher(last.stdout.splitlines())
    lines.fnmatch_lines(["*the session finished at *, exit status 0", "finished: 1 test(s): 1 passed"])
    lines.no_fnmatch_line("*::test_b*")


def test_no_journal_in_a_session_where_tfmem_is_not_used(pytester: pytest.Pytester):
    pytester.makepyfile("def test_a(): pass\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert not (pytester.path / ".tfmem").exists()
    last = _tfmem_last(pytester.path)
    assert last.returncode == 2
    assert "no .tfmem/results.jsonl here or in a parent directory up to the project's root" in last.stderr


def test_tfmem_last_looks_no_further_up_than_the_projects_root(pytester: pytest.Pytester):
    """An unrelated ``.tfmem/`` above the project (an earlier ``tfmem run`` in a temporary
    directory, say) is not this project's journal; one at the project's root is found from below."""
    stray = pytester.path.parent / ".tfmem"
    stray.mkdir(exist_ok=True)
    try:
        (stray / "results.jsonl").write_text('{"event": "session"}\n')
        below = pytester.mkdir("sub")
        assert _tfmem_last(below).returncode == 2  # no root marker: only where it runs
        pytester.makeini("[pytest]\n")
        assert _tfmem_last(below).returncode == 2  # the project's root is pytester.path
        pytester.makepyfile("def test_a(): pass\n")
        pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB").assert_outcomes(passed=1)
        found = _tfmem_last(below)
        assert found.returncode == 0 and "finished: 1 test(s): 1 passed" in found.stdout
    finally:
        (stray / "results.jsonl").unlink()
        stray.rmdir()
