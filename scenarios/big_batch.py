"""Scenario 3, big batch: a training step's memory grows with the batch size.

Each sample of the batch brings its activations and their gradients (here ~1 MB per 64x64
image through one convolution). The fix is a smaller batch; ``find_max_batch_size`` finds the
largest batch that fits a budget, one isolated trial per batch size.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from . import scale

IMAGE = (64, 64, 3)
CLASSES = 10
PROBLEM_BATCH = int(128 * scale())
FIX_BATCH = 32


def build_model() -> tf.keras.Model:
    return tf.keras.Sequential(
        [
            tf.keras.Input(IMAGE),
            tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            tf.keras.layers.MaxPooling2D(8),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(CLASSES),
        ]
    )


def train_step(batch_size: int) -> float:
    """One training step of a fresh model on one random batch; returns the loss."""
    model = build_model()
    model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.random((batch_size, *IMAGE), dtype=np.float32)
    y = rng.integers(0, CLASSES, batch_size)
    history = model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)
    return float(history.history["loss"][-1])


def problem_big_batch(batch_size: int = PROBLEM_BATCH) -> float:
    return train_step(batch_size)


def fix_small_batch(batch_size: int = FIX_BATCH) -> float:
    return train_step(batch_size)
