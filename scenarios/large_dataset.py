"""Scenario 1, large dataset: the whole dataset in memory vs streamed from files on disk.

The same shards of samples on disk are read two ways. The problem loads them all into numpy
and hands them to ``tf.data.Dataset.from_tensor_slices``, which copies them into a tensor:
the peak grows with the dataset (two to three copies of it). The fix streams the shards,
memory-mapped, through ``tf.data.Dataset.from_generator`` one batch at a time: the peak
stays flat whatever the dataset's size.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tensorflow as tf

from . import scale

FEATURES = 784
CLASSES = 10
BATCH_SIZE = 256
SHARD_SAMPLES = 5_000
SAMPLES = int(30_000 * scale())  # 94 MB of float32 features at scale 1


def write_shards(directory: Path, samples: int = SAMPLES, seed: int = 0) -> Path:
    """Write ``samples`` random samples as ``.npy`` shards (features, labels) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for index, first in enumerate(range(0, samples, SHARD_SAMPLES)):
        count = min(SHARD_SAMPLES, samples - first)
        _save_atomic(directory / f"shard-{index:04d}-x.npy", rng.random((count, FEATURES), dtype=np.float32))
        _save_atomic(directory / f"shard-{index:04d}-y.npy", rng.integers(0, CLASSES, count, dtype=np.int32))
    return directory


def _save_atomic(path: Path, array: np.ndarray) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as stream:
        np.save(stream, array)
    os.replace(temporary, path)


def _shards(directory: Path, samples: int) -> list[tuple[Path, Path]]:
    """The (features, labels) shard files holding the first ``samples`` samples."""
    features = sorted(directory.glob("shard-*-x.npy"))[: -(-samples // SHARD_SAMPLES)]
    if len(features) * SHARD_SAMPLES < samples:
        raise ValueError(f"{directory} holds fewer than {samples} samples: write them with write_shards first")
    return [(x, x.with_name(x.name.replace("-x.npy", "-y.npy"))) for x in features]


def in_memory_dataset(directory: Path, samples: int = SAMPLES) -> tf.data.Dataset:
    """Problem: the shards loaded, concatenated, then copied into a tensor."""
    shards = _shards(directory, samples)
    x = np.concatenate([np.load(x_path) for x_path, _ in shards])[:samples]
    y = np.concatenate([np.load(y_path) for _, y_path in shards])[:samples]
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH_SIZE)


def streamed_dataset(directory: Path, samples: int = SAMPLES) -> tf.data.Dataset:
    """Fix: the shards memory-mapped and read one batch at a time."""
    shards = _shards(directory, samples)

    def batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        remaining = samples
        for x_path, y_path in shards:
            x, y = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
            for first in range(0, min(len(x), remaining), BATCH_SIZE):
                last = min(first + BATCH_SIZE, remaining)
                yield np.array(x[first:last]), np.array(y[first:last])
            remaining -= len(x)

    signature = (tf.TensorSpec((None, FEATURES), tf.float32), tf.TensorSpec((None,), tf.int32))
    dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
    return dataset.apply(tf.data.experimental.assert_cardinality(-(-samples // BATCH_SIZE)))


def train_one_epoch(dataset: tf.data.Dataset) -> float:
    """A small classifier trained for one epoch; returns the last loss."""
    model = tf.keras.Sequential(
        [tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(CLASSES)]
    )
    model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(dataset, epochs=1, shuffle=False, verbose=0)
    return float(history.history["loss"][-1])


def problem_in_memory(directory: Path, samples: int = SAMPLES) -> float:
    return train_one_epoch(in_memory_dataset(directory, samples))


def fix_streamed(directory: Path, samples: int = SAMPLES) -> float:
    return train_one_epoch(streamed_dataset(directory, samples))
