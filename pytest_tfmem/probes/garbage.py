"""Garbage collection before each measurement window, at the cost of the objects that are new.

Memory an earlier test left in reference cycles is freed before a window opens, but a full
``gc.collect()`` with TensorFlow and Keras loaded takes 0.14-0.25 s: so the survivors of each
collection are frozen (``gc.freeze()``) and the next one traverses only newer objects. Garbage
among the frozen objects is held, not reused, until a full collection (thaw, collect, freeze)
runs: after the RSS grew by an allowance that adapts to live growth, or after enough time for
full collections to stay near 1% of the session's time. ``settle()`` collects everything at the
session's end and keeps the survivors frozen through pytest's own collections there; ``thaw()``
ends the freeze, and ``freeze_at_exit()`` spares the interpreter's exit its own pass over them.
The rules and their figures: docs/measurement.md, "What measuring costs".
"""

from __future__ import annotations

import atexit
import gc
import time
from collections.abc import Callable

from pytest_tfmem.probes import host

FULL_AFTER_GROWTH = 32 * 2**20
FULL_AFTER_GROWTH_SHARE = 0.05
MAX_ALLOWANCE_FACTOR = 4
FULL_TIME_SHARE = 0.01
ASSUMED_FULL_COST = 0.25  # seconds: a full collection with TensorFlow and Keras loaded
SETTLE_ROUNDS = 5  # as many as pytest's own collections at a session's end


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
        self._full_at: float | None = None  # when the last full collection (or the first freeze) ended
        self._full_cost = 0.0
        self._rss_after_full = 0
        self._allowance_factor = 1
        self.full_collections = 0
        self.young_collections = 0

    def _allowance(self) -> int:
        """RSS growth since the last full collection that makes the next one due (module docstring)."""
        base = max(FULL_AFTER_GROWTH, int(self._rss_after_full * FULL_AFTER_GROWTH_SHARE))
        return base * self._allowance_factor

    def collect(self, before_freeze: Callable[[], object] | None = None) -> None:
        """Collect garbage, full or young, and freeze what survived.

        ``before_freeze`` runs once the young objects are collected and before the survivors are
        frozen: ``gc.get_objects()`` then lists the objects made since the last freeze that are
        still alive (a full collection, when one is due, comes after it).
        """
        if self._full_at is None:  # (not gc.get_freeze_count(): it counts the frozen objects, ~30 ms)
            self._freeze_first()
            return
        rss = self._rss()
        grown = rss - self._rss_after_full
        full_by_growth = grown >= self._allowance()
        full = full_by_growth or (self._clock() - self._full_at) * FULL_TIME_SHARE > self._full_cost
        if before_freeze is not None or not full:
            gc.collect()
        if before_freeze is not None:
            before_freeze()
        if full:
            self.collect_full()
            if full_by_growth:
                given_back = rss - self._rss_after_full
                live = given_back < grown / 2
                self._allowance_factor = min(self._allowance_factor * 2, MAX_ALLOWANCE_FACTOR) if live else 1
        else:
            gc.freeze()
            self.young_collections += 1

    @property
    def freezing(self) -> bool:
        """Objects were frozen and ``thaw()`` has not given them back yet."""
        return self._full_at is not None

    def _freeze_first(self) -> None:
        gc.collect(1)
        gc.freeze()
        self._return_freed_heap()
        self.assume_full(ASSUMED_FULL_COST)
        self.young_collections += 1

    def collect_full(self) -> None:
        """Everything, frozen objects included, now (then frozen again)."""
        started = self._clock()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        cost = self._clock() - started
        self._return_freed_heap()
        self.assume_full(cost)
        self.full_collections += 1

    def assume_full(self, cost: float) -> None:
        """Count from now, as after a full collection and freeze that took ``cost`` seconds: the
        growth and time rules start over (after one here, or one a template process made before
        it forked this one). Read once the freed heap went back to the OS."""
        self._full_at = self._clock()
        self._full_cost = cost
        self._rss_after_full = self._rss()

    def settle(self) -> None:
        """At the session's end: everything, frozen objects included, collected as long as a
        collection still finds garbage (a finalizer's, at most ``SETTLE_ROUNDS``), and what
        survives frozen again until ``thaw()``. pytest then collects five times to report the
        errors of finalizers (``_pytest.unraisableexception``); those collections find what came
        since, and do not go through the whole heap again (five full collections took 1.2 s with
        TensorFlow and Keras loaded). A finalizer's error in what this collects is reported the
        same way: pytest's hook for them is still in place."""
        gc.unfreeze()
        for _ in range(SETTLE_ROUNDS):
            if gc.collect() == 0:
                break
        gc.freeze()

    def thaw(self) -> None:
        """Give every frozen object back to the collector."""
        gc.unfreeze()
        self._full_at = None


_freezing_at_exit = False


def freeze_at_exit() -> None:
    """Once per process: as the interpreter exits (``atexit``), collect the young objects and freeze
    the rest. Python's own last collection at exit, after it cleared the modules, then skips every
    object that was alive at that moment: with TensorFlow loaded it took 1 to 1.5 s of each process's
    exit. Garbage in the young generations (made after the session's collections) is still
    collected, its finalizers run; objects in reference cycles that were old by then (alive at
    exit, or dropped by pytest itself after its last collection) are freed with the process
    without their finalizers, which Python does not promise to run at exit either."""
    global _freezing_at_exit
    if not _freezing_at_exit:
        atexit.register(_collect_young_and_freeze)
        _freezing_at_exit = True


def _collect_young_and_freeze() -> None:
    gc.collect(1)
    gc.freeze()
