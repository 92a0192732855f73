"""Crash-safe results: a journal of the session, written while it runs (``journal.format``).

When the whole pytest process is killed (the OOM killer's SIGKILL, a CI timeout), nothing
written at the end of the session exists. The journal is appended to as the session goes,
one JSON object per line. Each line is one ``write`` to a file opened for appending (under a lock
where an append is not one step: Windows), so lines of several processes (pytest-xdist workers)
never mix, and a kill loses at most the line being
written: once written, a line is in the kernel's page cache and outlives the process. Against
the whole machine going down, ``finish`` and ``end`` lines are also synced to disk
(``fsync``), at most once a second (a sync costs milliseconds; after every test it would slow
a suite of small tests down). The previous session's journal is kept beside it
(``results.previous.jsonl``). ``tfmem last`` reads the journal (``journal.reader``).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_tfmem.core import processes, settings
from pytest_tfmem.core.manager import manager
from pytest_tfmem.core.record import TestRecord, record_from_report
from pytest_tfmem.core.subtests import subtest_description
from pytest_tfmem.journal.format import (
    RESULTS,
    SAMPLE_INTERVAL_S,
    WRITE_INTERVAL_S,
    JournalFile,
    first_entry,
    reading_due,
    results_path,
)
from pytest_tfmem.probes import host
from pytest_tfmem.probes.sampler import Sampler
from pytest_tfmem.probes.watchdog import ProcessGone, ProcessTreeRss


@dataclass
class _RunningTest:
    nodeid: str
    started: float
    peak: int = 0
    written_peak: int = 0
    written_at: float = 0.0


class ReadingsThread:
    """Samples the process tree (this process and its children, e.g. an isolated test)
    while a test runs, and writes readings to the journal."""

    def __init__(self, journal: JournalFile, worker: str | None, template_pids: set[int]) -> None:
        self.journal = journal
        self.worker = worker
        self._reader = ProcessTreeRss(os.getpid(), refresh_s=WRITE_INTERVAL_S, leave_out=template_pids)
        self._lock = threading.Lock()
        self._running: _RunningTest | None = None
        self._sampler = Sampler(self._sample, SAMPLE_INTERVAL_S, "tfmem-journal-readings")

    def start(self) -> None:
        self._sampler.start()

    def stop(self) -> None:
        self._sampler.stop()

    def begin(self, nodeid: str) -> int:
        # Without descendants at the last listing (the sampler lists them every second), this
        # process's size alone: the same figure, read from a smaller file.
        rss = self._read() if self._reader.descendants else host.current_rss()
        with self._lock:
            now = time.monotonic()
            self._running = _RunningTest(nodeid, now, peak=rss, written_peak=rss, written_at=now)
        return rss

    def end(self) -> int | None:
        with self._lock:
            running, self._running = self._running, None
        return running.peak if running else None

    def _read(self) -> int:
        """The tree's size now; 0 where this process cannot be read (nothing to stop a session for)."""
        try:
            return self._reader.read()
        except ProcessGone:
            return 0

    def _sample(self) -> None:
        rss = self._read()
        if not rss:
            return
        with self._lock:
            running = self._running
            if running is None:
                return
            running.peak = max(running.peak, rss)
            now = time.monotonic()
            if not reading_due(running.peak, running.written_peak, now - running.written_at):
                return
            running.written_peak, running.written_at = running.peak, now
            entry = {
                "event": "reading",
                "worker": self.worker,
                "nodeid": running.nodeid,
                "elapsed_s": round(now - running.started, 3),
                "rss": rss,
                "peak": running.peak,
            }
        self.journal.append(entry)


@dataclass
class _TestOutcome:
    reports: list[pytest.TestReport] = field(default_factory=list)
    record: TestRecord | None = None  # the call report's, read as it is logged (then it is taken off)

    def outcome(self) -> str:
        for report in self.reports:
            if report.failed:
                return "failed" if report.when == "call" else "error"
        for report in self.reports:
            if hasattr(report, "wasxfail"):
                return "xfailed" if report.skipped else "xpassed"
        if any(report.skipped for report in self.reports):
            return "skipped"
        return "passed"

    def message(self) -> str | None:
        for report in self.reports:
            if report.failed or report.skipped:
                crash = getattr(report.longrepr, "reprcrash", None)
                text = crash.message if crash is not None else report.longreprtext
                return text.strip().splitlines()[0][:300] if text and text.strip() else None
        return None


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser, [RESULTS])


def pytest_configure(config: pytest.Config) -> None:
    if processes.role(config) is not processes.Role.CHILD:  # an isolated test's parent keeps the journal
        config.pluginmanager.register(TfmemJournal(config), "tfmem-journal")


class TfmemJournal:
    """Keeps the journal of this session: tests are logged by the process that runs them."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.path, self.path_given = results_path(config)
        self.worker = processes.worker_id(config)
        shared = processes.session(config)
        self.header = {"event": "session", "session": shared.id, **shared.to_dict()}
        self.journal: JournalFile | None = None
        self.readings: ReadingsThread | None = None
        self._outcomes: dict[str, _TestOutcome] = {}

    def _open(self) -> None:
        journal = JournalFile(self.path, self.header)
        try:
            journal.open()
        except OSError as error:
            self.config.issue_config_time_warning(
                pytest.PytestWarning(f"pytest-tfmem: cannot write the results journal {self.path}: {error}"), 2
            )
            return
        self.journal = journal
        self.readings = ReadingsThread(journal, self.worker, manager(self.config).template_pids)
        self.readings.start()

    @pytest.hookimpl(trylast=True)  # after pytest's and other plugins' selection (-k, -m, deselect)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        if self.journal is not None or not processes.role(self.config).runs_tests:
            return
        tfmem_manager = manager(self.config)
        if self.path_given or any(tfmem_manager.is_measured(item) for item in items):
            self._open()

    @pytest.hookimpl
    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self.journal is None or self.readings is None:
            return
        self._outcomes[nodeid] = _TestOutcome()
        rss = self.readings.begin(nodeid)
        self.journal.append({"event": "start", "worker": self.worker, "nodeid": nodeid, "rss": rss})

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # A subtest's report is not its test's: a failed subtest fails the test's own report too.
        if report.nodeid in self._outcomes and subtest_description(report) is None:
            outcome = self._outcomes[report.nodeid]
            outcome.reports.append(report)
            if report.when == "call":
                outcome.record = record_from_report(report)

    @pytest.hookimpl
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if self.journal is None or self.readings is None or nodeid not in self._outcomes:
            return
        sampled_peak = self.readings.end()
        outcome = self._outcomes.pop(nodeid)
        record = outcome.record
        entry: dict[str, Any] = {
            "event": "finish",
            "worker": self.worker,
            "nodeid": nodeid,
            "outcome": outcome.outcome(),
            "duration_s": round(sum(report.duration for report in outcome.reports), 3),
            "sampled_peak": sampled_peak,
        }
        if entry["outcome"] == "passed" and (record is None or not record.failed_verdicts):
            if record is not None and record.measurement is not None:  # within every limit: its peak is the story
                entry["peak"] = record.measurement.peak
        else:
            entry["message"] = outcome.message()
            entry["record"] = record.to_dict() if record is not None else None
        self.journal.append(entry, sync=True)

    @pytest.hookimpl(trylast=True)  # after the other plugins' end of session (pytest-xdist's workers)
    def pytest_sessionfinish(self, exitstatus: int) -> None:
        if self.readings is not None:
            self.readings.stop()
        if self.journal is not None:
            self.journal.close()
        ours = first_entry(self.path).get("session") == self.header["session"]
        if processes.role(self.config).writes_session_outputs and ours:
            ending = JournalFile(self.path, self.header)
            ending.open()
            ending.append({"event": "end", "exitstatus": int(exitstatus)}, sync=True)
            ending.close()
