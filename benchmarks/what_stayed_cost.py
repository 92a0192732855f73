"""What weighing the objects a test left behind costs, per object.

    python -m benchmarks.what_stayed_cost [--objects 30000]

After a test that left more than ``--tfmem-stayed-threshold``, tfmem lists the objects that
survived it and sizes each (``session.stayed``). Keras's own layer tests leave 20,000 to 40,000
new objects each, mostly functions, tuples, lists and dicts. This makes such objects (NumPy arrays
among them), then times, side by side in one run, the look at
what stayed as tfmem does it (each type's getters looked up once) and the same objects sized one
by one with ``size_of`` (each object's type looked up again), the median of 5 each.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pytest_tfmem.probes.objects import size_of
from pytest_tfmem.session.stayed import Watcher

ROUNDS = 5


def median_ms(work: Callable[[], Any]) -> float:
    spent = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        work()
        spent.append(time.perf_counter() - started)
    return statistics.median(spent) * 1000


def left_behind(count: int) -> list[Any]:
    """About ``count`` new objects of the kinds a test of a Keras layer leaves most of."""
    kept: list[Any] = []
    while len(gc.get_objects()) < count:
        kept += [({"step": len(kept)}, [len(kept)], (len(kept), "x"), np.ones(4), lambda: None) for _ in range(500)]
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=30_000, help="new objects to weigh (default 30000)")
    arguments = parser.parse_args(argv)
    watcher = Watcher()
    gc.collect()
    gc.freeze()  # as tfmem does at each window: gc.get_objects() then lists only what came since
    before = watcher.snapshot()
    kept = left_behind(arguments.objects)
    objects = gc.get_objects()
    stayed = watcher.what_stayed(before, objects)
    by_type = median_ms(lambda: watcher.what_stayed(before, objects))
    one_by_one = median_ms(lambda: sum(map(size_of, objects)))
    print(f"{len(objects):,} new objects, {len(kept):,} of them kept by the test in a list")
    print(f"what stayed, as tfmem reads it: {by_type:.1f} ms ({by_type * 1000 / len(objects):.2f} us an object)")
    print(f"the same objects sized one by one: {one_by_one:.1f} ms ({one_by_one * 1000 / len(objects):.2f} us an "
          f"object): x{one_by_one / by_type:.1f}")
    print("\n".join(stayed.lines(sum(map(size_of, objects)))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
