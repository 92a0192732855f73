"""Where this project's test suite spends its CPU time: each test's, its own and its processes'.

    python -m pytest -m "slow or not slow" -n 2 -p benchmarks.suite_cpu

The suite is bound by CPU on two cores (``.ci/run``), so a test's wall time, which
``--durations`` prints, includes waiting for the core that the other worker's test holds. This
plugin reads what each test spent: CPU time of the process that ran it (``getrusage``), of the
processes it started and waited for (``RUSAGE_CHILDREN``), and of those that outlive it (the
forking processes of ``tests/forked_sessions.py``: their own CPU time and their children's, as
``psutil`` reads them, a session forked from one included). At the end it prints the test files
and the tests that took the most, and the whole. Under pytest-xdist each worker sends its
figures to the controller (``workeroutput``).
"""

from __future__ import annotations

import collections
import resource
import time
from collections.abc import Generator

import psutil
import pytest

SHOWN = 20
KEY = "suite_cpu"
# (nodeid, CPU seconds, wall seconds)
Row = tuple[str, float, float]


def _waited_and_own() -> float:
    own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


def _running_children() -> dict[int, float]:
    """CPU time of each process this one started that is still running, and of its waited children."""
    seconds = {}
    for child in psutil.Process().children():
        try:
            times = child.cpu_times()
        except psutil.Error:  # it ended since it was listed
            continue
        seconds[child.pid] = times.user + times.system + times.children_user + times.children_system
    return seconds


class SuiteCpu:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.rows: list[Row] = []
        self.started = time.perf_counter()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        wall, before, running = time.perf_counter(), _waited_and_own(), _running_children()
        yield
        after, still = _waited_and_own(), _running_children()
        # A process that was running before and ended in the test: its CPU before it is in
        # ``running`` and again in the waited children's, once it was waited for.
        ended = sum(seconds for pid, seconds in running.items() if pid not in still)
        live = sum(seconds - running.get(pid, 0.0) for pid, seconds in still.items())
        self.rows.append((item.nodeid, after - before - ended + live, time.perf_counter() - wall))

    def pytest_sessionfinish(self) -> None:
        if hasattr(self.config, "workeroutput"):
            self.config.workeroutput[KEY] = self.rows

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: object) -> None:
        self.rows.extend(tuple(row) for row in getattr(node, "workeroutput", {}).get(KEY, []))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if hasattr(self.config, "workeroutput") or not self.rows:
            return
        wall = time.perf_counter() - self.started
        total = sum(cpu for _, cpu, _ in self.rows)
        files: collections.Counter[str] = collections.Counter()
        counts: collections.Counter[str] = collections.Counter()
        for nodeid, cpu, _ in self.rows:
            path = nodeid.split("::")[0]
            files[path] += cpu
            counts[path] += 1
        write = terminalreporter.write_line
        terminalreporter.write_sep("=", "suite CPU: where the tests' CPU time went")
        write(f"{len(self.rows)} tests: {total:.1f} s of CPU time in {wall:.1f} s ({total / wall:.2f} cores busy)")
        write(f"the {SHOWN} test files that took the most (CPU s, tests, file):")
        for name, cpu in files.most_common(SHOWN):
            write(f"{cpu:8.1f} {counts[name]:5d}  {name}")
        write(f"the {SHOWN} tests that took the most (CPU s, wall s, test):")
        for nodeid, cpu, seconds in sorted(self.rows, key=lambda row: -row[1])[:SHOWN]:
            write(f"{cpu:8.1f} {seconds:7.1f}  {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuiteCpu(config), "suite-cpu")
