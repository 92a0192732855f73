"""Leak workload: a loop step that keeps 0.25-2 MB per call, or nothing, checked three ways.

Each step does temporary work (a 2 MB scratch array, small Python objects) and, when leaking,
keeps a ``Record`` holding ``leak_bytes`` in a module-level list, as a cache or a history
that outlives the test would. The record is a class instance, which the garbage collector
tracks, so counting objects by type can see it (a dict holding only numbers and arrays is
not tracked, and would be invisible to that approach). Every check runs the step 3 times
to warm up and 10 times measured. ``$TFMEM_BENCH_CONTENDER`` picks how the test checks.
"""

import collections
import gc
import os

import numpy as np
import pytest

LEAK_SIZES_MB = (0, 0.25, 0.5, 1, 2)  # 0: the leak-free loop
RUNS = int(os.environ.get("TFMEM_BENCH_RUNS", "20"))
WARMUP = 3
ITERATIONS = 10

KEPT = []  # what a leaking step keeps; emptied after each test


@pytest.fixture(autouse=True)
def forget_kept_records():
    yield
    KEPT.clear()


class Record:
    def __init__(self, checksum, output):
        self.checksum = checksum
        self.output = output


def make_step(leak_bytes):
    def step():
        scratch = np.ones(2 * 10**6, dtype=np.uint8)
        checksum = int(scratch[::4096].sum()) + sum(str(i).count("1") for i in range(1000))
        if leak_bytes:
            KEPT.append(Record(checksum, np.ones(leak_bytes, dtype=np.uint8)))

    return step


def check_with_tfmem(step, request):
    tfmem = request.getfixturevalue("tfmem")  # pytest-tfmem's fixture (the plugin is off for the others)
    max_growth = os.environ["TFMEM_BENCH_MAX_GROWTH"]
    tfmem.assert_no_leak(step, iterations=ITERATIONS, warmup=WARMUP, max_growth=max_growth)


def check_with_memray(step, request):
    # limit_leaks (added by the benchmark plugin) judges what the test leaves allocated.
    for _ in range(WARMUP + ITERATIONS):
        step()


def count_objects_by_type(exclude=None):
    gc.collect()
    counts = collections.Counter()
    for obj in gc.get_objects():  # a plain loop: Counter(generator) would fill ABC caches
        if obj is not exclude:
            counts[type(obj)] += 1
    return counts


def check_by_object_count(step, request):
    """TensorFlow's ``assert_no_new_pyobjects_executing_eagerly`` idea, by hand: warm up,
    count gc-tracked objects by type, run, count again; any type that grew fails."""
    for _ in range(WARMUP):
        step()
    before = count_objects_by_type()
    for _ in range(ITERATIONS):
        step()
    after = count_objects_by_type(exclude=before)
    grown = {kind.__name__: after[kind] - before[kind] for kind in after if after[kind] > before[kind]}
    assert not grown, f"new objects by type after {ITERATIONS} iterations: {grown}"


CHECKS = {"tfmem-leak": check_with_tfmem, "memray-leaks": check_with_memray, "object-count": check_by_object_count}


@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize("leak_mb", LEAK_SIZES_MB)
def test_leak(request, leak_mb, run):
    CHECKS[os.environ["TFMEM_BENCH_CONTENDER"]](make_step(int(leak_mb * 10**6)), request)
