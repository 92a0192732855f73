"""How many workers the memory holds: the arithmetic and the words that show it (no pytest).

One worker needs what it holds after importing the test modules (its baseline) plus what
its heaviest test may add: TensorFlow's allocator and glibc keep freed memory for reuse, so
a worker's level after its heaviest test stays near that high-water mark, and the next test
reuses it rather than adding to it. A margin (``MARGIN``) covers what that model leaves
out: growth from test to test (leaks, caches, TensorFlow's function library) and allocator
rounding. The workers share what the limit leaves beside the controller process, and
never more than the memory available now.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_tfmem.probes.system import MemoryLimit
from pytest_tfmem.units import format_size

MARGIN = 0.10
BUDGET = "budget"
BASELINE_PEAK = "baseline peak"


@dataclass(frozen=True)
class Need:
    """The most one test may add to its worker: the size, where it comes from, and the test."""

    bytes: int
    source: str  # BUDGET or BASELINE_PEAK
    nodeid: str


@dataclass(frozen=True)
class WorkerFit:
    """What the workers share and what one needs (bytes), and the count that follows."""

    limit: MemoryLimit
    available: int  # memory available on the machine when the workers are about to start
    controller_rss: int  # the controller: it lives beside the workers under the same limit
    worker_baseline: int  # a worker's resident memory after importing the test modules
    need: Need
    cpus: int  # xdist's own count for -n auto (one per CPU): tfmem never starts more
    baseline_source: str = "measured"  # how the worker baseline was measured, in words
    margin: float = MARGIN

    @property
    def limit_binds(self) -> bool:
        """Whether the limit (less the controller) is tighter than the memory available now."""
        return self.limit.bytes - self.controller_rss <= self.available

    @property
    def room(self) -> int:
        """Memory the workers may share."""
        return max(0, min(self.limit.bytes - self.controller_rss, self.available))

    @property
    def per_worker(self) -> int:
        return int((self.worker_baseline + self.need.bytes) * (1 + self.margin))

    @property
    def fitting(self) -> int:
        """Workers that fit, CPUs aside (0 if not even one does)."""
        return self.room // max(1, self.per_worker)

    @property
    def count(self) -> int:
        """The count for ``-n auto``: as many as fit, at most one per CPU, at least one."""
        return max(1, min(self.cpus, self.fitting))

    def arithmetic(self) -> str:
        """``7.8 GiB limit less 0.1 GiB controller, each worker 0.6 GiB + 2.0 GiB budget + 10% margin = 2.9 GiB``."""
        if self.limit_binds:
            room = f"{format_size(self.limit.bytes)} limit less {format_size(self.controller_rss)} controller"
        else:
            room = f"{format_size(self.available)} available"
        return (
            f"{room}, each worker {format_size(self.worker_baseline)} + {format_size(self.need.bytes)} "
            f"{self.need.source} + {self.margin:.0%} margin = {format_size(self.per_worker)}"
        )

    def auto_line(self, mode: str = "auto") -> str:
        """The header's line for ``-n auto`` (or ``logical``): the count, why that count, the arithmetic."""
        count = self.count
        if self.fitting < 1:
            why = "not even one fits: the workers will likely be killed"
        elif self.fitting > self.cpus:
            why = f"one per CPU; {self.fitting} would fit"
        else:
            why = f"as many as fit; {self.cpus} CPUs"
        return f"-n {mode}: {count} worker{'s' if count != 1 else ''} ({why}): {self.arithmetic()}"

    def detail_line(self) -> str:
        """Where each figure comes from."""
        limit = self.limit.source if self.limit_binds else f"memory available now (limit: {self.limit.source})"
        return (
            f"tfmem workers: room from {limit}; worker baseline {self.baseline_source}; "
            f"the largest need is the {self.need.source} of {self.need.nodeid}"
        )

    def explicit_warning(self, requested: int) -> str | None:
        """The warning for ``-n N`` when ``N`` workers do not fit, else ``None``."""
        if requested <= self.fitting:
            return None
        fitting = f"{self.fitting} would fit" if self.fitting else "not even one fits"
        return (
            f"pytest-tfmem: -n {requested}: {requested} workers do not fit in memory ({fitting}): "
            f"{self.arithmetic()}; -n auto with --tfmem-workers=fit starts {self.count}"
        )
