"""Leak checks: run a function repeatedly and decide whether memory grows per iteration.

``leak_check(fn)`` runs ``warmup`` iterations (caches, lazy imports and first traces settle),
then ``iterations`` measured ones. After each: ``gc.collect()`` and ``malloc_trim(0)``, then
the level of every memory view (host RSS, each TF allocator's current bytes) is read. The
growth per iteration is the Theil-Sen slope of each view's levels (the median of the slopes
between every pair of readings): a few noisy readings cannot move it, a steady leak moves
every pair. The largest view's slope is compared with ``max_growth``.

Levels are read from the core probes without resetting any peak, so an enclosing measurement
window (the test's own, ``tfmem.measure()``) still sees the loop's overall peak.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, ParamSpec

from pytest_tfmem.core import measure
from pytest_tfmem.core.retained import CHILDREN_VIEW, children_size, running_children
from pytest_tfmem.core.verdict import Verdict, view_label
from pytest_tfmem.errors import LeakDetected, failure
from pytest_tfmem.leaks.diagnosis import GrowthTracker, LeakDiagnosis
from pytest_tfmem.probes import host
from pytest_tfmem.units import format_size, parse_size

CHECK = "leak"
DEFAULT_ITERATIONS = 10
DEFAULT_WARMUP = 3
DEFAULT_MAX_GROWTH = "1MB"
_SHOWN_READINGS = 12
P = ParamSpec("P")


def theil_sen_slope(levels: list[int] | tuple[int, ...]) -> float:
    """Median of the slopes between every pair of readings (readings one iteration apart)."""
    if len(levels) < 2:
        return 0.0
    return statistics.median(
        (levels[j] - levels[i]) / (j - i) for i in range(len(levels)) for j in range(i + 1, len(levels))
    )


def check_arguments(iterations: object, warmup: object, max_growth: object) -> tuple[int, int, int]:
    """Validated ``(iterations, warmup, max_growth in bytes)``; ``ValueError`` names the bad value."""
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 2:
        raise ValueError(
            f"invalid iterations {iterations!r}: expected a whole number >= 2 (a slope needs two readings)"
        )
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"invalid warmup {warmup!r}: expected a whole number >= 0")
    return iterations, warmup, parse_size(max_growth, what="max_growth")


@dataclass(frozen=True)
class LeakReport:
    """The result of a leak check: readings, growth per iteration, verdict, diagnosis.

    ``series[view]`` holds the view's level (bytes) after the warmup, then after each measured
    iteration; ``slopes[view]`` its Theil-Sen growth in bytes per iteration.
    """

    iterations: int
    warmup: int
    max_growth: int
    series: Mapping[str, tuple[int, ...]]
    slopes: Mapping[str, float]
    diagnosis: LeakDiagnosis = field(default_factory=LeakDiagnosis)
    duration_s: float = 0.0

    @property
    def growth_per_iteration(self) -> float:
        """Growth per iteration in bytes: the largest view's robust slope."""
        return max(self.slopes.values(), default=0.0)

    @property
    def leaked(self) -> bool:
        return self.growth_per_iteration > self.max_growth

    @property
    def verdict(self) -> Verdict:
        return Verdict(CHECK, not self.leaked, self.describe())

    def headline(self) -> str:
        relation = ">" if self.leaked else "<="
        outcome = "leak" if self.leaked else "no leak"
        return (
            f"{outcome}: {format_size(self.growth_per_iteration, signed=True)} per iteration {relation} max_growth "
            f"{format_size(self.max_growth)} (robust slope over {self.iterations} measured iterations "
            f"after {self.warmup} warmup)"
        )

    def rows(self) -> list[tuple[str, str]]:
        growth = ", ".join(
            f"{view_label(view)} {format_size(slope, signed=True)}" for view, slope in self.slopes.items()
        )
        rows = [("growth per iteration", growth)]
        rows += self.diagnosis.rows(self.leaked)
        rows += [(f"{view_label(view)} readings", _readings(levels)) for view, levels in self.series.items()]
        return rows

    def describe(self) -> str:
        """The headline, then a small table: growth, what grew every iteration, readings."""
        rows = self.rows()
        width = max(len(heading) for heading, _ in rows)
        return "\n".join([self.headline(), *(f"  {heading.ljust(width)}  {text}" for heading, text in rows)])

    __str__ = describe

    def to_dict(self) -> dict[str, Any]:
        """The fields (the diagnosis's too), with ``growth_per_iteration`` and ``leaked``."""
        data = asdict(self)
        data["series"] = {view: list(levels) for view, levels in self.series.items()}
        return {**data, "growth_per_iteration": self.growth_per_iteration, "leaked": self.leaked}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LeakReport:
        return cls(
            iterations=data["iterations"],
            warmup=data["warmup"],
            max_growth=data["max_growth"],
            series={view: tuple(levels) for view, levels in data["series"].items()},
            slopes=dict(data["slopes"]),
            diagnosis=LeakDiagnosis.from_dict(data.get("diagnosis", {})),
            duration_s=data.get("duration_s", 0.0),
        )


def _readings(levels: tuple[int, ...]) -> str:
    """``612.4 MiB, then +3.9 +7.8 ... MiB``: the level after warmup, then the change since."""
    changes = [level - levels[0] for level in levels[1:]]
    unit, factor = ("MiB", 2**20) if max((abs(c) for c in changes), default=0) >= 2**20 else ("KiB", 2**10)
    shown = [f"{change / factor:+.1f}" for change in changes]
    if len(shown) > _SHOWN_READINGS:
        half = _SHOWN_READINGS // 2
        shown = [*shown[:half], "...", *shown[-half:]]
    return f"{format_size(levels[0])}, then {' '.join(shown)} {unit}"


def leak_check(
    fn: Callable[[], object],
    iterations: int = DEFAULT_ITERATIONS,
    warmup: int = DEFAULT_WARMUP,
    max_growth: int | str = DEFAULT_MAX_GROWTH,
    *,
    trackers: Sequence[measure.PeakTracker] = (),
) -> LeakReport:
    """Run ``fn()`` ``warmup`` times, then ``iterations`` measured times; report the growth of
    every view (host RSS, each TF allocator, and ``trackers``'s: the features' own).

    Raises nothing on a leak (see ``assert_no_leak``); exceptions from ``fn`` propagate.
    """
    if not callable(fn):
        raise TypeError(f"leak_check: expected a function to call repeatedly, got {fn!r}")
    iterations, warmup, limit = check_arguments(iterations, warmup, max_growth)
    started = time.perf_counter()
    for _ in range(warmup):
        fn()

    # The diagnosis state is alive at every reading, the baseline's included, so its own
    # memory is an offset, not a trend.
    tracker = GrowthTracker()
    with _objects_alive_now_exempt_from_gc(tracker.record_containers) as freeze:
        tracker.observe()
        host.release_freed_memory()
        already = running_children()  # processes running before the loop (a wider fixture's) are not its
        series = {view: [level] for view, level in current_levels(trackers, already).items()}
        tracker.ignore(series, *series.values())
        for _ in range(iterations):
            fn()
            host.release_freed_memory()
            for view, level in current_levels(trackers, already).items():
                series.setdefault(view, []).append(level)  # a view that appears late has no baseline
            tracker.observe()
        freeze.thaw()  # the diagnosis compares every container, the ones alive before the check too
        diagnosis = tracker.diagnosis()

    complete = {view: tuple(levels) for view, levels in series.items() if len(levels) == iterations + 1}
    if not any(complete.get(CHILDREN_VIEW, ())):
        complete.pop(CHILDREN_VIEW, None)  # no process ran: no view
    return LeakReport(
        iterations=iterations,
        warmup=warmup,
        max_growth=limit,
        series=complete,
        slopes={view: theil_sen_slope(levels) for view, levels in complete.items()},
        diagnosis=diagnosis,
        duration_s=time.perf_counter() - started,
    )


# Process-wide on purpose: gc.freeze() is the interpreter's, not a session's, so whether a leak
# check holds it is too (a check nested in another, in any session or none, must leave it alone).
_running_checks = 0


class _Freeze:
    """The check's freeze of the objects alive at its baseline (``_objects_alive_now_exempt_from_gc``)."""

    def __init__(self, outermost: bool) -> None:
        self.outermost = outermost
        self.frozen = False

    def start(self, before_freeze: Callable[[], None]) -> None:
        if self.outermost:
            gc.unfreeze()
        gc.collect()
        before_freeze()
        if self.outermost:
            gc.freeze()
            self.frozen = True

    def thaw(self) -> None:
        """Give the check's frozen objects back to the collector (once)."""
        if self.frozen:
            gc.unfreeze()
            self.frozen = False


@contextmanager
def _objects_alive_now_exempt_from_gc(before_freeze: Callable[[], None]) -> Iterator[_Freeze]:
    """``gc.freeze()`` for the measured iterations, so each ``gc.collect()`` traverses only the
    objects created since the baseline (a TF process holds ~400k others; a full collection takes
    a few hundred ms). Objects alive at the baseline are part of every reading either way; garbage
    among them is collected when the check ends. Object counts then cover new objects only,
    which is what can grow. What was frozen before (the per-test collector's freeze) is thawed
    first, so that ``before_freeze`` (which finds the containers that hold what grows) sees every
    object; the check thaws its own (``_Freeze.thaw``, at the latest when it ends) and, where
    objects were frozen before it, freezes again after a full collection: the session's books
    would otherwise count every thawed object as the test's. A nested check leaves the freeze to
    the outer one.
    """
    global _running_checks
    freeze = _Freeze(outermost=not _running_checks)
    frozen_before = freeze.outermost and gc.get_freeze_count() > 0  # a session's collector froze the older objects
    _running_checks += 1
    try:
        freeze.start(before_freeze)
        yield freeze
    finally:
        freeze.thaw()
        if frozen_before:  # as it found it: frozen again, the check's own garbage collected first
            gc.collect()
            gc.freeze()
        _running_checks -= 1


def current_levels(trackers: Sequence[measure.PeakTracker] = (), leave_out: Collection[int] = ()) -> dict[str, int]:
    """Level of every memory view now (host RSS, each TF allocator, ``trackers``'s, and the
    running processes this one started, ``children``, less those in ``leave_out``).

    Only current levels are read: no peak is reset, so enclosing windows are undisturbed.
    """
    levels = {tracker.source.name: tracker.source.current() for tracker in (*measure.probes().trackers(), *trackers)}
    levels[CHILDREN_VIEW] = children_size(leave_out)
    return levels


def failing_on_leak(check: Callable[P, LeakReport], doc: str) -> Callable[P, LeakReport]:
    """``check`` (a leak check, same arguments), then ``raise_if_leaked`` on its report."""

    @functools.wraps(check)
    def checked(*args: P.args, **kwargs: P.kwargs) -> LeakReport:
        __tracebackhide__ = True  # pytest and IPython show the caller's line, not tfmem's frames
        report = check(*args, **kwargs)
        raise_if_leaked(report)
        return report

    checked.__doc__ = doc
    return checked


assert_no_leak = failing_on_leak(
    leak_check, "Like ``leak_check``, but raise ``LeakDetected`` (with the report's table) on a leak."
)


def raise_if_leaked(report: LeakReport) -> None:
    __tracebackhide__ = True
    if report.leaked:
        raise failure(LeakDetected, f"tfmem: {report.describe()}")
