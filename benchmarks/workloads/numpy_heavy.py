"""Overhead workload: many small numpy allocations and matrix products (no TensorFlow)."""

import os

import numpy as np
import pytest

TESTS = int(os.environ.get("TFMEM_BENCH_TESTS", "3"))


@pytest.mark.parametrize("run", range(TESTS))
def test_numpy_heavy(run):
    rng = np.random.default_rng(run)
    total = 0.0
    for _ in range(100):
        blocks = [rng.random(2_000) for _ in range(50)]  # small arrays: glibc heap, not mmap
        matrix = rng.random((200, 200))
        total += float((matrix @ matrix.T).trace()) + sum(float(block.sum()) for block in blocks)
    assert total > 0
