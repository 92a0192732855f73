"""Scenario 2, deep model: what actually lowers a big model's memory on a CPU.

Training a wide, deep float32 model with Adam holds the weights, their gradients and two Adam
slots per weight: four copies of the parameters. Measured here (see docs/scenarios.md):
fewer parameters, bfloat16 weights and an optimizer without per-weight state lower the peak;
mixed precision (``mixed_float16``, ``mixed_bfloat16``) does not on CPU, since it keeps
float32 weights and adds low-precision copies. For inference, post-training quantization
(TensorFlow Lite, int8 weights) needs a fraction of what the float32 Keras model does.

Pruning (tensorflow-model-optimization's ``prune_low_magnitude``) is measured rather than
assumed: the training peak with its wrappers, and the stripped model's saved file, plain and
gzip-compressed, beside the dense model's (``train_pruned``, ``saved_size``).
"""

from __future__ import annotations

import importlib
import math
import os
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from pytest_tfmem.units import format_size

from . import keras_3, scale

INPUTS = 1024
CLASSES = 10
DEPTH = 6
WIDTH = int(1536 * math.sqrt(scale()))  # ~13 M parameters, 54 MB of float32 weights at scale 1
BATCH_SIZE = 64
STEPS = 4
PRUNED_SPARSITY = 0.5  # the share of each kernel's weights the pruning wrappers set to zero
LEGACY_KERAS_VARIABLE = "TF_USE_LEGACY_KERAS"
SMALLER = 0.9  # a pruned file at most this share of the dense one's size counts as smaller


def build_model(width: int = WIDTH, dtype: str = "float32", keras: ModuleType | None = None) -> Any:
    """``DEPTH`` dense layers of ``width`` units; the output layer stays float32 for a stable loss.

    ``keras`` is the Keras module to build with (default ``tf.keras``).
    """
    keras = keras or tf.keras
    hidden = [keras.layers.Dense(width, activation="relu", dtype=dtype) for _ in range(DEPTH)]
    return keras.Sequential([keras.Input((INPUTS,)), *hidden, keras.layers.Dense(CLASSES, dtype="float32")])


def _fit(
    model: Any,
    optimizer: str = "adam",
    keras: ModuleType | None = None,
    callbacks: list | None = None,
    steps: int = STEPS,
    batch_size: int = BATCH_SIZE,
) -> float:
    """Compile with ``optimizer`` and train ``steps`` steps of ``batch_size`` on random data;
    returns the last loss."""
    keras = keras or tf.keras
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.random((batch_size * steps, INPUTS), dtype=np.float32)
    y = rng.integers(0, CLASSES, batch_size * steps)
    history = model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0, callbacks=callbacks)
    return float(history.history["loss"][-1])


def train(
    width: int = WIDTH,
    dtype: str = "float32",
    optimizer: str = "adam",
    steps: int = STEPS,
    batch_size: int = BATCH_SIZE,
) -> float:
    """Train a few steps on random data; returns the last loss."""
    return _fit(build_model(width, dtype), optimizer, steps=steps, batch_size=batch_size)


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
    # Two steps of 8, not STEPS of BATCH_SIZE: CPUs compute float16 slowly (~7 s a step of 64
    # here, against 0.3 s in float32). The weights, their float16 copies, the gradients and Adam's
    # slots are the peak (a batch of 64's activations are ~2 MB of it), so after two steps it
    # already needs more than float32 with Adam, which is all this variant shows.
    return train(width, dtype="mixed_float16", steps=2, batch_size=8)


def no_help_mixed_bfloat16(width: int = WIDTH) -> float:
    return train(width, dtype="mixed_bfloat16")


class SavedSize(NamedTuple):
    plain: int  # bytes of the saved file
    compressed: int  # bytes of that file gzip-compressed (level 6), as it would be shipped


def saved_size(path: Path, model: Any = None) -> SavedSize:
    """The size of the model file at ``path`` (saving ``model`` there first if given), plain and
    compressed. Compressed in chunks: the file is never held in memory whole."""
    if model is not None:
        model.save(path)
    compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # the gzip format
    compressed = 0
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            compressed += len(compressor.compress(chunk))
    compressed += len(compressor.flush())
    return SavedSize(path.stat().st_size, compressed)


def pruning_api() -> tuple[ModuleType, ModuleType]:
    """``tfmot.sparsity.keras`` and the Keras it prunes with: tf-keras, since it needs Keras 2.

    Importing tensorflow-model-optimization (0.8) sets ``TF_USE_LEGACY_KERAS=1`` in
    ``os.environ``, then takes ``tf_keras`` where ``tf.keras`` is Keras 3. Had ``tf.keras`` not
    been resolved yet, that variable would make it tf-keras for the whole process, and it would
    reach every process started afterwards. So ``tf.keras`` is resolved first and the variable
    restored: the process and its children keep their Keras. Raises ``ImportError`` where the
    package or tf-keras is missing.
    """
    keras = importlib.import_module("tf_keras") if keras_3() else tf.keras
    before = os.environ.get(LEGACY_KERAS_VARIABLE)
    try:
        tfmot = importlib.import_module("tensorflow_model_optimization")
    finally:
        if before is None:
            os.environ.pop(LEGACY_KERAS_VARIABLE, None)
        else:
            os.environ[LEGACY_KERAS_VARIABLE] = before
    return tfmot.sparsity.keras, keras


def train_pruned(width: int = WIDTH) -> Any:
    """The problem's training (float32, Adam) with ``prune_low_magnitude`` wrappers; returns the
    wrapped model, ``PRUNED_SPARSITY`` of each kernel zero.

    Each wrapper adds a mask as large as its kernel. The mask is computed once, at the first step
    (its threshold comes from sorting the kernel's weights: seconds on a CPU), and applied at
    every step.
    """
    pruning, keras = pruning_api()
    model = build_model(width, keras=keras)
    schedule = pruning.ConstantSparsity(PRUNED_SPARSITY, begin_step=1, frequency=STEPS)
    pruned = pruning.prune_low_magnitude(model, pruning_schedule=schedule)
    _fit(pruned, keras=keras, callbacks=[pruning.UpdatePruningStep()])
    return pruned


def strip_pruning(pruned: Any) -> Any:
    """The model without its wrappers (plain Dense layers with the pruned kernels), as shipped."""
    return pruning_api()[0].strip_pruning(pruned)


def save_dense(path: Path, width: int = WIDTH) -> SavedSize:
    """The size of the model as built, without pruning, saved to ``path`` (for comparison)."""
    return saved_size(path, build_model(width, keras=pruning_api()[1]))


def warm_up_pruning(directory: Path) -> None:
    """Pay tf-keras's, the pruning wrappers' and saving's first-use costs on a tiny model."""
    saved_size(directory / "warm-up.h5", strip_pruning(train_pruned(width=8)))
    pruning_api()[1].backend.clear_session()


def zero_share(model: Any) -> float:
    """The share of zeros among the weights of the model's Dense kernels."""
    kernels = [layer.kernel.numpy() for layer in model.layers if hasattr(layer, "kernel")]
    return sum(int((k == 0).sum()) for k in kernels) / sum(k.size for k in kernels)


def pruning_advice(training_peak: int, budget: int, pruned: SavedSize, dense: SavedSize) -> tuple[str, str, str]:
    """What the pruning measurement says: its role (``fix`` where the training peak with the
    wrappers fits the training budget, else ``no help``), the reason, and a note on the peak and
    the saved file, worded from the ratios of the stripped model's file to the dense one's."""
    role, reason = ("fix", "under budget") if training_peak <= budget else ("no help", "over budget")
    plain, compressed = pruned.plain / dense.plain, pruned.compressed / dense.compressed
    if compressed > SMALLER:
        file = "no smaller, even compressed"
    elif plain > SMALLER:
        file = "smaller only compressed (to ship); as large on disk"
    else:
        file = "smaller on disk and compressed"
    note = (f"pruning: training peak {format_size(training_peak)} ({training_peak / budget:.2f}x the budget); "
            f"stripped model saved {format_size(pruned.plain)} ({plain:.2f}x the dense model's file), "
            f"gzip {format_size(pruned.compressed)} ({compressed:.2f}x the dense file's gzip): {file}")
    return role, reason, note


def converter_keras() -> ModuleType:
    """The Keras whose models TensorFlow Lite's converter takes: ``tf.keras``, but tf-keras on
    TensorFlow 2.16 with Keras 3. There the converter aborts the process on any Keras 3 model
    ("LLVM ERROR: Failed to infer result type(s)", tensorflow/tensorflow#63987); 2.21's does not.
    Raises ``ImportError`` where tf-keras is needed and missing."""
    major, minor = (int(part) for part in tf.__version__.split(".")[:2])
    if keras_3() and (major, minor) < (2, 17):
        return importlib.import_module("tf_keras")
    return tf.keras


def save_for_inference(directory: Path, width: int = WIDTH) -> tuple[Path, Path]:
    """Save the model as ``.keras`` and as int8-quantized ``.tflite`` (dynamic range quantization;
    the same layers and weights, built with ``converter_keras()`` where that is not ``tf.keras``)."""
    directory.mkdir(parents=True, exist_ok=True)
    model = build_model(width)
    keras_path, tflite_path = directory / "model.keras", directory / "model-int8.tflite"
    model.save(keras_path)
    keras = converter_keras()
    if keras is not tf.keras:
        converted = build_model(width, keras=keras)
        converted.set_weights(model.get_weights())
        model = converted
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
