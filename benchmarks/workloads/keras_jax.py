"""Keras 3 on JAX, measured like TensorFlow (docs/backends.md).

    KERAS_BACKEND=jax pytest benchmarks/workloads/keras_jax.py --tfmem-budget=1GB -p no:cacheprovider -p no:randomly

A sum of a small ``jax.numpy`` array, a small fit, a search that keeps a model per width (each
width compiles new code), a leak check over such a search, and a test over its own budget.
"""

import jax.numpy as jnp
import keras
import numpy as np
import pytest

KEPT = []


def fit(width):
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((64, width), "float32"), np.ones((64, 1), "float32"), epochs=1, verbose=0)
    return model


def test_sum():
    assert float(jnp.arange(1000.0).sum()) == 499500.0


def test_fit():
    fit(8)


def test_search_keeps_a_model_per_width():
    KEPT.extend(fit(width) for width in range(10, 26))


def test_search_over_widths_in_a_loop(tfmem):
    widths = iter(range(30, 300))
    tfmem.assert_no_leak(lambda: fit(next(widths)), iterations=6, warmup=2, max_growth="2MB")


@pytest.mark.tfmem(budget="20MB")
def test_over_budget():
    block = jnp.ones((48 * 2**20 // 4,), "float32").block_until_ready()
    del block
