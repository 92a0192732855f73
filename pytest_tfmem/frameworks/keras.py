"""Keras 3's first use: the one-time costs of the first ``fit``, ``evaluate`` and ``predict`` in a
process, whichever backend Keras runs on, paid on tiny models before the first measured test.

The first fit of a process loads Keras's training machinery and the backend's kernels for it,
the first optimizer of a kind its update, the first conv, LSTM or embedding layer its kernels:
charged to whichever test does it first, they made a small test's figure move by several times
with the order of the tests (docs/measurement.md, "First use is not charged").

Keras 3 keeps its global state (the counters behind ``dense``, ``dense_1``, its seed generator,
dtype policy and scopes) in the two thread-local trackers of ``keras.src.backend.common
.global_state``, which its functions look up by module attribute at each call. The warm-up runs
with fresh trackers in their place and puts the session's back after it, so a test reads the
names, seeds and ``keras.config`` values it reads without tfmem. Imports nothing: Keras and its
backend were imported by the code under test, and every piece used is an attribute of the
loaded ``keras`` module.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from .base import imported

MODULE = "keras"
GLOBAL_STATE = "keras.src.backend.common.global_state"
TRACKERS = ("GLOBAL_STATE_TRACKER", "GLOBAL_SETTINGS_TRACKER")
NAME = "Keras"


def loaded_keras(finishing: str = "") -> ModuleType | None:
    """Keras 3 where user code imported it: fully, or (``finishing``) as the import of the module
    named ``finishing`` ends, with its code run (a test's own ``import keras``)."""
    keras = imported(MODULE) or (sys.modules.get(MODULE) if finishing else None)
    state = sys.modules.get(GLOBAL_STATE)
    if keras is None or state is None or not all(hasattr(state, tracker) for tracker in TRACKERS):
        return None  # not imported, or Keras 2 (tf-keras, or keras 2.x): another global state
    return keras if hasattr(keras, "Sequential") else None


def backend(keras: ModuleType) -> str:
    """The backend the loaded Keras runs on (``tensorflow``, ``jax``, ``torch``)."""
    return str(keras.backend.backend())


@contextmanager
def fresh_global_state() -> Iterator[None]:
    """Keras's global state replaced by an empty one for the block, the session's put back after."""
    state = sys.modules[GLOBAL_STATE]
    kept = {tracker: getattr(state, tracker) for tracker in TRACKERS}
    for tracker in TRACKERS:
        setattr(state, tracker, threading.local())
    try:
        yield
    finally:
        for tracker, value in kept.items():
            setattr(state, tracker, value)


# Backends on which the warm-up runs whole. JAX compiles every model anew, kernels included: there
# a fit of one layer pays what is paid once (the compiler's and Keras's trainer's start), and more
# would save a test nothing and cost seconds at the session's start.
WHOLE_ON = ("tensorflow", "torch")


def warm_up(keras: ModuleType, zeros: Any) -> None:
    """A tiny model fitted with Adam (validation data, metrics, a callback: Keras's training and
    evaluation machinery), and a conv and an embedding model used to predict (Keras's prediction
    machinery with them); on a backend not ``WHOLE_ON``, one layer fitted with Adam.
    ``zeros(shape, dtype)`` makes the inputs (NumPy's: every backend's ``fit`` takes them). What
    it costs and saves: docs/measurement.md, "First use is not charged"."""
    layers = keras.layers
    x, y = zeros((16, 4), "float32"), zeros((16, 1), "float32")
    with fresh_global_state():
        if backend(keras) not in WHOLE_ON:
            model = keras.Sequential([keras.Input((4,)), layers.Dense(1)])
            model.compile(optimizer="adam", loss="mse")
            model.fit(x, y, batch_size=8, verbose=0)
            return
        model = keras.Sequential([keras.Input((4,)), layers.Dense(4, activation="relu"), layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse", metrics=["mae", "accuracy"])
        stop = keras.callbacks.EarlyStopping(patience=1)
        model.fit(x, y, batch_size=8, validation_data=(x, y), callbacks=[stop], verbose=0)
        kernels = [
            ([keras.Input((8, 8, 1)), layers.Conv2D(2, 3, activation="relu"), layers.MaxPooling2D(), layers.Flatten()],
             zeros((4, 8, 8, 1), "float32")),
            ([keras.Input((4,), dtype="int32"), layers.Embedding(8, 2), layers.GlobalAveragePooling1D()],
             zeros((4, 4), "int32")),
        ]
        for model_layers, inputs in kernels:
            keras.Sequential([*model_layers, layers.Dense(1)]).predict(inputs, verbose=0)
