"""Overhead workload: eight small Keras fits on tf.keras, one test each (explain_overhead.py and
trace_overhead.py time them)."""

import numpy as np
import pytest
import tensorflow as tf


@pytest.mark.parametrize("run", range(8))
def test_small_fit(run):
    model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64), tf.keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.fit(np.zeros((256, 32), "float32"), np.zeros((256, 1), "float32"), batch_size=32, epochs=1, verbose=0)
