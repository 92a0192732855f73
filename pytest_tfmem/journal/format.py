"""The results journal's file: where it is, what its lines hold, how to read it back.

One JSON object per line, in the order things happened:

- ``session``: the first line; the session's id, pid, start time, rootdir and arguments;
- ``start``: a test began (with the process tree's RSS at that moment);
- ``reading``: the running test's process tree RSS now and its sampled peak so far, every
  second, and at once when the peak has grown by 10% (at least 16 MiB) since the last
  reading written;
- ``finish``: a test ended: outcome, duration, the failure's first line, its tfmem record; a
  test that passed within every limit gets a short line: its outcome, duration and peak;
- ``end``: the session ended, with its exit status.

Every line but the first carries the session's id and the time; lines of pytest-xdist workers
carry the worker's id. Written by ``journal.plugin``, read by ``journal.reader`` (``tfmem
last``) and by the pytest-xdist controller for a crashed worker's test (``workers.crash``);
this module knows nothing of pytest's hooks. ``tfmem run`` writes the same entries for a
script (its header says ``"kind": "run"``), so ``tfmem last`` tells a killed run's story too.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_tfmem import files, platforms
from pytest_tfmem.core import settings
from pytest_tfmem.files import DIRECTORY

if TYPE_CHECKING:  # pytest is imported only where pytest runs: ``tfmem`` commands start without it
    import pytest

DEFAULT_PATH = Path(DIRECTORY) / "results.jsonl"  # under the rootdir
SAMPLE_INTERVAL_S = 0.1  # how often the running test's process tree is read
SYNC_INTERVAL_S = 1.0
WRITE_INTERVAL_S = 1.0
# A sampled peak this much above the last one written is written at once.
GROWTH_TO_WRITE = 0.10
GROWTH_TO_WRITE_BYTES = 16 * 2**20

RESULTS = settings.Option(
    "results",
    "the crash-safe results journal, written as tests run (default .tfmem/results.jsonl in the "
    "rootdir); `tfmem last` reads it",
    settings.parse_path,
)


def _starts_a_journal(line: str) -> bool:
    try:
        entry = json.loads(line)
    except ValueError:
        return False
    return isinstance(entry, dict) and entry.get("event") == "session"


OUTPUT = files.Output("results journal", files.first_line(_starts_a_journal))


def results_path(config: pytest.Config) -> tuple[Path, bool]:
    """This session's journal and whether ``--tfmem-results`` (or its ini value) chose it."""
    path = settings.read_output_option(config, RESULTS, OUTPUT)
    return path or config.rootpath / DEFAULT_PATH, path is not None


def previous_path(path: Path) -> Path:
    """Where the previous session's journal is kept: ``results.previous.jsonl``."""
    return path.with_name(f"{path.stem}.previous{path.suffix}")


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


def reading_due(peak: int, written_peak: int, since_written_s: float) -> bool:
    """Whether a ``reading`` is to be written now: a second since the last one, or the peak has
    grown by 10% (at least 16 MiB) since the last one written."""
    grown = peak - written_peak > max(GROWTH_TO_WRITE * written_peak, GROWTH_TO_WRITE_BYTES)
    return grown or since_written_s >= WRITE_INTERVAL_S


def first_entry(path: Path) -> dict[str, Any]:
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
        self._synced = float("-inf")
        self._platform = platforms.current()

    def open(self) -> None:
        files.make_directory(self.path.parent)
        with platforms.current().lock(self.path.parent):
            if first_entry(self.path).get("session") != self.header["session"]:
                if self.path.exists():
                    os.replace(self.path, previous_path(self.path))
                files.write_text_atomic(self.path, json.dumps(self.header) + "\n")
            self._descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND)

    def append(self, entry: dict[str, Any], *, sync: bool = False) -> None:
        """Append one line; with ``sync``, also flush it to disk if the last sync is a second old."""
        if self._descriptor is None:
            return
        entry = {"session": self.header["session"], "time": round(time.time(), 3), **entry}
        line = (json.dumps(entry) + "\n").encode()
        if self._platform.appends_whole_lines:
            os.write(self._descriptor, line)
        else:  # Windows: an append seeks to the end, then writes: other writers wait meanwhile
            with self._platform.lock(self.path.parent):
                os.write(self._descriptor, line)
        if sync and time.monotonic() - self._synced >= SYNC_INTERVAL_S:
            os.fsync(self._descriptor)
            self._synced = time.monotonic()

    def close(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None
