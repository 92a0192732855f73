"""Scenario 4, models built in a loop: what piles up, and what keeps the loop flat.

Hyperparameter searches and cross-validation build model after model in one process. Each
function here is one iteration of such a loop (build, compile, fit a small model); run it
repeatedly, e.g. with ``pytest_tfmem.leaks.check.leak_check``. On TensorFlow 2.21 ``fit`` traces new
functions into the eager context's function library for every new model, and
``clear_session()`` does not empty it: the classic advice (``clear_session`` + ``del`` +
``gc.collect()``) still grows. It frees the Python objects, yet the fitted model's weights and
optimizer slots stay allocated in TensorFlow's runtime (``left_allocated_after_fit``), so the
leak per model grows with the model. Training eagerly (no traced functions) is flat, and so is
reusing one compiled model with its weights reset.
"""

from __future__ import annotations

import gc
import weakref
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from . import scale

FEATURES = 32
SAMPLES = int(256 * scale())


def _data(samples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((samples, FEATURES), dtype=np.float32), rng.random((samples, 1), dtype=np.float32)


def build_model() -> tf.keras.Model:
    return tf.keras.Sequential(
        [tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(1)]
    )


def _build_and_fit(samples: int, run_eagerly: bool = False) -> tf.keras.Model:
    model = build_model()
    model.compile(optimizer="adam", loss="mse", run_eagerly=run_eagerly)
    x, y = _data(samples)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    return model


def problem_no_cleanup(samples: int = SAMPLES) -> None:
    """``model = build(); model.fit(...)`` and on to the next one."""
    model = _build_and_fit(samples)  # noqa: F841  # dropped at return, as a loop body drops it


def problem_models_kept_in_a_list(models: list, samples: int = SAMPLES) -> None:
    """``models.append(model)``, then ``for model in models: del model``: the list keeps them all."""
    models.append(_build_and_fit(samples))
    for model in models:
        del model  # unbinds the loop variable only


def no_help_clear_session(samples: int = SAMPLES) -> None:
    """The classic advice: ``del model``, ``clear_session()``, ``gc.collect()``."""
    model = _build_and_fit(samples)
    del model
    tf.keras.backend.clear_session()
    gc.collect()


def fix_fit_eagerly(samples: int = SAMPLES) -> None:
    """``compile(run_eagerly=True)``: no function is traced, so nothing accumulates."""
    model = _build_and_fit(samples, run_eagerly=True)
    del model
    tf.keras.backend.clear_session()
    gc.collect()


class ReusedModel:
    """One compiled model for the whole loop; each iteration restarts it from the same weights."""

    def __init__(self, samples: int = SAMPLES) -> None:
        self.samples = samples
        self.model = build_model()
        self.model.compile(optimizer="adam", loss="mse")
        self.initial_weights = self.model.get_weights()

    def fix_reuse_one_model(self) -> None:
        self.model.set_weights(self.initial_weights)
        for variable in self.model.optimizer.variables:
            variable.assign(tf.zeros_like(variable))
        x, y = _data(self.samples)
        self.model.fit(x, y, batch_size=64, epochs=1, verbose=0)


class LeftAllocated(NamedTuple):
    model_collected: bool  # the Python model object is gone
    training_state: int  # bytes of the model's weights and its two Adam slots per weight
    still_allocated: int  # bytes TensorFlow's CPU allocator still holds for it


def left_allocated_after_fit(width: int = 512, inputs: int = 1024) -> LeftAllocated:
    """Fit one model, then ``del`` + ``clear_session()`` + ``gc.collect()``: what is left allocated?

    Needs TensorFlow's CPU allocator statistics (Linux x86 with oneDNN, the default).
    """

    def allocated() -> int:
        return tf.config.experimental.get_memory_info("CPU:0")["current"]

    before = allocated()
    model = tf.keras.Sequential(
        [tf.keras.Input((inputs,)), tf.keras.layers.Dense(width, activation="relu"), tf.keras.layers.Dense(1)]
    )
    model.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.random((256, inputs), dtype=np.float32), rng.random((256, 1), dtype=np.float32), verbose=0)
    training_state = 3 * 4 * model.count_params()  # float32 weights + Adam's two slots
    collected = weakref.ref(model)
    del model
    tf.keras.backend.clear_session()
    gc.collect()
    return LeftAllocated(collected() is None, training_state, allocated() - before)
