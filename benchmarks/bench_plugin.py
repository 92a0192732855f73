"""pytest plugin loaded into every workload run (``-p benchmarks.bench_plugin``).

For each test it writes one JSON line to ``$TFMEM_BENCH_RESULTS``: the test's name, outcome,
the first line of its failure, the **test time** (from the start of the call phase to the
moment the call report is ready, so a tool's work around the body and its report-time
analysis both count; fixture set-up, collection and imports do not), the CPU time spent in
that span (user + system, this process and the children it waited for: steadier than wall
time on a shared machine) and the peak the contender named by ``$TFMEM_BENCH_CONTENDER``
reported. With no plugin, a last line (outcome ``gc``) times one full ``gc.collect()`` at
the end of the session, the step pytest-tfmem takes before every measured test. The
figures, by contender:

- ``tfmem``: the ``tfmem_peak_bytes`` property pytest-tfmem puts on the report;
- ``memray``: the peak pytest-memray recorded for the test (what ``limit_memory`` compares),
  with ``limit_memory`` added to every test at collection;
- ``memray-leaks``: ``limit_leaks`` added to every test (the verdict is the test outcome);
- ``mprof-*``: the body runs inside ``memory_profiler.memory_usage(..., max_usage=True)``
  sampling every ``$TFMEM_BENCH_INTERVAL`` seconds, as pytest-monitor does; the figure is
  the largest sample minus the RSS just before the call.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import time
from collections.abc import Generator
from typing import Any

import psutil
import pytest

from benchmarks.contenders import MEMRAY_LEAK_LIMIT, UNREACHED_BUDGET

RESULTS_ENV = "TFMEM_BENCH_RESULTS"
CONTENDER_ENV = "TFMEM_BENCH_CONTENDER"
INTERVAL_ENV = "TFMEM_BENCH_INTERVAL"
MiB = 2**20


def pytest_configure(config: pytest.Config) -> None:
    contender = os.environ.get(CONTENDER_ENV, "none")
    interval = os.environ.get(INTERVAL_ENV)
    recorder = BenchRecorder(config, contender, os.environ.get(RESULTS_ENV), float(interval) if interval else None)
    config.pluginmanager.register(recorder, "tfmem-bench-recorder")


class BenchRecorder:
    def __init__(self, config: pytest.Config, contender: str, results_path: str | None, interval: float | None) -> None:
        self.config = config
        self.contender = contender
        self.results_path = results_path
        self.interval = interval
        self.call_started: dict[str, tuple[float, float]] = {}
        self.sampled_peak: dict[str, int] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        marker = {
            "memray": pytest.mark.limit_memory(UNREACHED_BUDGET.replace("GB", " GB")),
            "memray-leaks": pytest.mark.limit_leaks(MEMRAY_LEAK_LIMIT),
        }.get(self.contender)
        if marker is not None:
            for item in items:
                item.add_marker(marker)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        self.call_started[item.nodeid] = (time.perf_counter(), _cpu_seconds())
        return (yield)

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        """The sampling contender: run the body under ``memory_profiler.memory_usage``."""
        if self.interval is None:
            return None
        import memory_profiler

        arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
        rss_before = psutil.Process().memory_info().rss
        peak_mib = memory_profiler.memory_usage(
            (pyfuncitem.obj, (), arguments), interval=self.interval, max_usage=True, max_iterations=1
        )
        self.sampled_peak[pyfuncitem.nodeid] = max(0, int(peak_mib * MiB) - rss_before)
        return True

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" or report.nodeid not in self.call_started:
            return
        wall_started, cpu_started = self.call_started.pop(report.nodeid)
        line: dict[str, Any] = {
            "test": report.nodeid.split("::")[-1],
            "outcome": report.outcome,
            "seconds": time.perf_counter() - wall_started,
            "cpu_seconds": _cpu_seconds() - cpu_started,
            "peak": self._peak(report),
            "message": _failure_summary(report) if report.failed else "",
        }
        self._write(line)

    @pytest.hookimpl
    def pytest_sessionfinish(self) -> None:
        if self.contender != "none":
            return
        wall_started, cpu_started = time.perf_counter(), _cpu_seconds()
        gc.collect()
        self._write({"test": "gc.collect()", "outcome": "gc", "seconds": time.perf_counter() - wall_started,
                     "cpu_seconds": _cpu_seconds() - cpu_started, "peak": None, "message": "",
                     "objects": len(gc.get_objects())})

    def _write(self, line: dict[str, Any]) -> None:
        if self.results_path:
            with open(self.results_path, "a", encoding="utf-8") as results:
                results.write(json.dumps(line) + "\n")

    def _peak(self, report: pytest.TestReport) -> int | None:
        if self.contender == "tfmem":
            value = dict(report.user_properties).get("tfmem_peak_bytes")
            return int(value) if value is not None else None
        if self.contender == "memray":
            manager = self.config.pluginmanager.get_plugin("memray_manager")
            result = manager.results.get(report.nodeid) if manager is not None else None
            return int(result.peak_memory) if result is not None else None
        if self.interval is not None:
            return self.sampled_peak.pop(report.nodeid, None)
        return None


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _failure_summary(report: pytest.TestReport) -> str:
    """The failure's message (its first line), to tell a tool's verdict from a crash."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else report.longreprtext
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else ""
