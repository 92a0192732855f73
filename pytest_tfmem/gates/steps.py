"""Steps and creep in one test's figures across commits: pure functions over a series.

A series is the test's figure at each measured commit, oldest first, in one environment (figures
of another Python, framework, platform or device are another series). A commit measured more than
once has several samples; its point is their median, and their spread is the environment's
measured noise.

- A **level** is what the test reads over several commits, never one reading: the upper median of
  ``LEVEL_READINGS`` consecutive points (of two, the higher), so one low or high reading neither
  sets it nor moves it. A test's **best level** is its lowest such level.
- A **step** is a change of level between two consecutive points that is larger than the noise
  (``threshold``) and holds: the next point stays at the new level, and the old level rests on at
  least two readings. A point that leaves the level and comes back at the next one is a **blip**,
  not a step; a lone first reading that the next ones leave is no level either (a cold first
  record). The step is named by its first commit; where commits between it and the point before
  were not measured (the point's parent is not the commit before it), by the range, for ``git bisect``.
- **Creep** is the latest level against the best level of the window, whatever the steps: ten
  commits that each add 4% are no step, and the figure still needs 48% more. Creep counts only
  where it exceeds the noise too. The gate holds the reading now (confirmed by a re-run where it
  fails) to the best level before it.

asv's ``step_detect`` fits a piecewise-constant function with a penalty; here the series are short
and the noise is measured, so a step is a jump between neighbours that the next point confirms and
that stands out of the changes around it, which a slow ramp's never does.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from pytest_tfmem.units import Tolerance, format_size

# A change smaller than this many times the noise (the spread of repeated samples) is noise.
NOISE_FACTOR = 4.0
# A jump is a step only where it is this many times the changes around it (``_trend``): on a ramp
# every commit moves by as much (and across a commit nobody measured, by twice as much), and none
# of them is a step.
STEP_OVER_SLOPE = 3.0
TREND_POINTS = 3  # the changes on each side of a jump that give its trend
# A rise larger than the whole creep by this factor was partly undone since (by less, it is noise).
UNDONE_SHARE = 1.1
# The median absolute deviation, scaled to estimate a normal distribution's standard deviation.
_MAD_SCALE = 1.4826
# The consecutive readings a level rests on (fewer only where a series has fewer, never one).
LEVEL_READINGS = 3


@dataclass(frozen=True)
class Point:
    """One commit's figure: the median of its samples (bytes)."""

    commit: str
    parent: str | None
    samples: tuple[int, ...]
    date: str = ""  # the commit's date (ISO 8601), for people
    failed: str = ""  # the tfmem checks a sample failed at this commit (``budget, history``), for people

    @functools.cached_property  # read at every comparison
    def value(self) -> float:
        return float(self.samples[0]) if len(self.samples) == 1 else float(statistics.median(self.samples))

    @property
    def spread(self) -> float | None:
        """The samples' standard deviation, estimated robustly; ``None`` for a single sample."""
        if len(self.samples) < 2:
            return None
        middle = statistics.median(self.samples)
        return _MAD_SCALE * statistics.median(abs(sample - middle) for sample in self.samples) or (
            (max(self.samples) - min(self.samples)) / 2
        )


@dataclass(frozen=True)
class Level:
    """What a test reads over consecutive points: the upper median of their values (bytes), which
    is one of them, ``index`` in the series (its commit names the level)."""

    value: float
    commit: str
    index: int
    readings: int  # how many points it rests on


def level(points: Sequence[Point], offset: int = 0) -> Level:
    """The level of ``points`` (at least one), which start at ``offset`` in their series."""
    ordered = sorted(range(len(points)), key=lambda i: points[i].value)
    chosen = ordered[len(points) // 2]
    return Level(points[chosen].value, points[chosen].commit, offset + chosen, len(points))


def _one_reading(points: Sequence[Point]) -> bool:
    """One reading is no level: a single commit measured once (several samples of one commit are
    several readings)."""
    return len(points) < 2 and sum(len(point.samples) for point in points) < 2


def best_level(points: Sequence[Point]) -> Level | None:
    """The lowest level of ``LEVEL_READINGS`` consecutive points (all of them, where fewer);
    ``None`` for one reading."""
    if _one_reading(points):
        return None
    size = min(LEVEL_READINGS, len(points))
    levels = [level(points[start:start + size], start) for start in range(len(points) - size + 1)]
    return min(levels, key=lambda found: (found.value, -found.index))


def latest_level(points: Sequence[Point]) -> Level | None:
    """The level of the last ``LEVEL_READINGS`` points; ``None`` for one reading."""
    if _one_reading(points):
        return None
    size = min(LEVEL_READINGS, len(points))
    return level(points[-size:], len(points) - size)


@dataclass(frozen=True)
class Step:
    """A level change, first seen at ``commit``: from ``before`` to ``after``, the two figures it
    was tested on (bytes: the last point of the old level and the step's own point; so the change
    printed is the one found larger than the threshold); ``since`` is the last commit of the old
    level where commits between the two were not measured (then the change lies in ``since..commit``)."""

    commit: str
    before: float
    after: float
    since: str | None = None
    index: int = 0  # the point of the series where the new level begins

    @property
    def change(self) -> float:
        return self.after - self.before

    @property
    def change_share(self) -> float | None:
        return None if self.before <= 0 else self.change / self.before

    @property
    def is_range(self) -> bool:
        return self.since is not None

    def describe(self) -> str:
        """``+120.0 MiB (+60.0%) at 4e1c2a7: 200.0 MiB -> 320.0 MiB``; a range as ``a1b2c3d..4e1c2a7``."""
        where = f"{short(self.since)}..{short(self.commit)}" if self.since else short(self.commit)
        share = self.change_share
        percent = "" if share is None else f" ({share:+.1%})"
        return (
            f"{format_size(int(self.change), signed=True)}{percent} at {where}: "
            f"{format_size(int(self.before))} -> {format_size(int(self.after))}"
        )

    def bisect_advice(self, nodeid: str) -> str | None:
        """``git bisect`` commands that find the commit of a step seen across a range: each commit
        is judged by the test's figure against the level halfway between the two."""
        if self.since is None:
            return None
        budget = format_size(int((self.before + self.after) / 2)).replace(" ", "")
        return (
            f"git bisect start {short(self.commit)} {short(self.since)} && "
            f"git bisect run pytest -q -p no:cacheprovider {nodeid} --tfmem-budget={budget}"
        )


@dataclass(frozen=True)
class Creep:
    """The latest level (for the gate: the reading now) against the best level of the window
    (``best_level``); ``noise`` is the series' measured noise (``noise``), which a change must
    exceed to count."""

    best: float
    best_commit: str
    latest: float
    latest_commit: str
    commits: int  # measured commits from the best level's reading to the latest
    # the rises between consecutive points since the best level: (commit, bytes, share of the
    # point before), largest share first
    rises: tuple[tuple[str, float, float], ...] = field(default_factory=tuple)
    noise: float = 0.0
    best_readings: int = 1  # the points the best level rests on

    def describe_best(self) -> str:
        """``56.2 MiB (the middle reading of 3 commits, at 458210a 2 commit(s) ago)``."""
        which = {1: "the median of its readings", 2: "the higher reading of 2 commits"}.get(
            self.best_readings, f"the middle reading of {self.best_readings} commits")
        return f"{format_size(int(self.best))} ({which}, at {short(self.best_commit)} {self.commits} commit(s) ago)"

    @property
    def change(self) -> float:
        return self.latest - self.best

    @property
    def share(self) -> float | None:
        return None if self.best <= 0 else self.change / self.best

    def allowance(self, tolerance: Tolerance) -> float:
        """How far the latest may lie above the best and still count as unchanged: ``tolerance`` of
        the best level, and never less than the noise (``threshold``)."""
        return threshold(self.best, self.noise, tolerance)

    def notable(self, tolerance: Tolerance) -> bool:
        return self.change > self.allowance(tolerance)

    def describe(self) -> str:
        """``+62.0% over 14 commits (200.0 MiB at 1a2b3c4 -> 324.0 MiB), no single rise above 8.0%
        (at 5e6f7a8)``; where one rise was half of the change or more, ``most of it at 5e6f7a8
        (+50.1%)``; where one rise was larger than the whole change (the figure came down after
        it), ``the largest rise +30.0% (at 5e6f7a8), partly undone since``; over one commit, the
        figures alone."""
        share = self.share
        amount = f"{share:+.1%}" if share is not None else format_size(int(self.change), signed=True)
        rises = ""
        if self.rises and self.change > NOISE_FACTOR * self.noise:  # a creep inside the noise has no rise to name
            commit, size, rise_share = self.rises[0]
            if size > UNDONE_SHARE * self.change:
                rises = f", the largest rise {rise_share:+.1%} (at {short(commit)}), partly undone since"
            elif 2 * size >= self.change and self.commits > 1:
                rises = f", most of it at {short(commit)} ({rise_share:+.1%})"
            elif self.commits > 1:
                rises = f", no single rise above {rise_share:.1%} (at {short(commit)})"
        commits = f"{self.commits} commit{'s' if self.commits != 1 else ''}"
        return (
            f"{amount} over {commits} ({format_size(int(self.best))} at {short(self.best_commit)} -> "
            f"{format_size(int(self.latest))} at {short(self.latest_commit)}){rises}"
        )


def short(commit: str | None) -> str:
    return (commit or "?")[:7]


def noise(points: Sequence[Point]) -> float:
    """The environment's measured spread (bytes): the median spread of the commits sampled more
    than once; where none was, estimated from the differences between neighbours (robustly: a step
    or two among them does not move it)."""
    spreads = [spread for point in points if (spread := point.spread) is not None]
    if spreads:
        return float(statistics.median(spreads))
    values = [point.value for point in points]
    differences = [b - a for a, b in zip(values, values[1:])]
    if len(differences) < 2:
        return 0.0
    middle = statistics.median(differences)
    return _MAD_SCALE * float(statistics.median(abs(d - middle) for d in differences)) / 2**0.5


def threshold(level: float, spread: float, min_step: Tolerance) -> float:
    """The smallest change that counts at ``level``: ``NOISE_FACTOR`` times the noise, and at
    least ``min_step`` of the level (``tolerance.DEFAULT_MIN_STEP``)."""
    return max(NOISE_FACTOR * spread, min_step.allowance(int(level)))


def steps(points: Sequence[Point], min_step: Tolerance) -> list[Step]:
    """The level changes that hold for at least two points, from a level of at least two (see the
    module docstring)."""
    if len(points) < 3:
        return []
    spread = noise(points)
    found: list[Step] = []
    previous = 0  # the last point that was not a blip
    held = [0]  # the points of the current level (blips left out)
    index = 1
    while index < len(points):
        value, before = points[index].value, level([points[i] for i in held[-LEVEL_READINGS:]]).value
        limit = threshold(before, spread, min_step)
        if abs(value - before) <= limit:
            previous = index
            held.append(index)
            index += 1
            continue
        following = points[index + 1].value if index + 1 < len(points) else None
        if following is None:
            break  # the last point left the level: a step needs the next one to hold it
        if abs(following - before) <= limit:
            index += 1  # a blip: the next point is back at the level
            continue
        if abs(following - value) > threshold(value, spread, min_step) or (
            abs(value - before) < STEP_OVER_SLOPE * _trend(points, previous, index)
        ):
            previous = index  # no new level: the figure keeps moving (a ramp), not a step
            held.append(index)
            index += 1
            continue
        if len(held) >= 2:
            since = points[previous].commit if points[index].parent not in (None, points[previous].commit) else None
            found.append(Step(points[index].commit, before, value, since, index))
        # else one reading was the old level (a cold first record): no level, so no step from it
        previous = index
        held = [index]
        index += 1
    return found


def _trend(points: Sequence[Point], before: int, after: int) -> float:
    """The median size of the changes between neighbours around a jump from ``before`` to
    ``after`` (up to ``TREND_POINTS`` on each side, the jump itself left out)."""
    values = [point.value for point in points]
    changes = [abs(values[i + 1] - values[i]) for i in range(max(0, before - TREND_POINTS), before)]
    changes += [abs(values[i + 1] - values[i]) for i in range(after, min(len(values) - 1, after + TREND_POINTS))]
    return float(statistics.median(changes)) if changes else 0.0


def creep(points: Sequence[Point], window: int | None = None, *, reading_now: bool = False) -> Creep | None:
    """The latest level of the last ``window`` points (all of them without one) against their best
    level (``best_level``); with ``reading_now``, the last point's own value against the best level
    of the points before it (the gate: the reading now is confirmed by a re-run, the past by their
    levels). ``None`` where there is no level to compare with."""
    shown = list(points[-window:]) if window else list(points)
    past = shown[:-1] if reading_now else shown
    best = best_level(past)
    if best is None:
        return None
    latest = Level(shown[-1].value, shown[-1].commit, len(shown) - 1, 1) if reading_now else latest_level(shown)
    assert latest is not None  # as many points as ``best`` had
    since = shown[best.index:]
    rises = [(b.commit, b.value - a.value, (b.value - a.value) / a.value if a.value > 0 else 0.0)
             for a, b in zip(since, since[1:]) if b.value > a.value]
    rises.sort(key=lambda rise: -rise[2])
    return Creep(
        best=best.value,
        best_commit=best.commit,
        latest=latest.value,
        latest_commit=latest.commit,
        commits=max(0, latest.index - best.index),
        rises=tuple(rises),
        noise=noise(shown),
        best_readings=best.readings,
    )


def creep_since_last_step(points: Sequence[Point], min_step: Tolerance, window: int | None = None) -> Creep | None:
    """The reading now (the last point) against the best level since the last step (``steps``,
    the reading now included: it may be what confirms a step at the point before): a level that
    held for two commits is the test's level from then on, so a test meant to grow fails a gate on
    this once, at the commit that made it grow; a creep no step explains counts from the best level."""
    shown = list(points[-window:]) if window else list(points)
    found = steps(shown, min_step)
    return creep(shown[found[-1].index:] if found else shown, reading_now=True)


def gate(points: Sequence[Point], tolerance: Tolerance, min_step: Tolerance) -> tuple[Creep, float] | None:
    """The history gate on the last of ``points`` (the figure now): its creep since the last step
    (``creep_since_last_step``) and what it may be, ``tolerance`` of the best level but never less
    than a step (the series' noise, ``min_step``); it fails where the creep's change is larger.
    ``None`` where the test has no level yet (fewer than two readings since its last step)."""
    found = creep_since_last_step(points, min_step)
    if found is None:
        return None
    return found, max(found.allowance(tolerance), found.allowance(min_step))
