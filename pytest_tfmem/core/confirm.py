"""A memory verdict stands only if it reproduces.

The first test of a kind in a process pays one-time costs (kernels, traced functions, a library's
caches) that no warm-up can list. So before a test fails a check on its figures (a budget, the
baseline, the history gate, a GPU budget), and before a figure that departs from the test's
recorded level is kept (``pytest_tfmem_departure``), the body runs once more in the same process
(``core.rerun``), measured the same way. The verdict is then the re-run's where it passes: what the
first run took beyond it was paid once by the process, and is booked as a one-time cost under the
test that paid it. Where the re-run fails too, the failure stands and names both runs' figures.

Where the re-run overturns the verdict, its figures become the record's: the test's own need,
warm. That is what a baseline or a history keeps, so a one-time cost never becomes a step, a creep
or a baseline. A verdict that stands keeps the first run's figures (its subtests', its trace's).
Checks on something other than a figure (a leak's slope, a device out of memory) are not
confirmed this way: a leak check repeats the body itself, and an exception is not a figure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_tfmem.core.measure import Measurement
from pytest_tfmem.units import DEFAULT_MIN_STEP, format_size, parse_tolerance

if TYPE_CHECKING:  # the verdicts' module reads the session's books, which hold the one-time costs
    from pytest_tfmem.core.verdict import Verdict

REPRODUCED = "tfmem: reproduced by a re-run in the same process"
# Two runs' figures differ where the re-run reads lower by more than the smallest change a memory
# history calls a step: part of the first run's figure was then paid once by the process.
RUNS_DIFFER = parse_tolerance(DEFAULT_MIN_STEP)


def runs_differ(first: int, again: int) -> bool:
    """The re-run read ``again`` lower than the first run's ``first`` by more than ``RUNS_DIFFER``."""
    return first - again > RUNS_DIFFER.allowance(first)


# A re-run still settles where it read this much below the first run (a share of it, at least
# ``SETTLING_AT_LEAST``): a test whose one-time costs take two runs to pay (a cache its second run
# fills in turn) is judged on a third run where the second still fails.
SETTLING_SHARE = 0.25
SETTLING_AT_LEAST = 2**20


def still_settling(first: int, again: int) -> bool:
    """The re-run's ``again`` lies far below the first run's ``first``: more may be one-time."""
    return first - again > max(SETTLING_AT_LEAST, SETTLING_SHARE * first)
# The checks on a test's figures: a re-run gives them a second figure to judge.
FIGURE_CHECKS = frozenset({"budget", "baseline", "history", "gpu_budget"})


@dataclass(frozen=True)
class Comparable:
    """A re-run's measurement made comparable with the first run's: each part the re-run read
    less fully than the first (``taken``, in words) is the first run's."""

    measurement: Measurement
    taken: tuple[str, ...]


def comparable_rerun(first: Measurement, again: Measurement) -> Comparable:
    """The re-run's figures, with what it could not read as the first run did taken from the first run.

    A re-run that misses what the first run saw (a process that ended before it was read, a view
    that was not open, a peak it could only sample where the first run had a mark) reads low for
    that reason alone: judged as it is, it would overturn a true verdict. A part the re-run read at
    least as fully stays the re-run's, so a one-time cost the first run paid is still told apart.
    """
    taken: list[str] = []
    children = again.children
    seen = first.children.read_count if first.children is not None else 0
    read = again.children.read_count if again.children is not None else 0
    if seen > read:
        children = first.children
        processes = f"{seen} process{'es' if seen > 1 else ''}"
        taken.append(f"the {processes} the first run read (the re-run read {read or 'none'} of them)")
    views = list(again.views)
    names = {view.view for view in again.views}
    for view in first.views:
        if view.view not in names:
            views.append(view)
            taken.append(f"the {view.view} view (not open in the re-run)")
    host, first_host, method = again.view("host"), first.view("host"), again.method
    if first.exact and not again.exact and host is not None and first_host is not None:
        views[views.index(host)], method = first_host, first.method
        taken.append("the host peak (the first run's is a mark, the re-run's only sampled)")
    mixed, interval = again.mixed, again.mixed_interval_s
    if first.sampled and again.mixed is None:
        mixed, interval = first.mixed, first.mixed_interval_s
        taken.append("host and TensorFlow memory held at once (sampled in the first run only)")
    if not taken:
        return Comparable(again, ())
    measurement = dataclasses.replace(again, views=tuple(views), children=children, mixed=mixed,
                                      mixed_interval_s=interval, method=method)
    return Comparable(measurement, tuple(taken))


@dataclass(frozen=True)
class Confirmation:
    """The re-run that confirmed or overturned a test's first verdict.

    ``asked_by`` names what asked for it (the checks the first run failed, or what its figure
    departed from); ``reproduced`` says whether the verdict stands: the re-run failed the same
    check (or departed, within ``RUNS_DIFFER`` of the first run). ``rerun_kept``: the test's figures
    are the re-run's, so what the first run read beyond them was paid once (the re-run passed, or
    read lower than the first run by more than ``RUNS_DIFFER``: no reading that paid one-time costs
    is kept for a level or a baseline). ``first_parts``
    and ``rerun_parts`` say what each run read (host, TensorFlow's allocator, the processes it
    started), so that a reader sees like compared with like; ``taken`` names the parts the re-run
    could not read as the first run did, whose first-run figures were used (``comparable_rerun``).
    """

    first_peak: int
    rerun_peak: int
    asked_by: tuple[str, ...]
    reproduced: bool
    first_parts: str = ""
    rerun_parts: str = ""
    taken: tuple[str, ...] = ()
    rerun_kept: bool = False
    # Where the re-run still settled (``still_settling``) and a third run was judged instead: the
    # second run's figure; ``rerun_peak`` is then the third's.
    settling_peak: int | None = None

    @property
    def one_time_bytes(self) -> int:
        """What the first run took beyond the re-run, where the test's figures are the re-run's:
        paid once by the process, not the test's own need."""
        return max(0, self.first_peak - self.rerun_peak) if self.rerun_kept else 0

    def reproduced_line(self) -> str:
        """Under a failure that stands: ``tfmem: reproduced by a re-run in the same process: first
        run 80.0 MiB, re-run 79.9 MiB``."""
        taken = " with the first run's figures for what it could not read" if self.taken else ""
        settling = "" if self.settling_peak is None else f"re-run {format_size(self.settling_peak)}, then "
        runs = f"first run {format_size(self.first_peak)}, {settling}re-run {format_size(self.rerun_peak)}{taken}"
        if self.rerun_kept:
            return (f"{REPRODUCED}, {format_size(self.one_time_bytes)} lower: {runs}; the verdict rests on the "
                    "re-run's figures, and the rest was paid once by the process")
        return f"{REPRODUCED}: {runs}"

    def runs(self) -> str:
        """``first run 53.3 MiB (host RSS 4.0 KiB, 1 process it started 53.3 MiB), re-run ...``."""
        first = f" ({self.first_parts})" if self.first_parts else ""
        again = f" ({self.rerun_parts})" if self.rerun_parts else ""
        settling = "" if self.settling_peak is None else f"re-run {format_size(self.settling_peak)}, then "
        last = f"re-run {format_size(self.rerun_peak)}{again}"
        return f"first run {format_size(self.first_peak)}{first}, {settling}{last}"

    def note(self) -> str:
        """The line of the test's section."""
        asked = "; ".join(self.asked_by)
        taken = ""
        if self.taken:
            taken = f"; the re-run could not read {'; '.join(self.taken)}: those parts are the first run's"
        if self.reproduced and self.rerun_kept:
            return (
                f"re-run in the same process to confirm ({asked}): it reproduced, {format_size(self.one_time_bytes)} "
                f"lower ({self.runs()}){taken}; the figures are the re-run's, and "
                f"{format_size(self.one_time_bytes, signed=True)} is booked as a one-time cost of the process paid in "
                "this test"
            )
        if self.reproduced:
            return f"re-run in the same process to confirm ({asked}): it reproduced ({self.runs()}){taken}"
        return (
            f"re-run in the same process to confirm ({asked}): it did not reproduce ({self.runs()}){taken}; "
            f"the verdict is the re-run's, and {format_size(self.one_time_bytes, signed=True)} is booked as a "
            "one-time cost of the process paid in this test"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "first_peak": self.first_peak,
            "rerun_peak": self.rerun_peak,
            "asked_by": list(self.asked_by),
            "reproduced": self.reproduced,
            "one_time_bytes": self.one_time_bytes,
            "first_parts": self.first_parts,
            "rerun_parts": self.rerun_parts,
            "taken_from_first_run": list(self.taken),
            "rerun_kept": self.rerun_kept,
            "settling_peak": self.settling_peak,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Confirmation:
        return cls(int(data["first_peak"]), int(data["rerun_peak"]), tuple(data.get("asked_by", ())),
                   bool(data["reproduced"]), str(data.get("first_parts", "")), str(data.get("rerun_parts", "")),
                   tuple(data.get("taken_from_first_run", ())),
                   bool(data.get("rerun_kept", not data["reproduced"])),
                   None if data.get("settling_peak") is None else int(data["settling_peak"]))


@dataclass(frozen=True)
class OneTimeCost:
    """What a test's first run took beyond its re-run, paid once by the process (``worker``)."""

    nodeid: str
    worker: str | None
    confirmation: Confirmation

    @property
    def bytes(self) -> int:
        return self.confirmation.one_time_bytes

    def describe(self) -> str:
        """``one-time cost paid in test X: +42.6 MiB (first run 45.4 MiB, re-run 2.8 MiB)``."""
        where = f" [{self.worker}]" if self.worker else ""
        runs = self.confirmation
        return (
            f"one-time cost paid in test {self.nodeid}{where}: {format_size(self.bytes, signed=True)} "
            f"(first run {format_size(runs.first_peak)}, re-run {format_size(runs.rerun_peak)})"
        )


class OneTimeCosts:
    """The session's one-time costs told apart by re-runs: how many, their sum, the largest few
    (bounded: a session's books stay the same size however many tests it runs)."""

    KEPT = 10

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0
        self.largest: list[OneTimeCost] = []

    def add(self, cost: OneTimeCost) -> None:
        if cost.bytes <= 0:
            return
        self.count += 1
        self.bytes += cost.bytes
        self.largest = sorted([*self.largest, cost], key=lambda known: (-known.bytes, known.nodeid))[: self.KEPT]

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "bytes": self.bytes,
            "largest": [
                {"test": cost.nodeid, "worker": cost.worker, **cost.confirmation.to_dict()} for cost in self.largest
            ],
        }


def confirmable(failed: list[Verdict]) -> bool:
    """Every failed verdict is on a figure, so a second figure can overturn it."""
    return all(verdict.check in FIGURE_CHECKS for verdict in failed)
