"""A small Keras-style suite whose process creeps while every test is small (docs/session.md).

    pytest benchmarks/workloads/session_keras.py --tfmem-report=session.json -p no:cacheprovider

Four ordinary ``fit`` tests on a module-scoped dataset, one that keeps its model in a module
list, one that caches an array in a module dict, one that keeps a tensor alive.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

MODELS = []  # models kept by a test: they stay for the whole session
_CACHE = {}


@pytest.fixture(scope="module")
def dataset():
    rng = np.random.default_rng(0)
    return rng.random((40_000, 128), dtype=np.float32), rng.random((40_000, 1), dtype=np.float32)


def _model():
    model = keras.Sequential([keras.Input((128,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.mark.parametrize("run", range(4))
def test_fit(dataset, run):
    x, y = dataset
    history = _model().fit(x[:4096], y[:4096], epochs=1, batch_size=256, verbose=0)
    assert len(history.history["loss"]) == 1


def test_fit_and_keep_the_model(dataset):
    x, y = dataset
    model = _model()
    model.fit(x[:4096], y[:4096], epochs=1, batch_size=256, verbose=0)
    MODELS.append(model)


def test_caches_the_features(dataset):
    _CACHE["features"] = np.concatenate([dataset[0]] * 2)  # 39 MiB, kept


def test_keeps_a_tensor():
    _CACHE["noise"] = tf.random.normal((4096, 1024))  # 16 MiB of tensor, alive
