"""The memory history: every test's figures at every commit a session measured, in one file.

    pytest --tfmem-history=memory-history.jsonl      # one line per session, appended
    tfmem history memory-history.jsonl              # the steps and creep of each test
    tfmem merge -o memory-history.jsonl a.jsonl b.jsonl   # shards (and copies) folded

The file is JSON Lines, append-only: each session adds one line, written whole in one ``write``
to a file opened for appending (under the directory's lock), so several writers at once (shards
on a shared disk) never mix their lines, and a line cut short by a kill is never followed on the
same line (a writer that finds the file not ending in a newline starts with one). A line::

    {"format": "pytest-tfmem-history", "version": 1,
     "commit": "4e1c2a7...", "parent": "a1b2c3d..." or null, "branch": "main" or null,
     "date": "2026-12-03T12:00:00+01:00", "dirty": false, "recorded": "2026-12-03T11:05:00+00:00",
     "environment": {...as in a baseline: python, platform, memory, tensorflow...},
     "sessions": ["<session id>", ...],
     "tests": {"<node id>": [[<session index>, <peak>, <retained or null>, {<view>: <peak>}?], ...]},
     "failed": {"<node id>": [[<session index>, "<the tfmem checks it failed>"], ...]}?,
     "unconfirmed": {"<node id>": [[<session index>, "<why it departed>"], ...]}?}

A pytest session writes one session and one sample per test (``RawSample``) whose figures were
measured to the end: a test that passed, or one that failed a tfmem check (``failed`` says which,
where any did: a reader that does not know the field reads the figures as before). A figure
that departed from the test's level and could not be measured again (``core.confirm``: a test
with ``rerun=False``, a re-run that raised) is written with a mark (``unconfirmed``), and step,
creep and gate leave it out: a one-time cost is never a step. Read back,
lines are folded: those of one commit and one environment are one ``Entry`` (the tests of several
shards together; a commit measured again gives its tests another sample; a session seen twice
counts once, so ``tfmem merge`` of a file with itself changes nothing). Figures of another
environment (Python, framework versions, platform, what is counted, GPUs) are another series,
never compared.

A line that cannot be read (cut short by a kill, not JSON, of another or a newer format version,
a field missing or of the wrong type) costs only itself: readers skip it and name it, with its file
and line and why (``HistoryRead.skipped``), and read the rest as if it were absent; no reader ever
rewrites the file. A file that is missing, unreadable or holds no good line is a ``HistoryError``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from pytest_tfmem import platforms
from pytest_tfmem.files import FileFormatError, Output
from pytest_tfmem.gates.steps import Point

FORMAT = "pytest-tfmem-history"
VERSION = 1
# What makes two sessions' figures comparable: the rest of the environment (the CPU model, the
# core count) is kept in each line but does not start another series.
SERIES_KEYS = ("python", "platform", "memory", "peaks", "tensorflow", "keras", "tf_keras", "numpy", "jax", "jaxlib",
               "torch", "gpus")


class HistoryError(FileFormatError):
    """A history that cannot be read or written; the message names the file (and line)."""

    what = "history"


# Every line starts so (``Entry.to_line`` writes the format first): a history is told by the first
# bytes of one of its first lines, whatever the length of its lines, a bad first line and all.
LINE_START = f'{{"format":"{FORMAT}"'
_LINE_START = LINE_START.encode()
_LOOKED_AT = 2**16  # the bytes of a file read to tell a history
OUTPUT = Output("memory history", lambda path: is_history(path))


def is_history(path: Path) -> bool:
    """A line among the file's first bytes (``_LOOKED_AT``) starts as a history's lines do."""
    try:
        with open(path, "rb") as stream:
            head = stream.read(_LOOKED_AT)
    except OSError:
        return False
    return head.startswith(_LINE_START) or b"\n" + _LINE_START in head


@dataclass(frozen=True)
class Commit:
    """The commit a session measured, as git tells it."""

    commit: str
    parent: str | None
    branch: str | None
    date: str
    dirty: bool


def current_commit(directory: Path) -> Commit:
    """The checkout ``directory`` is in; ``HistoryError`` where git cannot tell (not a checkout, no
    git). A shallow clone's first commit has no parent to read: ``parent`` is ``None`` then."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        raise HistoryError(directory, "not in a git checkout (git rev-parse HEAD failed): the history keys "
                                      "each session's figures by its commit")
    branch = git("rev-parse", "--abbrev-ref", "HEAD")
    return Commit(
        commit=commit,
        parent=git("rev-parse", "--verify", "--quiet", "HEAD^") or None,
        branch=None if branch in (None, "HEAD") else branch,
        date=git("show", "-s", "--format=%cI", "HEAD") or "",
        dirty=bool(git("status", "--porcelain", "--untracked-files=no")),
    )


def series_key(environment: dict[str, Any]) -> str:
    """Two sessions' figures are one series where these are equal. A framework that is not
    installed is left out, so that a line written before the environment named it (JAX and
    PyTorch were named later) is of the same series as one written since without it."""
    return json.dumps({key: environment.get(key) for key in SERIES_KEYS if environment.get(key) not in (None, [])},
                      sort_keys=True)


def series_label(environment: dict[str, Any]) -> str:
    """``Python 3.11, Linux x86_64 (RSS), tensorflow 2.21.0``: a series for people."""
    platform = f"{environment.get('platform')} ({environment.get('memory', 'RSS')})"
    parts = [f"Python {environment.get('python')}", platform]
    parts += [f"{key} {environment[key]}" for key in ("tensorflow", "keras", "tf_keras", "jax", "torch")
              if environment.get(key)]
    gpus = environment.get("gpus")
    if gpus:
        parts.append(", ".join(gpus))
    return ", ".join(parts)


# One session's figures of one test, as the file holds them: [session index in its entry's
# ``sessions``, peak, retained or None, {view: peak} where it has views] (bytes). Kept as read, not
# turned into objects: a history of a thousand commits of two thousand tests has two million.
RawSample = list[Any]
PEAK, RETAINED, VIEWS = 1, 2, 3
# One failing session's sample of a test: [session index, the tfmem checks it failed ("budget")];
# the same shape marks an unconfirmed sample: [session index, why it departed].
RawFailure = list[Any]


@dataclass
class Entry:
    """One commit in one environment: every session's sample of every test."""

    commit: str
    parent: str | None
    branch: str | None
    date: str
    environment: dict[str, Any]
    recorded: str = ""
    dirty: bool = False
    tests: dict[str, list[RawSample]] = field(default_factory=dict)
    sessions: list[str] = field(default_factory=list)
    failed: dict[str, list[RawFailure]] = field(default_factory=dict)  # the samples of tests that failed a check
    unconfirmed: dict[str, list[RawFailure]] = field(default_factory=dict)  # samples that departed, unconfirmed

    @property
    def key(self) -> tuple[str, str]:
        return self.commit, series_key(self.environment)

    def add(self, other: Entry) -> None:
        """Fold ``other``'s sessions in (a session already here counts once)."""
        index = {session: number for number, session in enumerate(self.sessions)}
        moved = {}
        for number, session in enumerate(other.sessions):
            if session not in index:
                index[session] = moved[number] = len(self.sessions)
                self.sessions.append(session)
        for mine, theirs in ((self.tests, other.tests), (self.failed, other.failed),
                             (self.unconfirmed, other.unconfirmed)):
            for nodeid, samples in theirs.items():
                kept = [[moved[sample[0]], *sample[1:]] for sample in samples if sample[0] in moved]
                if kept:
                    mine.setdefault(nodeid, []).extend(kept)
        self.recorded = max(self.recorded, other.recorded)
        self.dirty = self.dirty or other.dirty

    def to_line(self) -> str:
        data = {  # the format first (``LINE_START``)
            "format": FORMAT, "version": VERSION, "commit": self.commit, "parent": self.parent, "branch": self.branch,
            "date": self.date, "dirty": self.dirty, "recorded": self.recorded,
            "environment": dict(sorted(self.environment.items())), "sessions": self.sessions,
            "tests": dict(sorted(self.tests.items())),
        }
        if self.failed:
            data["failed"] = dict(sorted(self.failed.items()))
        if self.unconfirmed:
            data["unconfirmed"] = dict(sorted(self.unconfirmed.items()))
        return json.dumps(data, separators=(",", ":")) + "\n"

    def failures(self, nodeid: str) -> str:
        """The tfmem checks a sample of the test at this commit failed (``budget, history``), or ``""``."""
        checks = dict.fromkeys(str(failure[1]) for failure in self.failed.get(nodeid, ()))
        return ", ".join(checks)


def session_entry(commit: Commit, environment: dict[str, Any], session: str,
                  figures: dict[str, tuple[int, int | None, dict[str, int]]],
                  failed: dict[str, str] | None = None, unconfirmed: dict[str, str] | None = None) -> Entry:
    """This session's entry: ``figures`` maps each measured test to (peak, retained, views),
    ``failed`` the tests among them that failed tfmem checks to those checks (``budget, leak``),
    ``unconfirmed`` those whose figure departed and was not measured again to why it departed."""
    return Entry(
        commit.commit, commit.parent, commit.branch, commit.date, environment,
        recorded=datetime.now(timezone.utc).isoformat(timespec="seconds"), dirty=commit.dirty,
        tests={nodeid: [[0, peak, retained, *([views] if views else [])]]
               for nodeid, (peak, retained, views) in figures.items()},
        sessions=[session],
        failed={nodeid: [[0, checks]] for nodeid, checks in (failed or {}).items()},
        unconfirmed={nodeid: [[0, why]] for nodeid, why in (unconfirmed or {}).items()},
    )


def append_entry(path: Path, entry: Entry) -> None:
    """Add ``entry`` as one line, in one write, under the directory's lock; an existing file that
    is not a history is refused (``HistoryError``), and is left as it was."""
    platform = platforms.current()
    line = entry.to_line().encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with platform.lock(path.parent):
        if path.exists() and path.stat().st_size and not is_history(path):
            raise HistoryError(path, "exists and is not a pytest-tfmem history; it was left unchanged")
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            size = os.fstat(descriptor).st_size
            if size:
                os.lseek(descriptor, size - 1, os.SEEK_SET)  # a read's place: an append still goes to the end
                if os.read(descriptor, 1) != b"\n":
                    line = b"\n" + line  # the last line was cut short (a kill): this one starts on its own
            os.write(descriptor, line)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


class BadLine(Exception):
    """A line of a history that cannot be read: why (the reader adds its file and line)."""


def _entry(data: Any) -> Entry:
    """One line's entry, its fields checked; ``BadLine`` says why it cannot be read."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BadLine(f'not a pytest-tfmem history line (expected a JSON object with "format": "{FORMAT}")')
    version = data.get("version")
    if version != VERSION:
        if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
            raise BadLine(f"written in history format version {version} by a newer pytest-tfmem (this one reads "
                          f"version {VERSION}): upgrade to read it")
        raise BadLine(f"history format version {version!r} is not one this pytest-tfmem reads (version {VERSION})")
    try:
        sessions = [str(session) for session in data["sessions"]]
        tests = data["tests"]
        count = len(sessions)
        # each test's first sample checked in full (the rest as they are read: ``_figure``)
        well_formed = isinstance(tests, dict) and all(
            type(samples) is list and samples and type(sample := samples[0]) is list and 3 <= len(sample) <= 4
            and type(sample[0]) is int and 0 <= sample[0] < count and type(sample[PEAK]) is int
            and (sample[RETAINED] is None or type(sample[RETAINED]) is int)
            and (len(sample) == 3 or type(sample[VIEWS]) is dict)
            for samples in tests.values()
        )
        if not well_formed:
            raise ValueError("a test's samples are not [session, peak, retained(, views)] of whole numbers")
        failed, unconfirmed = data.get("failed", {}), data.get("unconfirmed", {})
        for name, marks, what in (("failed", failed, "checks"), ("unconfirmed", unconfirmed, "why")):
            if not isinstance(marks, dict) or not all(
                type(samples) is list and all(type(mark) is list and len(mark) == 2 for mark in samples)
                for samples in marks.values()
            ):
                raise ValueError(f'"{name}" is not {{node id: [[session, {what}], ...]}}')
        return Entry(str(data["commit"]), data.get("parent"), data.get("branch"), str(data.get("date", "")),
                     dict(data["environment"]), str(data.get("recorded", "")), bool(data.get("dirty", False)),
                     tests, sessions, failed, unconfirmed)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise BadLine(f"a field is missing or of the wrong type ({type(error).__name__}: {error})") from None


def read_lines(path: Path, skipped: list[str], last: int | None = None) -> Iterator[Entry]:
    """Every good line's entry (only the last ``last`` lines', where given: a gate looks back over
    a few commits, whatever the history's length), in the file's order; each line that cannot be
    read is added to ``skipped`` as ``PATH:LINE: why`` and read no further (a line cut short by a
    kill says so). A missing or unreadable file is a ``HistoryError``."""
    try:
        stream = open(path, "rb")  # noqa: SIM115 - the lines are yielded from inside its block below
    except FileNotFoundError:
        raise HistoryError(path, "no such file (record one with pytest --tfmem-history=PATH)") from None
    except OSError as error:
        raise HistoryError(path, f"cannot be read ({error.strerror or error})") from None
    with stream:
        start = _start_of_last_lines(stream, last) if last else 0
        stream.seek(start)
        offset = start
        for line in stream:
            where, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                text = line.rstrip(b"\r\n")
                try:
                    data = json.loads(text)
                except ValueError as error:
                    # the start of a line of ours that is not JSON: a session writes a line whole, so this
                    # one ends where the session writing it was killed
                    cut = " (cut short: the session that wrote it was killed?)" if text.startswith(_LINE_START) else ""
                    raise BadLine(f"not valid JSON ({error}){cut}") from None
                yield _entry(data)
            except BadLine as bad:
                skipped.append(f"{path}:{_line_number(path, where)}: {bad}")


def _start_of_last_lines(stream: BinaryIO, count: int, block: int = 2**20) -> int:
    """Where the last ``count`` lines of the file begin (a trailing newline ends the last one)."""
    end = stream.seek(0, os.SEEK_END)
    position, found = end, 0
    while position > 0:
        size = min(block, position)
        position -= size
        stream.seek(position)
        chunk = stream.read(size)
        if position + size == end and chunk.endswith(b"\n"):
            chunk = chunk[:-1]
        index = len(chunk)
        while True:
            index = chunk.rfind(b"\n", 0, index)
            if index < 0:
                break
            found += 1
            if found == count:
                return position + index + 1
    return 0


def _line_number(path: Path, offset: int) -> int:
    """The number of the line at ``offset`` (bytes): read only to name a bad line."""
    with open(path, "rb") as stream:
        return stream.read(offset).count(b"\n") + 1


def fold(entries: Iterable[Entry]) -> list[Entry]:
    """One entry per commit and environment, oldest commit first (by the commit's date, then by
    when it was recorded)."""
    folded: dict[tuple[str, str], Entry] = {}
    for entry in entries:
        known = folded.get(entry.key)
        if known is None:
            folded[entry.key] = entry  # read from a file of its own: no other holds it
        else:
            known.add(entry)
    return sorted(folded.values(), key=lambda entry: (entry.date, entry.recorded))


@dataclass(frozen=True)
class HistoryRead:
    """What one or more history files hold: their folded entries, and the lines skipped
    (``PATH:LINE: why``, one each), which every reader names."""

    entries: list[Entry]
    skipped: list[str]


def read_history(*paths: Path, last: int | None = None) -> HistoryRead:
    """The folded entries of one or more history files (of their last ``last`` lines, where
    given), and the lines skipped; ``HistoryError`` where a file is missing or unreadable, or no
    file holds a good line."""
    skipped: list[str] = []
    entries = fold(entry for path in paths for entry in read_lines(path, skipped, last))
    if not entries:
        why = f": every line was skipped ({skipped[0]}{' ...' if len(skipped) > 1 else ''})" if skipped else ""
        raise HistoryError(", ".join(map(str, paths)), f"holds no entry this pytest-tfmem can read{why}")
    return HistoryRead(entries, skipped)


@dataclass(frozen=True)
class Series:
    """One test's points in one environment, oldest first."""

    nodeid: str
    environment: dict[str, Any]
    points: tuple[Point, ...]


def series(
    entries: Iterable[Entry], quantity: str = "peak", nodeids: Iterable[str] | None = None
) -> dict[str, list[Series]]:
    """Each test's series (those of ``nodeids`` only, where given), by environment
    (``series_key``): ``quantity`` is ``peak``, ``retained`` or a view's name."""
    by_key: dict[str, list[Entry]] = {}
    for entry in entries:
        by_key.setdefault(series_key(entry.environment), []).append(entry)
    found: dict[str, list[Series]] = {}
    for group in by_key.values():
        wanted = sorted({nodeid for entry in group for nodeid in entry.tests}) if nodeids is None else list(nodeids)
        for nodeid in wanted:
            one = series_of(group, nodeid, quantity)
            if one is not None:
                found.setdefault(nodeid, []).append(one)
    return found


def series_of(group: list[Entry], nodeid: str, quantity: str = "peak") -> Series | None:
    """One test's series in ``group`` (entries of one environment, oldest first); ``None`` where
    it has no figure of ``quantity``."""
    points = []
    for entry in group:
        unconfirmed = {mark[0] for mark in entry.unconfirmed.get(nodeid, ())}
        samples = (sample for sample in entry.tests.get(nodeid, ()) if sample[0] not in unconfirmed)
        figures = (_figure(sample, quantity) for sample in samples)
        values = tuple(value for value in figures if value is not None)
        if values:
            points.append(Point(entry.commit, entry.parent, values, entry.date, entry.failures(nodeid)))
    return Series(nodeid, group[-1].environment, tuple(points)) if points else None


def _figure(sample: RawSample, quantity: str) -> int | None:
    """The sample's figure of ``quantity``; ``None`` where it has none (or is not a sample)."""
    try:
        if quantity == "peak":
            return int(sample[PEAK])
        if quantity == "retained":
            return None if sample[RETAINED] is None else int(sample[RETAINED])
        return int(sample[VIEWS][quantity]) if len(sample) > VIEWS and quantity in sample[VIEWS] else None
    except (TypeError, ValueError, IndexError, KeyError):
        return None
