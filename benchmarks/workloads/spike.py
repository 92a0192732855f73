"""Spike workload: 250 MB that lives 5 ms, once per test."""

import os
import time

import numpy as np
import pytest

SPIKE_BYTES = 250 * 10**6
RUNS = int(os.environ.get("TFMEM_BENCH_RUNS", "20"))


@pytest.mark.parametrize("run", range(RUNS))
def test_spike(run):
    spike = np.ones(SPIKE_BYTES, dtype=np.uint8)  # ones, not empty: every page is touched
    time.sleep(0.005)
    del spike
