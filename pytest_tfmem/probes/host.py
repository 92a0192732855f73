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


def release_freed_memory(collect: Callable[[], object] = gc.collect) -> None:
    """Collect garbage (with ``collect``) and hand freed heap back to the OS.

    Without this, memory freed by an earlier test stays in the C allocator's arenas and a later
    test reuses it without raising RSS, so its measured peak depends on test order.
    """
    collect()
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
