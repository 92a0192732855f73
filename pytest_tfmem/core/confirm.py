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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_tfmem.units import format_size

if TYPE_CHECKING:  # the verdicts' module reads the session's books, which hold the one-time costs
    from pytest_tfmem.core.verdict import Verdict

REPRODUCED = "tfmem: reproduced by a re-run in the same process"
# The checks on a test's figures: a re-run gives them a second figure to judge.
FIGURE_CHECKS = frozenset({"budget", "baseline", "history", "gpu_budget"})


@dataclass(frozen=True)
class Confirmation:
    """The re-run that confirmed or overturned a test's first verdict.

    ``asked_by`` names what asked for it (the checks the first run failed, or what its figure
    departed from); ``reproduced`` says whether the re-run failed (or departed) too.
    """

    first_peak: int
    rerun_peak: int
    asked_by: tuple[str, ...]
    reproduced: bool

    @property
    def one_time_bytes(self) -> int:
        """What the first run took beyond the re-run, where the re-run overturned it: paid once by
        the process, not the test's own need."""
        return 0 if self.reproduced else max(0, self.first_peak - self.rerun_peak)

    def reproduced_line(self) -> str:
        """Under a failure that stands: ``tfmem: reproduced by a re-run in the same process: first
        run 80.0 MiB, re-run 79.9 MiB``."""
        return (f"{REPRODUCED}: first run {format_size(self.first_peak)}, "
                f"re-run {format_size(self.rerun_peak)}")

    def note(self) -> str:
        """The line of the test's section."""
        runs = f"first run {format_size(self.first_peak)}, re-run {format_size(self.rerun_peak)}"
        asked = ", ".join(self.asked_by)
        if self.reproduced:
            return f"re-run in the same process to confirm ({asked}): it reproduced ({runs})"
        return (
            f"re-run in the same process to confirm ({asked}): it did not reproduce ({runs}); the verdict "
            f"is the re-run's, and {format_size(self.one_time_bytes, signed=True)} is booked as a one-time "
            "cost of the process paid in this test"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "first_peak": self.first_peak,
            "rerun_peak": self.rerun_peak,
            "asked_by": list(self.asked_by),
            "reproduced": self.reproduced,
            "one_time_bytes": self.one_time_bytes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Confirmation:
        return cls(int(data["first_peak"]), int(data["rerun_peak"]), tuple(data.get("asked_by", ())),
                   bool(data["reproduced"]))


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
