"""Overhead workload: a small Keras model built, compiled and fitted, as separate tests."""

import os

import keras
import numpy as np
import pytest

TESTS = int(os.environ.get("TFMEM_BENCH_TESTS", "3"))


@pytest.mark.parametrize("run", range(TESTS))
def test_keras_fit(run):
    rng = np.random.default_rng(run)
    x = rng.random((512, 32), dtype=np.float32)
    y = rng.random((512, 1), dtype=np.float32)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    history = model.fit(x, y, epochs=2, batch_size=32, verbose=0)
    assert len(history.history["loss"]) == 2
