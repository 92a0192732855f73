"""Workers under a real memory limit: a child memory cgroup where the kernel's OOM killer acts.

Slow, and only as root with a cgroup v1 memory controller (skipped with the reason elsewhere).
Two CPUs are simulated with ``PYTEST_XDIST_AUTO_NUM_WORKERS=2`` (xdist's own count for -n auto).
"""

from __future__ import annotations

import re

import pytest
from cgroup_helpers import memory_cgroup, oom_kills, run_pytest_in

from pytest_tfmem.units import parse_size

pytestmark = pytest.mark.slow

MiB = 2**20
LIMIT = 750 * MiB
# Four tests that each hold 400 MB a few seconds: one worker (~60 MiB) holds one test at a
# time within the limit beside the controller; two workers running two tests at once do not. One
# worker, running them one at a time, needs no such overlap: there they hold it a quarter second.
HEAVY_TESTS = """
import os
import time
import unittest

import pytest

def hold(megabytes, seconds=float(os.environ.get("HOLD_S", "3"))):
    block = bytearray(megabytes * 10**6)
    for offset in range(0, len(block), 4096):  # write every page: only written pages are resident
        block[offset] = 1
    time.sleep(seconds)

@pytest.mark.tfmem(budget="420MB")
@pytest.mark.parametrize("n", range(3))
def test_function(n):
    hold(400)

class TestCaseStyle(unittest.TestCase):
    @pytest.mark.tfmem(budget="420MB")
    def test_method(self):
        hold(400)
"""


@pytest.mark.linux  # a memory cgroup's OOM-kill count
def test_the_chosen_count_keeps_alive_a_suite_that_one_worker_per_cpu_gets_killed(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "2")
    pytester.makepyfile(HEAVY_TESTS)
    with memory_cgroup(LIMIT) as cgroup:
        before = oom_kills(cgroup)
        per_cpu = run_pytest_in(pytester, cgroup, "-p", "no:cacheprovider", "-p", "no:benchmark", "-n", "2")
        killed = oom_kills(cgroup) - before
        assert killed >= 1, per_cpu.stdout.str()
        assert per_cpu.ret == pytest.ExitCode.TESTS_FAILED
        per_cpu.stdout.fnmatch_lines(
            [
                "worker 'gw*' crashed while running '*'",
                "tfmem: worker gw*'s process was killed by SIGKILL (not sent by pytest-tfmem): the kernel's OOM "
                "killer: out of memory (this cgroup's oom_kill count rose by *)",
            ]
        )

        before = oom_kills(cgroup)
        monkeypatch.setenv("HOLD_S", "0.25")
        fitted = run_pytest_in(
            pytester, cgroup, "-p", "no:cacheprovider", "-p", "no:benchmark", "-n", "auto", "--tfmem-workers=fit"
        )
        assert oom_kills(cgroup) == before, fitted.stdout.str()
    fitted.assert_outcomes(passed=4)
    fitted.stdout.fnmatch_lines(
        [
            "-n auto: 1 worker (as many as fit; 2 CPUs): 750.0 MiB limit less * MiB controller, each worker "
            "* MiB + 400.5 MiB budget + 10% margin = * MiB",
            f"tfmem workers: room from cgroup v1 memory.limit_in_bytes ({cgroup}/memory.limit_in_bytes); *",
            "created: 1/1 worker",
        ]
    )
    baseline = re.search(r"each worker ([\d.]+ MiB) \+", fitted.stdout.str())
    assert baseline is not None
    assert 20 * MiB < parse_size(baseline.group(1).replace(" ", "")) < 200 * MiB


# Grows 20 MB at a time until the OOM killer stops it; the journal's readings follow it.
GROWING_TESTS = """
import time
import unittest

import pytest

def grow():
    blocks = []
    while True:
        block = bytearray(20 * 10**6)
        for offset in range(0, len(block), 4096):
            block[offset] = 1
        blocks.append(block)
        time.sleep(0.05)

@pytest.mark.tfmem(budget="100MB")
def test_function():
    grow()

class TestCaseStyle(unittest.TestCase):
    def test_method(self):
        grow()
"""


@pytest.mark.linux  # a memory cgroup's OOM-kill count
def test_a_worker_killed_by_the_oom_killer_is_explained(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(GROWING_TESTS)
    limit = 400 * MiB
    with memory_cgroup(limit) as cgroup:
        before = oom_kills(cgroup)
        result = run_pytest_in(pytester, cgroup, "-p", "no:cacheprovider", "-p", "no:benchmark", "-n", "1")
        kills = oom_kills(cgroup) - before  # 2, or more where the kernel took another process too
        assert kills >= 2, result.stdout.str()
    result.assert_outcomes(failed=2)
    # each worker's death names the rise of the cgroup's count while it ran: together, all of it
    # (keyed by worker: with CI set, pytest's short summary repeats each message in full)
    rises = dict(re.findall(r"tfmem: worker (gw\d+)'s process .* count rose by (\d+)\)\n", result.stdout.str()))
    assert sorted(rises) == ["gw0", "gw1"] and sum(map(int, rises.values())) == kills, result.stdout.str()
    for worker, test in (("gw0", "test_function"), ("gw1", "TestCaseStyle::test_method")):
        result.stdout.fnmatch_lines(
            [
                f"worker '{worker}' crashed while running '*::{test}'",
                f"tfmem: worker {worker}'s process was killed by SIGKILL (not sent by pytest-tfmem): the kernel's "
                "OOM killer: out of memory (this cgroup's oom_kill count rose by *)",
                "last reading * MiB (+* MiB since the test started) at * s into the test (*); "
                "peak * MiB (process tree RSS, sampled every 0.1 s)",
                f"memory limit: 400.0 MiB (cgroup v1 memory.limit_in_bytes ({cgroup}/memory.limit_in_bytes))",
            ]
        )
        peak = re.search(rf"{worker}'s process was.*\n.*; peak ([\d.]+ MiB) \(process tree RSS", result.stdout.str())
        assert peak is not None
        # The last readings come close to the limit: the worker grew until the kernel stopped it.
        assert limit * 0.5 < parse_size(peak.group(1).replace(" ", "")) <= limit
