"""Typed values one feature hands another through the test record.

A feature that writes a section of ``TestRecord.extra`` another feature reads describes the
part that is read as a frozen dataclass here: the writer puts it on the record with
``put_on`` (its fields become keys of the section, so the record's JSON is what the section
always held), the reader takes it back with ``of``. A renamed field is then a type error in
both, not a key one of them silently misses.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.files import write_text_atomic

# In an item's stash while TensorFlow's profiler runs over the test's current run (its own run or
# its re-run): what the profile is for ("TensorBoard trace"). TensorFlow runs one profiler at a
# time: a feature that would profile the same run reads the other one's trace instead.
PROFILER_IN_USE = pytest.StashKey[str]()
TRACE_SUMMARY = "summary.json"  # in a trace directory: what the trace wrote, and the analyses' sections


@dataclass(frozen=True)
class TraceHandoff:
    """The trace written for a test (by the trace feature), for features that analyse it."""

    SECTION: ClassVar[str] = "trace"

    directory: str  # absolute
    shown_directory: str  # as the terminal shows it (relative to the rootdir where it is below it)
    traced: str  # "rerun": the re-run after the failure; "run": the test's own run
    profiler_files: tuple[str, ...]  # TensorFlow profiler files, relative to ``directory``

    def fields(self) -> dict[str, Any]:
        """The keys this hand-off contributes to the record's section."""
        return {**asdict(self), "profiler_files": list(self.profiler_files)}

    @classmethod
    def of(cls, record: TestRecord) -> TraceHandoff | None:
        section = record.extra.get(cls.SECTION)
        if not isinstance(section, dict):
            return None
        return cls(
            directory=section["directory"],
            shown_directory=section["shown_directory"],
            traced=section["traced"],
            profiler_files=tuple(section["profiler_files"]),
        )

    def add_to_summary(self, key: str, value: Any) -> None:
        """Add a section to the trace's ``summary.json`` (an analysis of the trace)."""
        path = Path(self.directory) / TRACE_SUMMARY
        summary = json.loads(path.read_text(encoding="utf-8"))
        summary[key] = value
        write_text_atomic(path, json.dumps(summary, indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class LeakHandoff:
    """The largest growth a test's leak checks measured (by the leaks feature), for the baseline."""

    SECTION: ClassVar[str] = "leak"

    growth_per_iteration: float  # bytes per iteration, the Theil-Sen slope of the view that grew most

    def fields(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, record: TestRecord) -> LeakHandoff | None:
        section = record.extra.get(cls.SECTION)
        slope = section.get("growth_per_iteration") if isinstance(section, dict) else None
        if not isinstance(slope, (int, float)) or isinstance(slope, bool):
            return None
        return cls(float(slope))


def put_on(record: TestRecord, handoff: TraceHandoff | LeakHandoff, rest: dict[str, Any]) -> None:
    """Write the feature's section of ``record.extra``: ``rest`` (what only the feature reads)
    with the hand-off's fields."""
    record.extra[handoff.SECTION] = {**rest, **handoff.fields()}
