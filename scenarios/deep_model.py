"""Scenario 2, deep model: what actually lowers a big model's memory on a CPU.

Training a wide, deep float32 model with Adam holds the weights, their gradients and two Adam
slots per weight: four copies of the parameters. Measured here (see docs/scenarios.md):
fewer parameters, bfloat16 weights and an optimizer without per-weight state lower the peak;
mixed precision (``mixed_float16``, ``mixed_bfloat16``) does not on CPU, since it keeps
float32 weights and adds low-precision copies. For inference, post-training quantization
(TensorFlow Lite, int8 weights) needs a fraction of what the float32 Keras model does.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import tensorflow as tf

from . import scale

INPUTS = 1024
CLASSES = 10
DEPTH = 6
WIDTH = int(1536 * math.sqrt(scale()))  # ~13 M parameters, 54 MB of float32 weights at scale 1
BATCH_SIZE = 64
STEPS = 4


def build_model(width: int = WIDTH, dtype: str = "float32") -> tf.keras.Model:
    """``DEPTH`` dense layers of ``width`` units; the output layer stays float32 for a stable loss."""
    hidden = [tf.keras.layers.Dense(width, activation="relu", dtype=dtype) for _ in range(DEPTH)]
    return tf.keras.Sequential([tf.keras.Input((INPUTS,)), *hidden, tf.keras.layers.Dense(CLASSES, dtype="float32")])


def train(width: int = WIDTH, dtype: str = "float32", optimizer: str = "adam") -> float:
    """Train a few steps on random data; returns the last loss."""
    model = build_model(width, dtype)
    model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.random((BATCH_SIZE * STEPS, INPUTS), dtype=np.float32)
    y = rng.integers(0, CLASSES, BATCH_SIZE * STEPS)
    history = model.fit(x, y, batch_size=BATCH_SIZE, epochs=1, verbose=0)
    return float(history.history["loss"][-1])


def problem_float32_adam(width: int = WIDTH) -> float:
    return train(width)


def fix_fewer_parameters(width: int = WIDTH) -> float:
    """A third of the width: a ninth of the parameters."""
    return train(width // 3)


def fix_bfloat16_weights(width: int = WIDTH) -> float:
    """Weights, gradients and optimizer slots in bfloat16: half the bytes (and less precision)."""
    return train(width, dtype="bfloat16")


def fix_stateless_optimizer(width: int = WIDTH) -> float:
    """Plain SGD keeps no per-weight state; Adam keeps two slots per weight."""
    return train(width, optimizer="sgd")


def no_help_mixed_float16(width: int = WIDTH) -> float:
    return train(width, dtype="mixed_float16")


def no_help_mixed_bfloat16(width: int = WIDTH) -> float:
    return train(width, dtype="mixed_bfloat16")


def save_for_inference(directory: Path, width: int = WIDTH) -> tuple[Path, Path]:
    """Save the model as ``.keras`` and as int8-quantized ``.tflite`` (dynamic range quantization)."""
    directory.mkdir(parents=True, exist_ok=True)
    model = build_model(width)
    keras_path, tflite_path = directory / "model.keras", directory / "model-int8.tflite"
    model.save(keras_path)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    temporary = tflite_path.with_name(f".{tflite_path.name}.tmp")
    temporary.write_bytes(converter.convert())
    temporary.replace(tflite_path)
    return keras_path, tflite_path


def _inputs() -> np.ndarray:
    return np.random.default_rng(1).random((BATCH_SIZE, INPUTS), dtype=np.float32)


def problem_float32_inference(keras_path: Path) -> np.ndarray:
    """Load the float32 Keras model and predict one batch."""
    model = tf.keras.models.load_model(keras_path)
    return model.predict(_inputs(), verbose=0)


def fix_quantized_inference(tflite_path: Path) -> np.ndarray:
    """Load the int8-quantized model into the TensorFlow Lite interpreter and run one batch."""
    interpreter = tf.lite.Interpreter(model_path=str(tflite_path))
    source, target = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    interpreter.resize_tensor_input(source["index"], (BATCH_SIZE, INPUTS))
    interpreter.allocate_tensors()
    interpreter.set_tensor(source["index"], _inputs())
    interpreter.invoke()
    return interpreter.get_tensor(target["index"])
