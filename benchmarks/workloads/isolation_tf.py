"""Isolation workload: small tests in a module that imports TensorFlow."""

import os

import pytest
import tensorflow as tf

TESTS = int(os.environ.get("TFMEM_BENCH_TESTS", "3"))


@pytest.mark.parametrize("run", range(TESTS))
def test_small_tf(run):
    assert float(tf.reduce_sum(tf.ones((100, 100)))) == 10**4
