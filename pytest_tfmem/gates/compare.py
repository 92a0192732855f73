"""Compare a test's figures with its baseline entry: regression, improvement, within tolerance, new.

Where the entry was measured more than once it keeps its spread (``BaselineEntry.spread``): a
figure inside the lowest and highest its runs read is never a regression or an improvement,
whatever the tolerance; beyond it, the tolerance counts from the runs' median as before.

Pure functions shared by the pytest check and the ``tfmem compare`` command.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pytest_tfmem.core.measure import Measurement
from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.core.verdict import Verdict
from pytest_tfmem.gates.baseline import BaselineEntry, compared_quantities
from pytest_tfmem.units import Tolerance, format_size, parse_tolerance

SECTION = "baseline"  # key of the comparison in ``TestRecord.extra``
RETAINED = "retained"  # the quantity of what a test left behind
# What a test leaves behind moves by a few pages from run to run (the allocator's own state,
# pytest's reports): whatever the tolerance, a retained figure may move this much.
RETAINED_NOISE = 4 * 2**20
REGRESSION = "regression"
IMPROVEMENT = "improvement"
WITHIN = "within tolerance"
NEW = "not in baseline"
# Most telling first: a test's overall status is the first of these among its quantities.
STATUS_ORDER = (REGRESSION, IMPROVEMENT, NEW, WITHIN)


@dataclass(frozen=True)
class Comparison:
    """One quantity of one test (``peak``, or a GPU view such as ``tf:GPU:0`` or ``jax:gpu:0``)
    against its baseline."""

    nodeid: str
    quantity: str
    current: int
    baseline: int | None
    tolerance: Tolerance
    spread: tuple[int, int] | None = None  # the lowest and highest of the baseline's runs, where it kept them

    @property
    def change(self) -> int | None:
        return None if self.baseline is None else self.current - self.baseline

    @property
    def change_percent(self) -> float | None:
        if self.baseline is None or self.baseline == 0:
            return None
        return 100 * (self.current - self.baseline) / self.baseline

    @property
    def allowance(self) -> float | None:
        if self.baseline is None:
            return None
        allowance = self.tolerance.allowance(self.baseline)
        return max(allowance, RETAINED_NOISE) if self.quantity == RETAINED else allowance

    @property
    def status(self) -> str:
        if self.baseline is None:
            return NEW
        assert self.change is not None and self.allowance is not None
        if self.change > self.allowance and (self.spread is None or self.current > self.spread[1]):
            return REGRESSION
        if -self.change > self.allowance and (self.spread is None or self.current < self.spread[0]):
            return IMPROVEMENT
        return WITHIN

    @property
    def inside_spread(self) -> bool:
        """Beyond the tolerance, but inside the baseline runs' spread: their noise, not a change."""
        if self.spread is None or self.change is None or self.allowance is None:
            return False
        return abs(self.change) > self.allowance and self.spread[0] <= self.current <= self.spread[1]

    @property
    def label(self) -> str:
        if self.quantity in ("peak", RETAINED):
            return self.quantity
        return f"{self.quantity.split(':', 1)[-1]} peak"  # tf:GPU:0 -> GPU:0 peak

    def describe_change(self) -> str:
        """``+26.9%`` for a percentage tolerance, ``+172.0 MiB`` for a size, both for both."""
        assert self.change is not None
        percent = self.change_percent
        parts = []
        if self.tolerance.fraction is not None or self.tolerance.size is None:
            parts.append("baseline 0" if percent is None else f"{percent:+.1f}%")
        if self.tolerance.size is not None or percent is None:
            parts.append(format_size(self.change, signed=True))
        return ", ".join(parts)

    def message(self) -> str:
        """``peak 812.0 MiB vs baseline 640.0 MiB (+26.9% > 10%)``."""
        if self.baseline is None:
            return f"{self.label} {format_size(self.current)}: no baseline entry, not compared"
        change = self.describe_change()
        outcome = {
            REGRESSION: f"{change} > {self.tolerance}",
            IMPROVEMENT: f"{change}, more than {self.tolerance} below",
        }.get(self.status, f"{change}, within {self.tolerance}")
        runs = f"{format_size(self.spread[0])} - {format_size(self.spread[1])}" if self.spread is not None else ""
        if self.inside_spread:
            outcome = f"{change}, inside the spread of its runs, {runs}"
        elif runs and self.status != WITHIN:
            outcome += f"; its runs read {runs}"
        return f"{self.label} {format_size(self.current)} vs baseline {format_size(self.baseline)} ({outcome})"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"current": self.current, "baseline": self.baseline, "status": self.status}
        if self.spread is not None:
            data["spread"] = list(self.spread)
        return data


def compare(
    nodeid: str,
    measurement: Measurement,
    entry: BaselineEntry | None,
    tolerance: Tolerance,
    retained: int | None = None,
) -> list[Comparison]:
    """One comparison per quantity the test measured; all ``NEW`` when there is no entry.

    ``retained`` (what the test left behind) is compared where the entry has a retained figure.
    """
    reference = entry.quantities() if entry is not None else {}
    comparisons = [
        Comparison(nodeid, quantity, current, reference.get(quantity), tolerance,
                   entry.bounds(quantity) if entry is not None else None)
        for quantity, current in compared_quantities(measurement).items()
    ]
    if retained is not None and entry is not None and entry.retained is not None:
        comparisons.append(compare_retained(nodeid, retained, entry, tolerance))
    return comparisons


def compare_retained(nodeid: str, retained: int, entry: BaselineEntry, tolerance: Tolerance) -> Comparison:
    """What a test left behind against its baseline's figure (a test that freed more counts as 0)."""
    assert entry.retained is not None
    return Comparison(nodeid, RETAINED, max(0, retained), entry.retained, tolerance, entry.bounds(RETAINED))


def retained_ceiling(entry: BaselineEntry, tolerance: Tolerance) -> int:
    """The most a test may leave behind before ``compare_retained`` calls it a regression: its
    entry's figure and the tolerance, or the highest of its runs where they read more."""
    at_zero = compare_retained("", 0, entry, tolerance)
    assert entry.retained is not None and at_zero.allowance is not None
    ceiling = entry.retained + int(at_zero.allowance)
    return ceiling if at_zero.spread is None else max(ceiling, at_zero.spread[1])


def by_test(comparisons: Iterable[Comparison]) -> dict[str, list[Comparison]]:
    """The comparisons grouped by test, in the order each test first comes."""
    grouped: dict[str, list[Comparison]] = {}
    for comparison in comparisons:
        grouped.setdefault(comparison.nodeid, []).append(comparison)
    return grouped


def overall_status(comparisons: list[Comparison]) -> str:
    statuses = {comparison.status for comparison in comparisons}
    return next((status for status in STATUS_ORDER if status in statuses), WITHIN)


def baseline_verdict(comparisons: list[Comparison]) -> Verdict:
    """Fails on any regression; passes (with a note) otherwise."""
    status = overall_status(comparisons)
    telling = [c for c in comparisons if c.status == status] or comparisons
    return Verdict("baseline", status != REGRESSION, "; ".join(c.message() for c in telling))


def record_section(comparisons: list[Comparison], tolerance: Tolerance) -> dict[str, Any]:
    """What a test record carries about its comparison (``record.extra[SECTION]``)."""
    return {
        "status": overall_status(comparisons),
        "tolerance": str(tolerance),
        "quantities": {c.quantity: c.to_dict() for c in comparisons},
    }


def comparisons_from_record(record: TestRecord) -> list[Comparison]:
    """The comparisons a record carries (``record.extra["baseline"]``), e.g. from an xdist worker."""
    section = record.extra.get(SECTION)
    if not isinstance(section, dict):
        return []
    tolerance = parse_tolerance(section["tolerance"])
    return [
        Comparison(record.nodeid, quantity, figures["current"], figures["baseline"], tolerance, _bounds(figures))
        for quantity, figures in section["quantities"].items()
    ]


def _bounds(figures: dict[str, Any]) -> tuple[int, int] | None:
    spread = figures.get("spread")
    return (int(spread[0]), int(spread[1])) if isinstance(spread, list) and len(spread) == 2 else None


def not_run_note(baseline_tests: Iterable[str], measured: Iterable[str], *, where: str) -> str | None:
    """How many baseline tests were not measured ``where`` (``"in this session"``): on one shard
    of a suite, the other shards' tests. ``None`` if every one was."""
    missing = sorted(set(baseline_tests) - set(measured))
    if not missing:
        return None
    more = " ..." if len(missing) > 5 else ""
    return f"{len(missing)} baseline test(s) not run {where}, not compared: {', '.join(missing[:5])}{more}"
