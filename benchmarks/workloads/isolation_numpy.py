"""Isolation workload: small tests that import only numpy."""

import os

import numpy as np
import pytest

TESTS = int(os.environ.get("TFMEM_BENCH_TESTS", "4"))


@pytest.mark.parametrize("run", range(TESTS))
def test_small_numpy(run):
    assert np.ones(10**5).sum() == 10**5
