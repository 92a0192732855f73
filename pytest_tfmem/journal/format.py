"""The results journal's file: where it is, what its lines hold, how to read it back.

One JSON object per line, in the order things happened:

- ``session``: the first line; the session's id, pid, start time, rootdir and arguments;
- ``start``: a test began (with the process tree's RSS at that moment);
- ``reading``: the running test's process tree RSS now and its sampled peak so far, every
  second, and at once when the peak has grown by 10% (at least 16 MiB) since the last
  reading written;
- ``finish``: a test ended: outcome, duration, the failure's first line, its tfmem record;
- ``end``: the session ended, with its exit status.

Every line but the first carries the session's id and the time; lines of pytest-xdist workers
carry the worker's id. Written by ``journal.plugin``, read by ``journal.reader`` (``tfmem
last``) and by the pytest-xdist controller for a crashed worker's test (``workers.crash``);
this module knows nothing of pytest's hooks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_tfmem.core import settings
from pytest_tfmem.files import DIRECTORY

DEFAULT_PATH = Path(DIRECTORY) / "results.jsonl"  # under the rootdir
SAMPLE_INTERVAL_S = 0.1  # how often the running test's process tree is read

RESULTS = settings.Option(
    "results",
    "the crash-safe results journal, written as tests run (default .tfmem/results.jsonl in the "
    "rootdir); `tfmem last` reads it",
    settings.parse_path,
)


def results_path(config: pytest.Config) -> tuple[Path, bool]:
    """This session's journal and whether ``--tfmem-results`` (or its ini value) chose it."""
    path, given = settings.read_option(config, RESULTS)
    return path or config.rootpath / DEFAULT_PATH, given


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
