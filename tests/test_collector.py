"""Garbage collection before each measured test: young objects each time, everything now and then."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_tfmem.probes.garbage import (
    ASSUMED_FULL_COST,
    FULL_AFTER_GROWTH,
    FULL_TIME_SHARE,
    MAX_ALLOWANCE_FACTOR,
    Collector,
)

REPOSITORY = Path(__file__).resolve().parent.parent
if str(REPOSITORY) not in sys.path:  # benchmarks/ sits beside the package, it is not installed
    sys.path.insert(0, str(REPOSITORY))

from benchmarks.suite_overhead import DRIFT_MODULE  # noqa: E402

MIB = 2**20


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_freeze_first_then_young_then_full_after_growth_or_time(thawed: None) -> None:
    clock, rss = Clock(), [1000 * MIB]
    collector = Collector(lambda: rss[0], clock)
    collector.collect()
    assert (collector.full_collections, collector.young_collections) == (0, 1)
    assert collector.freezing and gc.get_freeze_count() > 0  # frozen: the next collection skips them

    collector.collect()
    rss[0] += FULL_AFTER_GROWTH // 2  # under both 32 MiB and 5% of 1000 MiB
    collector.collect()
    assert (collector.full_collections, collector.young_collections) == (0, 3)

    rss[0] += 100 * MIB  # 116 MiB above the level at the first freeze: over 5%
    collector.collect()
    assert collector.full_collections == 1

    clock.now += 3600  # long enough for any cost of the last full collection at a 1% share
    collector.collect()
    assert collector.full_collections == 2


def test_the_first_full_collection_by_time_waits_for_the_assumed_cost(thawed: None) -> None:
    """Before any full collection has measured its cost, a quarter of a second is assumed: at a
    1% share, the first one by time comes 25 s after the first freeze."""
    clock = Clock()
    collector = Collector(lambda: 0, clock)
    collector.collect()
    clock.now += 0.99 * ASSUMED_FULL_COST / FULL_TIME_SHARE
    collector.collect()
    assert collector.full_collections == 0
    clock.now += 0.02 * ASSUMED_FULL_COST / FULL_TIME_SHARE
    collector.collect()
    assert collector.full_collections == 1


def test_the_level_after_a_full_collection_is_read_once_the_freed_heap_is_returned(thawed: None) -> None:
    """Read before, the level would include the garbage just freed, and the next full
    collection would wait for that much more growth."""
    rss = [1000 * MIB]

    def return_freed_heap() -> None:
        rss[0] -= 100 * MIB  # the garbage the full collection freed goes back to the OS

    collector = Collector(lambda: rss[0], Clock(), return_freed_heap)
    collector.collect()
    rss[0] += 200 * MIB
    collector.collect()
    assert collector.full_collections == 1
    rss[0] += 60 * MIB  # 1060 MiB in all, but 60 MiB above the level after the full collection
    collector.collect()
    assert collector.full_collections == 2


def test_growth_that_a_full_collection_does_not_give_back_doubles_the_allowance(thawed: None) -> None:
    """RSS that grows with live memory (a suite's caches) asks for full collections that free
    nothing: each one doubles the growth the next waits for, up to a cap. A full collection that
    gives back half the growth or more (garbage) resets it."""
    rss, garbage = [100 * MIB], [0]  # 5% of 100 MiB is under FULL_AFTER_GROWTH: the allowance starts at 32 MiB

    def return_freed_heap() -> None:  # what a full collection freed goes back to the OS
        rss[0] -= garbage[0]
        garbage[0] = 0

    collector = Collector(lambda: rss[0], Clock(), return_freed_heap)
    collector.collect()
    thresholds = []
    for _ in range(4):
        grown = 0
        while collector.full_collections == len(thresholds):
            rss[0] += MIB  # live: no full collection gives it back
            grown += MIB
            collector.collect()
        thresholds.append(grown // MIB)
    base = FULL_AFTER_GROWTH // MIB
    assert thresholds == [base, 2 * base, 4 * base, MAX_ALLOWANCE_FACTOR * base]

    rss[0] += MAX_ALLOWANCE_FACTOR * FULL_AFTER_GROWTH
    garbage[0] = MAX_ALLOWANCE_FACTOR * FULL_AFTER_GROWTH  # this time the growth is garbage
    collector.collect()
    rss[0] += FULL_AFTER_GROWTH
    collector.collect()  # back to the smallest allowance
    assert collector.full_collections == len(thresholds) + 2


def test_frozen_cyclic_garbage_waits_for_a_full_collection(thawed: None) -> None:
    class Cycle:
        def __init__(self) -> None:
            self.me = self

    rss = [0]
    collector = Collector(lambda: rss[0], Clock())
    held = [Cycle()]
    alive = weakref.ref(held[0])
    collector.collect()  # the cycle is alive, so it is frozen
    held.clear()
    collector.collect()  # young: the frozen cycle is garbage now, but not traversed
    assert collector.young_collections == 2 and alive() is not None
    rss[0] += 2 * FULL_AFTER_GROWTH
    collector.collect()
    assert collector.full_collections == 1 and alive() is None


def test_settling_collects_frozen_garbage_and_what_its_finalizers_leave_then_freezes_the_rest(thawed: None) -> None:
    """The session's end (``Collector.settle``): a frozen cycle that became garbage is collected,
    and so is the cycle its finalizer leaves behind (a second round); the survivors stay frozen,
    so pytest's five collections after it skip them, until ``thaw``."""
    left_by_finalizers = []

    class Cycle:
        def __init__(self, leaves_another: bool) -> None:
            self.me = self
            self.leaves_another = leaves_another

        def __del__(self) -> None:
            if self.leaves_another:
                left = Cycle(leaves_another=False)
                left_by_finalizers.append(weakref.ref(left))

    held = [Cycle(leaves_another=True)]
    first = weakref.ref(held[0])
    survivor = Cycle(leaves_another=False)
    collector = Collector(lambda: 0, Clock())
    collector.collect()  # both alive: frozen
    held.clear()
    collector.settle()
    assert first() is None and len(left_by_finalizers) == 1 and left_by_finalizers[0]() is None
    assert collector.freezing and not any(thing is survivor for thing in gc.get_objects())  # frozen: not listed
    collector.thaw()
    assert gc.get_freeze_count() == 0 and any(thing is survivor for thing in gc.get_objects())


def test_thaw_gives_every_object_back_to_the_collector(thawed: None) -> None:
    collector = Collector(lambda: 0, Clock())
    collector.collect()
    collector.thaw()
    assert gc.get_freeze_count() == 0 and not collector.freezing


@pytest.mark.linux  # malloc_trim hands freed heap back before each reading
@pytest.mark.forked_sessions  # its inner sessions import TensorFlow
def test_a_300_test_session_does_not_drift_up_from_frozen_garbage(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 MiB of cyclic garbage passes through the frozen generation; full collections reclaim it.
    The session is the benchmark's drift suite (``benchmarks/suite_overhead.py``)."""
    pytester.makepyfile(test_drift=DRIFT_MODULE.format(count=300))
    monkeypatch.setenv("DRIFT_FILE", str(pytester.path / "rss.txt"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=4GB", "-q")
    result.assert_outcomes(passed=300)
    readings = {int(index): float(mib) for index, mib in
                (line.split() for line in (pytester.path / "rss.txt").read_text().splitlines())}
    growth = {index: mib - readings[20] for index, mib in readings.items() if index > 20}
    # Unreclaimed, it would reach ~280 MiB; full collections after 32 MiB of growth keep it
    # within about that, plus what pytest itself keeps of each test (~30 MiB without tfmem).
    assert max(growth.values()) < 2 * FULL_AFTER_GROWTH / MIB, growth


AT_EXIT = """
import atexit, os

NOTES = os.open(os.environ["NOTES"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)


class Noted:
    def __init__(self, name):
        self.name, self.me = name, self  # a reference cycle: only a collection frees it

    def __del__(self, write=os.write, notes=NOTES):  # the module's globals are gone by then
        write(notes, f"finalized {self.name}\\n".encode())


kept = Noted("alive at exit")
atexit.register(lambda: Noted("garbage made at exit"))  # runs after tfmem's handler (registered later)


def test_nothing():
    pass
"""


@pytest.mark.parametrize(
    ("options", "alive_finalized"),
    [(["--tfmem-budget=1GB"], False), (["--tfmem-budget=1GB", "--tfmem-isolate"], False),
     (["--tfmem-budget=1GB", "--no-tfmem-freeze-at-exit"], True), (["-p", "no:tfmem"], True)],
    ids=["measured", "isolated (the session's process measures none itself)", "measured, --no-tfmem-freeze-at-exit",
         "without tfmem"],
)
def test_the_exit_skips_what_a_measured_session_left_alive_and_still_collects_new_garbage(
    tmp_path: Path, options: list[str], alive_finalized: bool
) -> None:
    """``--tfmem-freeze-at-exit``: the interpreter's last collection, after it cleared the modules,
    no longer goes through what was alive at exit (1 to 1.5 s with TensorFlow loaded), so a cycle
    alive at exit is not finalized; garbage made after tfmem's exit handler still is. So in the
    process of a session whose tests all ran isolated, which froze nothing itself. A fresh
    interpreter: a forked session ends with ``os._exit``, without that last collection."""
    (tmp_path / "test_exit.py").write_text(AT_EXIT)
    notes = tmp_path / "notes"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *options, "test_exit.py"],
        cwd=tmp_path, capture_output=True, text=True, check=False, env={**os.environ, "NOTES": str(notes)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    finalized = notes.read_text().splitlines()
    assert "finalized garbage made at exit" in finalized
    assert ("finalized alive at exit" in finalized) == alive_finalized, finalized
