"""Garbage collection before each measurement window, at the cost of the objects that are new.

Before a window opens, garbage is collected so that memory an earlier test left in reference
cycles is freed (and then handed back to the OS) instead of being reused unseen. A full
``gc.collect()`` in a process with TensorFlow and Keras loaded traverses ~400,000 objects and
takes 0.14-0.25 s of CPU: more than many tests. So after each collection the survivors are
frozen (``gc.freeze()``) and the next collection traverses only objects created since.

The price of freezing: an object alive when one window opened that becomes cyclic garbage
later is not collected by those cheap collections. Its memory stays allocated (it is not
reused, so no later figure reads low), but it is not reclaimed either. A full collection
(``gc.unfreeze()``, ``gc.collect()``, freeze again) reclaims it, and runs when either

- the process's RSS at a window's start has grown by ``FULL_AFTER_GROWTH`` (or by
  ``FULL_AFTER_GROWTH_SHARE`` of the RSS at the last full collection, whichever is larger)
  since the last full collection: frozen garbage can cost at most about that much memory; or
- the time since the last full collection has reached ``1 / FULL_TIME_SHARE`` times what the
  last one cost: full collections take at most ~2% of the session's time, and a finaliser
  (``__del__``) of frozen garbage runs at most that long after its object died.

``thaw()`` lifts the freeze for good (end of the session).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from pytest_tfmem.probes import host

FULL_AFTER_GROWTH = 32 * 2**20
FULL_AFTER_GROWTH_SHARE = 0.05
FULL_TIME_SHARE = 0.02


class Collector:
    """Collects garbage before windows: young objects each time, everything now and then."""

    def __init__(
        self,
        rss: Callable[[], int],
        clock: Callable[[], float] = time.perf_counter,
        return_freed_heap: Callable[[], object] = host.return_freed_heap,
    ) -> None:
        self._rss = rss
        self._clock = clock
        # The level after a full collection is read once the freed heap went back to the OS:
        # read before, it would include the garbage just freed, and the next full collection
        # would wait for that much more growth.
        self._return_freed_heap = return_freed_heap
        self._full_at: float | None = None  # when the last full collection ended
        self._full_cost = 0.0
        self._rss_after_full = 0
        self.full_collections = 0
        self.young_collections = 0

    def _full_due(self) -> bool:
        if self._full_at is None:  # (not gc.get_freeze_count(): it counts the frozen objects, ~30 ms)
            return True
        allowed_growth = max(FULL_AFTER_GROWTH, int(self._rss_after_full * FULL_AFTER_GROWTH_SHARE))
        if self._rss() - self._rss_after_full >= allowed_growth:
            return True
        return (self._clock() - self._full_at) * FULL_TIME_SHARE > self._full_cost

    def collect(self) -> None:
        """Collect garbage, full or young, and freeze what survived."""
        if self._full_due():
            started = self._clock()
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._full_at = self._clock()
            self._full_cost = self._full_at - started
            self._return_freed_heap()
            self._rss_after_full = self._rss()
            self.full_collections += 1
        else:
            gc.collect()
            gc.freeze()
            self.young_collections += 1

    def assume_full(self, cost: float) -> None:
        """Count a full collection and freeze just made elsewhere as this collector's last
        (one a template process made, taking ``cost`` seconds, before it forked this one)."""
        self._full_at = self._clock()
        self._full_cost = cost
        self._rss_after_full = self._rss()

    def thaw(self) -> None:
        """Give every frozen object back to the collector."""
        gc.unfreeze()
        self._full_at = None
