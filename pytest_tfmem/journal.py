"""Crash-safe results: a journal of the session, written while it runs.

When the whole pytest process is killed (the OOM killer's SIGKILL, a CI timeout), nothing
written at the end of the session exists. The journal is appended to as the session goes,
one JSON object per line:

- ``session``: the first line; the session's id, pid, start time, rootdir and arguments;
- ``start``: a test began (with the process tree's RSS at that moment);
- ``reading``: the running test's process tree RSS now and its sampled peak so far, every
  second, and at once when the peak has grown by 10% (at least 16 MiB) since the last
  reading written;
- ``finish``: a test ended: outcome, duration, the failure's first line, its tfmem record
  (synced to disk, ``fsync``);
- ``end``: the session ended, with its exit status.

Each line is one ``write`` to a file opened for appending, so lines of several processes
(pytest-xdist workers) never mix, and a kill loses at most the line being written. The
previous session's journal is kept beside it (``results.previous.jsonl``). ``tfmem last``
reads the journal (``describe_last``).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from . import plugin, settings
from .atomic import write_text_atomic
from .child import IN_CHILD
from .probes.host import RssSampler
from .records import record_from_report
from .units import format_size

PLUGIN_NAME = "tfmem-journal"
DEFAULT_PATH = Path(".tfmem") / "results.jsonl"
SAMPLE_INTERVAL_S = 0.1
WRITE_INTERVAL_S = 1.0
# A sampled peak this much above the last one written is written at once.
GROWTH_TO_WRITE = 0.10
GROWTH_TO_WRITE_BYTES = 16 * 2**20
_SESSION_KEY = "tfmem_session"


def parse_path(value: object, what: str) -> str:
    text = str(value).strip()
    if not text:
        raise ValueError(f"invalid {what} {value!r}: expected a file path")
    return text


RESULTS = settings.Option(
    "results",
    "the crash-safe results journal, written as tests run (default .tfmem/results.jsonl in the "
    "rootdir); `tfmem last` reads it",
    parse_path,
)


def previous_path(path: Path) -> Path:
    """Where the previous session's journal is kept: ``results.previous.jsonl``."""
    return path.with_name(f"{path.stem}.previous{path.suffix}")


# -- writing -----------------------------------------------------------------------------


@contextmanager
def _directory_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock shared by every process writing into ``directory`` (flock)."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def _first_entry(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as journal:
            return json.loads(journal.readline())
    except (OSError, ValueError):
        return {}


class JournalFile:
    """Appends entries to one session's journal; the first writer of a session starts the
    file (keeping the previous session's as ``*.previous.jsonl``), later writers append."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.header = header
        self._descriptor: int | None = None

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _directory_lock(self.path.parent):
            if _first_entry(self.path).get("session") != self.header["session"]:
                if self.path.exists():
                    os.replace(self.path, previous_path(self.path))
                write_text_atomic(self.path, json.dumps(self.header) + "\n")
            self._descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND)

    def append(self, entry: dict[str, Any], *, sync: bool = False) -> None:
        if self._descriptor is None:
            return
        entry = {"session": self.header["session"], "time": round(time.time(), 3), **entry}
        os.write(self._descriptor, (json.dumps(entry) + "\n").encode())
        if sync:
            os.fsync(self._descriptor)

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


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

    def __init__(self, journal: JournalFile, worker: str | None) -> None:
        self.journal = journal
        self.worker = worker
        self._reader = RssSampler(include_children=True)
        self._lock = threading.Lock()
        self._running: _RunningTest | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfmem-journal-readings", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def begin(self, nodeid: str) -> int:
        rss = self._reader.read()
        with self._lock:
            now = time.monotonic()
            self._running = _RunningTest(nodeid, now, peak=rss, written_peak=rss, written_at=now)
        return rss

    def end(self) -> int | None:
        with self._lock:
            running, self._running = self._running, None
        return running.peak if running else None

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            try:
                rss = self._reader.read()
            except psutil.Error:
                continue
            with self._lock:
                running = self._running
                if running is None:
                    continue
                running.peak = max(running.peak, rss)
                now = time.monotonic()
                grown = running.peak - running.written_peak > max(
                    GROWTH_TO_WRITE * running.written_peak, GROWTH_TO_WRITE_BYTES
                )
                if not grown and now - running.written_at < WRITE_INTERVAL_S:
                    continue
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
    if IN_CHILD not in config.stash:  # an isolated test's parent keeps the journal
        config.pluginmanager.register(TfmemJournal(config), PLUGIN_NAME)


class TfmemJournal:
    """Keeps the journal of this session: tests are logged by the process that runs them."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        path, self.path_given = settings.read_option(config, RESULTS)
        # A path on the command line is relative to where pytest was started, like
        # --junitxml; the ini value and the default are relative to the rootdir.
        on_command_line = config.getoption(RESULTS.ini, default=None) is not None
        base = config.invocation_params.dir if on_command_line else config.rootpath
        self.path = Path(base) / (path or DEFAULT_PATH)
        workerinput = getattr(config, "workerinput", None)
        self.worker: str | None = workerinput["workerid"] if workerinput else None
        if workerinput and _SESSION_KEY in workerinput:
            self.header = workerinput[_SESSION_KEY]
        else:
            process = psutil.Process()
            self.header = {
                "event": "session",
                "session": f"{int(time.time() * 1000):x}-{os.getpid()}",
                "pid": os.getpid(),
                "pid_created": process.create_time(),
                "started": round(time.time(), 3),
                "rootdir": str(config.rootpath),
                "args": [str(arg) for arg in config.invocation_params.args],
            }
        self.journal: JournalFile | None = None
        self.readings: ReadingsThread | None = None
        self._outcomes: dict[str, _TestOutcome] = {}

    def _runs_tests(self) -> bool:
        return not self.config.pluginmanager.has_plugin("dsession")  # not a pytest-xdist controller

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
        self.readings = ReadingsThread(journal, self.worker)
        self.readings.start()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """pytest-xdist: the workers write into this session's journal."""
        node.workerinput[_SESSION_KEY] = self.header

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        if self.journal is not None or not self._runs_tests():
            return
        manager = plugin.manager(self.config)
        isolation = self.config.pluginmanager.get_plugin("tfmem-isolation")
        if self.path_given or any(
            manager.is_measured(item) or (isolation is not None and isolation.policy_for(item)) for item in items
        ):
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
        if report.nodeid in self._outcomes:
            self._outcomes[report.nodeid].reports.append(report)

    @pytest.hookimpl
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if self.journal is None or self.readings is None or nodeid not in self._outcomes:
            return
        sampled_peak = self.readings.end()
        outcome = self._outcomes.pop(nodeid)
        record = next((record_from_report(r) for r in outcome.reports if r.when == "call"), None)
        entry = {
            "event": "finish",
            "worker": self.worker,
            "nodeid": nodeid,
            "outcome": outcome.outcome(),
            "duration_s": round(sum(report.duration for report in outcome.reports), 3),
            "sampled_peak": sampled_peak,
            "message": outcome.message(),
            "record": record.to_dict() if record is not None else None,
        }
        self.journal.append(entry, sync=True)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, exitstatus: int) -> None:
        if self.readings is not None:
            self.readings.stop()
        if self.journal is not None:
            self.journal.close()
        if self.worker is None and _first_entry(self.path).get("session") == self.header["session"]:
            ending = JournalFile(self.path, self.header)
            ending.open()
            ending.append({"event": "end", "exitstatus": int(exitstatus)}, sync=True)
            ending.close()


# -- reading -----------------------------------------------------------------------------

EXIT_FINISHED = 0
EXIT_DID_NOT_FINISH = 1
EXIT_NO_RESULTS = 2


def find_results(start: Path | None = None) -> Path | None:
    """The default journal (``.tfmem/results.jsonl``) in ``start`` or its nearest parent."""
    directory = (start or Path.cwd()).resolve()
    for candidate in (directory, *directory.parents):
        if (candidate / DEFAULT_PATH).is_file():
            return candidate / DEFAULT_PATH
    return None


def read_journal(path: Path) -> list[dict[str, Any]]:
    """The journal's entries; a line cut short by a kill is skipped."""
    entries = []
    with open(path, encoding="utf-8", errors="replace") as journal:
        for line in journal:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                entries.append(entry)
    return entries


def _clock(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _pid_alive(header: dict[str, Any]) -> bool:
    try:
        return abs(psutil.Process(header["pid"]).create_time() - header.get("pid_created", 0)) < 1
    except (psutil.Error, KeyError, TypeError):
        return False


def _finished_line(entry: dict[str, Any]) -> str:
    record = entry.get("record") or {}
    measurement = record.get("measurement")
    peak = f"peak {format_size(measurement['peak'])}" if measurement else "peak -"
    line = f"  {entry.get('outcome', '?'):8} {entry.get('nodeid')}  {peak}  {entry.get('duration_s', 0):.2f} s"
    if entry.get("message") and entry.get("outcome") not in ("passed", "xpassed"):
        line += f"  {entry['message']}"
    return line


def describe_last(path: Path, *, show_all: bool = False, last: int = 20) -> tuple[str, int]:
    """What ``tfmem last`` prints about the journal at ``path``, and its exit code:
    0 the session finished, 1 it did not (killed, crashed, or still running), 2 no results."""
    try:
        entries = read_journal(path)
    except OSError as error:
        return f"tfmem: no results at {path}: {error.strerror or error}", EXIT_NO_RESULTS
    if not entries or entries[0].get("event") != "session":
        return f"tfmem: {path} is not a pytest-tfmem results journal", EXIT_NO_RESULTS
    header = entries[0]
    session = [entry for entry in entries[1:] if entry.get("session") == header.get("session")]
    lines = [f"tfmem: results of the pytest session started {_clock(header['started'])} (pid {header['pid']})"]
    lines.append(f"  rootdir {header.get('rootdir')}; arguments: {' '.join(header.get('args', [])) or '(none)'}")
    end = next((entry for entry in session if entry.get("event") == "end"), None)
    if end is not None:
        lines.append(f"  the session finished at {_clock(end['time'])}, exit status {end['exitstatus']}")
        code = EXIT_FINISHED
    elif _pid_alive(header):
        lines.append("  the session is still running")
        code = EXIT_DID_NOT_FINISH
    else:
        lines.append("  the session did NOT finish: the pytest process is gone (killed, or crashed)")
        code = EXIT_DID_NOT_FINISH

    started: dict[tuple[Any, str], dict[str, Any]] = {}
    readings: dict[tuple[Any, str], dict[str, Any]] = {}
    finished = []
    for entry in session:
        key = (entry.get("worker"), entry.get("nodeid"))
        if entry.get("event") == "start":
            started[key] = entry
            readings.pop(key, None)
        elif entry.get("event") == "reading" and key in started:
            readings[key] = entry
        elif entry.get("event") == "finish":
            started.pop(key, None)
            readings.pop(key, None)
            finished.append(entry)

    last_time = session[-1]["time"] if session else header["started"]
    if started:
        lines.append("running when the journal ends:" if end is None else "started but never finished:")
        for key, start in started.items():
            worker = f" [{key[0]}]" if key[0] else ""
            reading = readings.get(key)
            lines.append(
                f"  {start['nodeid']}{worker}: started {_clock(start['time'])}, "
                f"still running {max(0.0, last_time - start['time']):.1f} s later at the journal's last entry"
            )
            if reading is not None:
                growth = format_size(reading["rss"] - start["rss"], signed=True)
                lines.append(
                    f"    last reading {format_size(reading['rss'])} ({growth} since the test started) "
                    f"at {reading['elapsed_s']:.1f} s into the test ({_clock(reading['time'])}); "
                    f"peak {format_size(reading['peak'])} (process tree RSS, sampled every {SAMPLE_INTERVAL_S:g} s)"
                )
            else:
                lines.append(f"    last reading {format_size(start['rss'])} when it started (process tree RSS)")
    counts: dict[str, int] = {}
    for entry in finished:
        counts[entry.get("outcome", "?")] = counts.get(entry.get("outcome", "?"), 0) + 1
    summary = ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items()))
    lines.append(f"finished: {len(finished)} test(s){': ' + summary if summary else ''}")
    shown = finished if show_all else finished[-last:]
    if len(shown) < len(finished):
        failed = [e for e in finished[: len(finished) - len(shown)] if e.get("outcome") in ("failed", "error")]
        lines.append(f"  ... {len(finished) - len(shown)} earlier test(s) not shown (--all shows them)")
        lines += [_finished_line(entry) for entry in failed]
    lines += [_finished_line(entry) for entry in shown]
    return "\n".join(lines), code
