"""Reading the results journal (``journal.format``): what ``tfmem last`` prints.

The journal's last session (a pytest session, or a ``tfmem run``) is told in full: whether it
finished (its ``end`` entry), is still running (its process is alive) or stopped without finishing; each test started
and never finished, with its last memory reading; and the tests that finished.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil

from pytest_tfmem.journal.format import DEFAULT_PATH, SAMPLE_INTERVAL_S, read_journal
from pytest_tfmem.units import format_size

EXIT_FINISHED = 0
EXIT_DID_NOT_FINISH = 1
EXIT_NO_RESULTS = 2


# What marks a project's root, as pytest finds its rootdir: its ini files, a setup script, the
# repository itself.
ROOT_MARKERS = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg", "setup.py", ".git")


def project_root(start: Path) -> Path:
    """The nearest of ``start`` and its parents that holds one of ``ROOT_MARKERS``; ``start``
    itself where none does (pytest's rootdir is then the directory it runs in)."""
    for candidate in (start, *start.parents):
        if any((candidate / marker).exists() for marker in ROOT_MARKERS):
            return candidate
    return start


def find_results(start: Path | None = None) -> Path | None:
    """The default journal (``.tfmem/results.jsonl``) in ``start`` or a parent up to the project's
    root (``project_root``), never past it: an unrelated ``.tfmem/`` further up is not this
    project's."""
    directory = (start or Path.cwd()).resolve()
    root = project_root(directory)
    for candidate in (directory, *directory.parents):
        if (candidate / DEFAULT_PATH).is_file():
            return candidate / DEFAULT_PATH
        if candidate == root:
            break
    return None


def clock(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _pid_alive(header: dict[str, Any]) -> bool:
    """Whether the session's pytest process still runs (same pid, same start: not a reused pid)."""
    try:
        process = psutil.Process(header["pid"])
        same = abs(process.create_time() - header.get("pid_created", 0)) < 1
        return same and process.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError):
        return False


def _finished_line(entry: dict[str, Any]) -> str:
    record = entry.get("record") or {}
    measurement = record.get("measurement")
    value = measurement["peak"] if measurement else entry.get("peak")  # a run's finish holds its peak
    peak = f"peak {format_size(value)}" if value is not None else "peak -"
    line = f"  {entry.get('outcome', '?'):8} {entry.get('nodeid')}  {peak}  {entry.get('duration_s', 0):.2f} s"
    if entry.get("message") and entry.get("outcome") not in ("passed", "xpassed"):
        line += f"  {entry['message']}"
    return line


RunningKey = tuple[str | None, str | None]  # (worker, node id)


def unfinished_tests(session: list[dict[str, Any]]) -> dict[RunningKey, tuple[dict[str, Any], dict[str, Any] | None]]:
    """Tests of one session's entries that started and never finished, by (worker, node id):
    the ``start`` entry and the last ``reading`` after it (``None`` if none was written)."""
    started: dict[RunningKey, dict[str, Any]] = {}
    readings: dict[RunningKey, dict[str, Any]] = {}
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
    return {key: (start, readings.get(key)) for key, start in started.items()}


def last_reading_line(start: dict[str, Any], reading: dict[str, Any] | None) -> str:
    """A running test's last memory reading in the journal, in words."""
    if reading is None:
        return f"last reading {format_size(start['rss'])} when it started (process tree RSS)"
    growth = format_size(reading["rss"] - start["rss"], signed=True)
    where = f" {reading['where']}" if reading.get("where") else ""  # where a run's script was
    return (
        f"last reading {format_size(reading['rss'])} ({growth} since the test started) "
        f"at {reading['elapsed_s']:.1f} s into the test ({clock(reading['time'])}){where}; "
        f"peak {format_size(reading['peak'])} (process tree RSS, sampled every {SAMPLE_INTERVAL_S:g} s)"
    )


class NotAJournal(ValueError):
    """The file is not a pytest-tfmem results journal."""


def read_last_session(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The journal's last session: its header and its own entries. Raises ``OSError`` when
    the file cannot be read, ``NotAJournal`` when it is not a journal."""
    entries = read_journal(path)
    if not entries or entries[0].get("event") != "session":
        raise NotAJournal(f"{path} is not a pytest-tfmem results journal")
    header = entries[0]
    return header, [entry for entry in entries[1:] if entry.get("session") == header.get("session")]


def session_end(session: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The session's ``end`` entry, or ``None`` if it did not finish."""
    return next((entry for entry in session if entry.get("event") == "end"), None)


def session_died(header: dict[str, Any], session: list[dict[str, Any]]) -> bool:
    """It did not finish and its pytest process is gone (killed, or crashed)."""
    return session_end(session) is None and not _pid_alive(header)


def describe_last(path: Path, *, show_all: bool = False, last: int = 20) -> tuple[str, int]:
    """What ``tfmem last`` prints about the journal at ``path``, and its exit code:
    0 the session finished, 1 it did not (killed, crashed, or still running; for a run, also
    its script killed), 2 no results."""
    try:
        header, session = read_last_session(path)
    except OSError as error:
        return f"tfmem: no results at {path}: {error.strerror or error}", EXIT_NO_RESULTS
    except NotAJournal as error:
        return f"tfmem: {error}", EXIT_NO_RESULTS
    run = header.get("kind") == "run"
    what = f"tfmem {' '.join(header.get('args', []))}" if run else "the pytest session"
    lines = [f"tfmem: results of {what} started {clock(header['started'])} (pid {header['pid']})"]
    if not run:
        lines.append(f"  rootdir {header.get('rootdir')}; arguments: {' '.join(header.get('args', [])) or '(none)'}")
    end = session_end(session)
    killed = run and any(entry.get("outcome") == "killed" for entry in session)
    if end is not None:
        lines.append(f"  {'it' if run else 'the session'} finished at {clock(end['time'])}, "
                     f"exit status {end['exitstatus']}")
        code = EXIT_DID_NOT_FINISH if killed else EXIT_FINISHED  # a run's script killed did not finish
    elif not session_died(header, session):
        lines.append(f"  {'it' if run else 'the session'} is still running")
        code = EXIT_DID_NOT_FINISH
    else:
        process = "tfmem run" if run else "pytest"
        lines.append(f"  {'it' if run else 'the session'} did NOT finish: the {process} process is gone "
                     "(killed, or crashed)")
        code = EXIT_DID_NOT_FINISH

    unfinished = unfinished_tests(session)
    finished = [entry for entry in session if entry.get("event") == "finish"]
    last_time = session[-1]["time"] if session else header["started"]
    if unfinished:
        lines.append("running when the journal ends:" if end is None else "started but never finished:")
        for (worker, _), (start, reading) in unfinished.items():
            label = f" [{worker}]" if worker else ""
            lines.append(
                f"  {start['nodeid']}{label}: started {clock(start['time'])}, "
                f"still running {max(0.0, last_time - start['time']):.1f} s later at the journal's last entry"
            )
            lines.append(f"    {last_reading_line(start, reading)}")
    counts: dict[str, int] = {}
    for entry in finished:
        counts[entry.get("outcome", "?")] = counts.get(entry.get("outcome", "?"), 0) + 1
    summary = ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items()))
    lines.append(f"finished: {len(finished)} {'run' if run else 'test(s)'}{': ' + summary if summary else ''}")
    shown = finished if show_all else finished[-last:]
    if len(shown) < len(finished):
        failed = [e for e in finished[: len(finished) - len(shown)] if e.get("outcome") in ("failed", "error")]
        lines.append(f"  ... {len(finished) - len(shown)} earlier test(s) not shown (--all shows them)")
        lines += [_finished_line(entry) for entry in failed]
    lines += [_finished_line(entry) for entry in shown]
    return "\n".join(lines), code
