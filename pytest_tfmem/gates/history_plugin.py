"""The memory history in a pytest session: ``--tfmem-history=PATH`` records, ``--tfmem-history-gate``
holds each test to its best level in it, and the Markdown summary draws the tests that moved.

Recording costs the session one line appended at its end (nothing is read). The gate, and the
Markdown's sparklines, read the history once, for this session's environment only.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import pytest

from pytest_tfmem.core import processes, settings
from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.core.verdict import Verdict
from pytest_tfmem.files import set_aside
from pytest_tfmem.gates.baseline import compared_quantities
from pytest_tfmem.gates.environment import current_environment
from pytest_tfmem.gates.history import (
    OUTPUT,
    Commit,
    HistoryError,
    Series,
    append_entry,
    current_commit,
    read_history,
    series,
    series_key,
    session_entry,
)
from pytest_tfmem.gates.history_page import sparkline
from pytest_tfmem.gates.steps import NOISE_FACTOR, Point, creep, gate, level, noise, short, steps, threshold
from pytest_tfmem.units import DEFAULT_MIN_STEP, TOLERANCE_FORMS, Tolerance, format_size, parse_tolerance

HISTORY = settings.Option(
    "history",
    "append this session's figures (the peak, retained and GPU views of each test measured to its end: "
    "passed, or failed a tfmem check) to this memory "
    "history: one line per session, keyed by its git commit and environment; `tfmem history PATH` "
    "names the steps and the creep",
    settings.parse_path,
)
HISTORY_GATE = settings.Option(
    "history_gate",
    "fail a test whose peak exceeds its best level in --tfmem-history (since its last step) by more "
    f"than TOL ({TOLERANCE_FORMS}), and by more than the series' noise and {DEFAULT_MIN_STEP}; off by default",
    parse_tolerance,
)
HISTORY_WINDOW = settings.Option(
    "history_window",
    "how many of the history's commits the gate and the Markdown summary look back over (default 50)",
    settings.parse_positive_int,
    50,
)
OPTIONS = [HISTORY, HISTORY_GATE, HISTORY_WINDOW]
CHECK = "history"
# A test moved, in the Markdown's history rows, when its figure now is this far from the level
# before (beyond the environment's noise too): the steps' own threshold (``tfmem history --min-step``).
MIN_STEP = parse_tolerance(DEFAULT_MIN_STEP)
SPARK_POINTS = 20
# Lines read back per commit of the window: a commit measured by several shards, or again, has more.
LINES_PER_COMMIT = 4
# A test's recent level, which a figure must not leave unconfirmed: the level of its last commits.
LEVEL_POINTS = 3


class MemoryHistory:
    """The session's history: where it is recorded, the gate, and what the Markdown draws."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.path = settings.read_output_option(config, HISTORY, OUTPUT)
        self.gate: Tolerance | None = settings.read_option(config, HISTORY_GATE)[0]
        self.window: int = settings.read_option(config, HISTORY_WINDOW)[0]
        if self.gate is not None and self.path is None:
            raise pytest.UsageError(f"pytest-tfmem: {HISTORY_GATE.cli} needs {HISTORY.cli}=PATH: the history to "
                                    "hold the tests to")
        self.commit: Commit | None = None
        if self.path is not None:
            try:
                self.commit = current_commit(config.rootpath)
            except HistoryError as error:
                raise pytest.UsageError(f"pytest-tfmem: {HISTORY.cli}: {error}") from None
        self.outcome_lines: list[tuple[str, dict[str, bool]]] = []
        self._past: dict[str, Series] | None = None

    @property
    def active(self) -> bool:
        return self.path is not None

    def past(self) -> dict[str, Series]:
        """Each test's series in this session's environment, as the file holds it (read once, on the
        first call): the good lines of the window (each line skipped is said once, at the end);
        nothing where the file is missing, and nothing, said once, where it cannot be read at all."""
        if self._past is None:
            self._past = self._read_past()
        return self._past

    def _read_past(self) -> dict[str, Series]:
        if self.path is None or not self.path.exists():
            return {}
        try:  # the window's commits only (a commit may have a line for each shard): the file's length costs nothing
            read = read_history(self.path, last=self.window * LINES_PER_COMMIT)
        except HistoryError as error:
            if self.gate is not None:
                self.outcome_lines.append((f"history gate: not applied, no test held to the history: {error}",
                                           {"yellow": True}))
            return {}
        self.outcome_lines += [(f"history: line skipped: {line}", {"yellow": True}) for line in read.skipped]
        here = series_key(current_environment())
        found: dict[str, Series] = {}
        for nodeid, per_environment in series(read.entries).items():
            for one in per_environment:
                if series_key(one.environment) == here:
                    found[nodeid] = Series(nodeid, one.environment, one.points[-self.window :])
        return found

    def _points_with_now(self, record: TestRecord) -> list[Point] | None:
        """The test's points in the history, then this commit's peak; None where either is missing."""
        past = self.past().get(record.nodeid)
        if past is None or record.measurement is None or self.commit is None:
            return None
        return [*past.points, Point(self.commit.commit, self.commit.parent, (record.measurement.peak,))]

    def pytest_tfmem_measure_all(self) -> bool:
        return self.active

    @pytest.hookimpl
    def pytest_tfmem_check(self, item: pytest.Item, record: TestRecord) -> Verdict | None:
        """``--tfmem-history-gate``: the test's peak against its best level in the history since its
        last step (``steps.creep_since_last_step``), beyond the tolerance and the series' noise."""
        if self.gate is None or record.measurement is None:
            return None
        points = self._points_with_now(record)
        if points is None:
            return None
        gated = gate(points, self.gate, MIN_STEP)
        if gated is None:
            return None
        found, allowance = gated
        limit = str(self.gate)
        if allowance > self.gate.allowance(int(found.best)):  # a step's size decides, not the gate's tolerance
            floor = allowance <= MIN_STEP.allowance(int(found.best))
            why = f"the history's floor, {MIN_STEP}" if floor else f"{NOISE_FACTOR:g} times the series' noise"
            limit += f", and at least {format_size(int(allowance))}, {why}"
        message = (
            f"peak {format_size(record.measurement.peak)} vs its best level in the memory history, "
            f"{found.describe_best()} ({found.share or 0:+.1%}, {'>' if found.change > allowance else '<='} {limit})"
        )
        # a rise inside the noise names no commit: the gate's floor is what a commit must add to count
        noise_floor = found.allowance(MIN_STEP)
        beyond = [f"{short(commit)} (+{share:.1%})" for commit, size, share in found.rises if size > noise_floor]
        if beyond:
            message += f": it rose most at {', '.join(beyond[:3])}"
        elif found.rises:
            message += f": no single commit added more than the noise ({format_size(int(noise_floor))})"
        return Verdict(CHECK, found.change <= allowance, message)

    @pytest.hookimpl
    def pytest_tfmem_departure(self, item: pytest.Item, record: TestRecord) -> str | None:
        """A peak that would enter the test's levels unconfirmed is measured again before it is
        recorded, so that no level rests on a reading that paid one-time costs of the process: one
        above the test's recent level (``steps.level`` of its last ``LEVEL_POINTS`` commits) by more
        than a step (the series' noise, the floor), and a first record above the floor (a test new
        to the history, which has no level yet)."""
        if not self.active or record.measurement is None or self.commit is None:
            return None
        past = self.past().get(record.nodeid)
        peak = record.measurement.peak
        if past is None or not past.points:
            if peak <= MIN_STEP.allowance(0):
                return None
            return f"{format_size(peak)}, its first figure in the memory history"
        recent = level(past.points[-LEVEL_POINTS:]).value
        if peak - recent <= threshold(recent, noise(past.points), MIN_STEP):
            return None
        return f"{format_size(peak)} above its level in the memory history, {format_size(int(recent))}"

    def record(self, session: pytest.Session, records: Iterable[TestRecord], *, finished: bool) -> None:
        """Append this session's line: every test measured to its end (``measured_to_the_end``:
        passed, or failed tfmem's checks, which the line names); nothing for a run that did not finish."""
        assert self.path is not None and self.commit is not None
        if not finished:
            self.outcome_lines.append((f"history: nothing added to {self.path}: the run did not finish",
                                       {"yellow": True}))
            return
        figures, failed, unconfirmed, cut_short = {}, {}, {}, collections.Counter[str]()
        for record in records:
            if record.measurement is None:
                continue
            if not record.measured_to_the_end:
                raised = f"{record.raised or 'an exception'} raised"
                cut_short["skipped" if record.outcome == "skipped" else raised] += 1
                continue
            quantities = compared_quantities(record.measurement)
            retained = record.retained.bytes if record.retained is not None else None
            figures[record.nodeid] = (quantities.pop("peak"), retained, quantities)
            if record.outcome == "failed":
                failed[record.nodeid] = ", ".join(record.failed_checks)
            if record.unconfirmed:
                unconfirmed[record.nodeid] = record.unconfirmed
        entry = session_entry(self.commit, current_environment(), processes.session(self.config).id, figures, failed,
                              unconfirmed)
        try:
            append_entry(self.path, entry)
        except (OSError, HistoryError) as error:
            message = f"could not add to the memory history {self.path}: {error}"
            # the session's figures are never lost
            message += set_aside(self.config.rootpath, self.path, lambda instead: append_entry(instead, entry),
                                 kept=" (tfmem merge folds it into the history)")
            self.outcome_lines.append((message, {"red": True}))
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return
        dirty = " (uncommitted changes)" if self.commit.dirty else ""
        failing = f" ({len(failed)} failing a tfmem check)" if failed else ""
        line = f"history: {len(figures)} test(s) of commit {short(self.commit.commit)}{dirty}{failing} added to "
        line += str(self.path)
        if cut_short:
            why = ", ".join(f"{count} {reason}" for reason, count in sorted(cut_short.items()))
            line += f"; {sum(cut_short.values())} left out, their runs cut short ({why})"
        self.outcome_lines.append((line, {}))

    def markdown_lines(self, records: Iterable[TestRecord]) -> list[str]:
        """Rows for the Markdown summary: each test whose figure now moved from its level before, or
        crept beyond the steps' threshold since its best, drawn over its last commits."""
        if self.path is None or self.commit is None:
            return []
        rows = []
        for record in records:
            points = self._points_with_now(record)
            if points is None:
                continue
            assert record.measurement is not None
            found = creep(points)
            moved = found is not None and found.notable(MIN_STEP)
            if not moved and not steps(points[-3:], MIN_STEP):
                continue
            drawn = sparkline([point.value for point in points[-SPARK_POINTS:]])
            since = found.describe() if found is not None else ""
            rows.append(f"| `{record.nodeid}` | {drawn} | {format_size(record.measurement.peak)} | {since} |")
        if not rows:
            return []
        return ["Memory history: tests that moved (their last commits, this one last):", "",
                "| test | history | now | since its best |", "|---|---|---:|---|", *rows, ""]
