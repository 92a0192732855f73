"""Merge the reports (or baselines) of a suite's shards into one baseline (``tfmem merge``).

Each input gives its tests' baseline entries: a baseline file its entries, a JSON report the
entries of its passed, measured tests (what ``--tfmem-save-baseline`` would have saved from that
session). A test found in several inputs with the same figures is taken once; with different
figures it is a ``MergeConflict`` unless a rule of ``PREFER_RULES`` says which input wins, or,
``spread``, that the inputs are runs of the same code: the test's entry is then their medians with
their spread, which the gates read as the test's noise.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_tfmem.files import FileFormatError
from pytest_tfmem.gates import baseline as baselines, reports
from pytest_tfmem.gates.baseline import SPREAD_FIGURES, Baseline, BaselineEntry, Spread
from pytest_tfmem.gates.environment import environment_differences
from pytest_tfmem.units import format_size

# Which input wins a test that several measured differently: the first or last named on the
# command line, or the one with the highest or lowest peak; or ``spread``: every input's figures,
# as runs of the same code.
PREFER_RULES = ("first", "last", "max", "min", "spread")


@dataclass(frozen=True)
class Shard:
    """What one input file holds for the merged baseline."""

    path: str
    kind: str  # "baseline" or "report"
    tests: dict[str, BaselineEntry]
    environment: dict[str, Any]
    left_out: int = 0  # a report's measured tests that did not pass (a baseline keeps no such test)


@dataclass(frozen=True)
class Conflict:
    """One test that two or more inputs measured with different figures."""

    nodeid: str
    figures: tuple[tuple[str, BaselineEntry], ...]  # (input path, its entry), in input order

    def describe(self) -> str:
        shown = ", ".join(f"{path} (peak {format_size(entry.peak)})" for path, entry in self.figures)
        return f"{self.nodeid}: {shown}"


class MergeConflict(Exception):
    """Tests measured differently by several inputs, and no rule said which wins."""

    def __init__(self, conflicts: Sequence[Conflict]) -> None:
        self.conflicts = list(conflicts)
        lines = [c.describe() for c in self.conflicts[:10]]
        if len(self.conflicts) > 10:
            lines.append(f"... and {len(self.conflicts) - 10} more")
        super().__init__(
            f"{len(self.conflicts)} test(s) have different figures in several inputs; say which wins with "
            f"--prefer={'|'.join(PREFER_RULES)}:\n  " + "\n  ".join(lines)
        )


@dataclass
class Merged:
    """The merged baseline, and what went into it."""

    baseline: Baseline
    shards: list[Shard]
    conflicts: list[Conflict] = field(default_factory=list)  # resolved by the prefer rule
    environment_notes: list[str] = field(default_factory=list)


def read_shard(path: str | Path) -> Shard:
    """One input, a baseline or a report (told apart by its ``"format"``); a bad file raises
    ``FileFormatError`` naming the file and the problem."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        kind = data.get("format") if isinstance(data, dict) else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        kind = None  # load_report says what is wrong with it
    if kind == baselines.FORMAT.name:
        baseline = baselines.load_baseline(path)
        return Shard(str(path), "baseline", baseline.tests, baseline.environment)
    if kind is not None and kind != reports.FORMAT.name:
        raise FileFormatError(path, f'neither a pytest-tfmem report nor a baseline (its "format" is {kind!r})')
    report = reports.load_report(path)
    measured = [record for record in report.tests if record.measurement is not None]
    passed = {record.nodeid: BaselineEntry.from_record(record) for record in measured if record.outcome == "passed"}
    return Shard(str(path), "report", passed, report.environment, left_out=len(measured) - len(passed))


def merge_shards(shards: Sequence[Shard], prefer: str | None = None) -> Merged:
    """One baseline from every shard's entries; raises ``MergeConflict`` for a test measured
    differently by several shards when ``prefer`` (one of ``PREFER_RULES``) is not given."""
    found: dict[str, list[tuple[str, BaselineEntry]]] = {}
    for shard in shards:
        for nodeid, entry in shard.tests.items():
            found.setdefault(nodeid, []).append((shard.path, entry))
    conflicts = [
        Conflict(nodeid, tuple(figures))
        for nodeid, figures in found.items()
        if any(entry != figures[0][1] for _, entry in figures)
    ]
    if conflicts and prefer is None:
        raise MergeConflict(conflicts)
    tests = {nodeid: _winner(figures, prefer) for nodeid, figures in sorted(found.items())}
    if prefer == "spread":
        conflicts = []  # nothing was chosen over anything: every figure is in the spread
    environment = next((shard.environment for shard in shards if shard.environment), {})
    notes = []
    for shard in shards:
        differences = environment_differences(environment, shard.environment, current_label=f"in {shard.path}")
        if differences:
            notes.append(f"{shard.path} was recorded in a different environment: " + "; ".join(differences))
    baseline = Baseline(tests, environment, saved=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    return Merged(baseline, list(shards), conflicts, notes)


def _winner(figures: list[tuple[str, BaselineEntry]], prefer: str | None) -> BaselineEntry:
    entries = [entry for _, entry in figures]
    if prefer == "spread" and len(entries) > 1:
        return combined(entries)
    if prefer == "last":
        return entries[-1]
    if prefer == "max":
        return max(entries, key=lambda entry: entry.peak)
    if prefer == "min":
        return min(entries, key=lambda entry: entry.peak)
    return entries[0]  # "first", or the figures all agree


def combined(entries: Sequence[BaselineEntry]) -> BaselineEntry:
    """Several runs' entries of one test as one: the median peak's entry (its views and leak
    slope), the median retained figure, and every run's lowest and highest figure as the spread
    (an entry that has a spread already brings its runs and bounds)."""
    by_peak = sorted(entries, key=lambda entry: entry.peak)
    middle = by_peak[(len(by_peak) - 1) // 2]
    runs = sum(entry.spread.runs if entry.spread is not None else 1 for entry in entries)
    figures = {}
    for name in SPREAD_FIGURES:
        bounds = [entry.bounds(name) or ((value, value) if (value := _figure(entry, name)) is not None else None)
                  for entry in entries]
        known = [bound for bound in bounds if bound is not None]
        if known:
            figures[name] = (min(low for low, _ in known), max(high for _, high in known))
    retained = [entry.retained for entry in entries if entry.retained is not None]
    return BaselineEntry(
        peak=middle.peak,
        views=dict(middle.views),
        leak_slope=middle.leak_slope,
        retained=int(statistics.median_low(retained)) if retained else None,
        spread=Spread(runs, figures),
    )


def _figure(entry: BaselineEntry, name: str) -> int | None:
    return entry.peak if name == "peak" else entry.retained
