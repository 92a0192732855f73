"""Host memory of this process: its size, the peak of a window, returning freed heap.

The figures are the platform's (``platforms.current()``): RSS on Linux, the physical footprint on
macOS, the working set on Windows. How a window's peak is read depends on the mark the platform
keeps (``HostRSS``): one reset at each window (Linux's ``VmHWM`` through ``clear_refs``, macOS's
footprint interval mark) is exact; a lifetime mark (Windows' peak working set; macOS < 10.14)
is exact for a window that raised it, and a sampler reads the size every millisecond beside it
for the windows that did not; with no mark at all (the portable platform), the sampler alone.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

from pytest_tfmem import platforms
from pytest_tfmem.platforms import EXACT, EXACT_IF_RAISED, Platform
from pytest_tfmem.probes.sampler import Sampler

SAMPLE_INTERVAL_S = 0.001  # how often the size is read where the platform keeps no resettable mark


def current_rss() -> int:
    """This process's size in bytes (what the platform counts: RSS on Linux)."""
    return platforms.current().current_size()


def high_water_mark(pid: int | None = None) -> int | None:
    """A process's peak size since it started or last reset it (the platform's mark), in bytes:
    this process's, or ``pid``'s; ``None`` when there is none to read (the process is gone, or
    a zombie; a platform that keeps no mark)."""
    if pid is None:
        return platforms.current().peak_mark()
    memory = platforms.current().memory_of(pid)
    return None if memory is None else memory[1]


def resident_and_high_water_mark(pid: int) -> tuple[int, int] | None:
    """Another process's size and mark (bytes), from one reading (a watchdog reads both of each
    watched process every few milliseconds); ``None`` once it has ended (a zombie) or is gone."""
    return platforms.current().memory_of(pid)


def return_freed_heap() -> None:
    """Hand the heap the C allocator holds free back to the OS (glibc ``malloc_trim(0)``)."""
    platforms.current().release_freed_heap()


# When the trims between tests may be skipped (``HeapTrims``): a window that rose this far above
# the level of the last trim is always followed by one; otherwise, while trims give back less than
# ``TRIM_YIELD``, the next ones are skipped, twice as many each time, up to ``TRIM_SKIPS_AT_MOST``.
TRIM_AFTER_RISE = 4 * 2**20
TRIM_YIELD = 2**20
TRIM_SKIPS_AT_MOST = 16


class HeapTrims:
    """The trims between tests, done where they pay.

    ``malloc_trim(0)`` walks every free chunk of every arena: a real TensorFlow process's heap is
    many small chunks across its threads' arenas, and a trim took 2.7 ms there (33 ms in a heap of
    200,000 free chunks), most of it finding nothing it can give back. What a trim keeps true is
    that freed memory does not stay resident for the next test to reuse unseen (its peak would read
    low) nor count as kept (a retained figure would read high). So a trim always follows a window
    that rose ``TRIM_AFTER_RISE`` or more above the level after the last one (what it freed may be
    that much); after one that rose less, at most that much of the freed memory it made can stay
    resident. Otherwise trims are skipped while they give nothing back: after a trim that gave back
    less than ``TRIM_YIELD``, the next trims are skipped, one, then two, then four... up to
    ``TRIM_SKIPS_AT_MOST``; one that gives back more starts over. Memory a test frees that an
    earlier one allocated, without rising, can so stay resident until the next trim, at most
    ``TRIM_SKIPS_AT_MOST`` tests later (docs/measurement.md, "What measuring costs").
    """

    def __init__(self) -> None:
        self._after: int | None = None  # the level after the last trim
        self._skips = 0  # how many to skip after the last trim
        self._skipped = 0
        self.trims = 0
        self.skipped = 0

    def due(self) -> bool:
        if self._after is None or self._skipped >= self._skips:
            return True
        mark = platforms.current().peak_mark()  # the highest level since the window opened
        return mark is None or mark - self._after >= TRIM_AFTER_RISE

    def between_tests(self) -> None:
        """A trim, where ``due``; otherwise count the skip."""
        if not self.due():
            self._skipped += 1
            self.skipped += 1
            return
        before = current_rss()
        return_freed_heap()
        self._after = current_rss()
        self._skips = 0 if before - self._after >= TRIM_YIELD else min(max(1, 2 * self._skips), TRIM_SKIPS_AT_MOST)
        self._skipped = 0
        self.trims += 1


_trims = HeapTrims()


def trims() -> HeapTrims:
    """This process's ``HeapTrims``."""
    return _trims


def release_freed_memory(collect: Callable[[], object] = gc.collect, *, between_tests: bool = False) -> None:
    """Collect garbage (with ``collect``) and hand freed heap back to the OS.

    Without this, memory freed by an earlier test stays in the C allocator's arenas and a later
    test reuses it without raising RSS, so its measured peak depends on test order. Between two
    tests (``between_tests``) the trim is done where it pays (``HeapTrims``).
    """
    collect()
    if between_tests:
        _trims.between_tests()
    else:
        return_freed_heap()


def swapped_bytes() -> int:
    """This process's memory in swap that its size does not count (Linux's ``VmSwap``)."""
    return platforms.current().swapped_bytes()


class HostRSS:
    """A peak source over this process's size: ``current``, ``peak`` since the last ``reset_peak``.

    ``method`` says how its peaks are read (``exact``, ``exact-if-raised``, ``sampled``) and
    ``counts`` what they count; a window on it asks ``raised_since`` whether a lifetime mark
    made its figure exact.
    """

    name = "host"

    def __init__(self, platform: Platform | None = None) -> None:
        self.platform = platform if platform is not None else platforms.current()
        self.method = self.platform.peak_method()
        self.counts = self.platform.counts
        self.exact = self.method == EXACT
        self._sampled_peak = 0
        self._window = 0  # which window a sample belongs to: one read before a reset is not the new window's
        self._lock = threading.Lock()
        self._mark_at_reset = 0
        self._sampler: Sampler | None = None
        if not self.exact:
            self._sampler = Sampler(self._sample, SAMPLE_INTERVAL_S, "tfmem-rss-sampler").start()

    def _sample(self) -> None:
        window = self._window
        size = self.platform.current_size()
        with self._lock:
            if window == self._window:
                self._sampled_peak = max(self._sampled_peak, size)

    def current(self) -> int:
        return self.platform.current_size()

    def peak(self) -> int:
        if self.exact:
            return self.platform.peak_mark() or 0  # exact: the platform keeps this process's mark
        sampled = max(self._sampled_peak, self.platform.current_size())
        if self.method == EXACT_IF_RAISED:
            mark = self.lifetime_mark()
            if mark > self._mark_at_reset:  # reached since the reset: the window's exact peak
                return max(mark, sampled)
        return sampled

    def reset_peak(self) -> None:
        if self.exact:
            self.platform.reset_peak_mark()
            return
        with self._lock:
            self._window += 1
            self._sampled_peak = 0
        if self.method == EXACT_IF_RAISED:
            self._mark_at_reset = self.lifetime_mark()

    def lifetime_mark(self) -> int:
        """The mark an ``exact-if-raised`` platform keeps for the process's whole life."""
        return self.platform.peak_mark() or 0

    def raised_since(self, mark: int) -> bool:
        """Whether the lifetime mark rose above ``mark`` (read as a window opened): if so, the
        window's peak is that mark, exactly."""
        return self.lifetime_mark() > mark
