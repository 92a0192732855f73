"""TensorFlow's own view of memory: allocator statistics per device, and Keras clean-up.

Nothing here imports TensorFlow: every function works on the module only once the user's
code has imported it, so host budgets cost nothing to projects without TensorFlow.
TensorFlow pools freed memory and never returns it to the OS, so after a heavier test a
TF-heavy test may not raise RSS at all; the allocator's ``peak - current at start`` still
reads what the test needed (see README, "What is measured").
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any


def loaded_tensorflow() -> ModuleType | None:
    """The ``tensorflow`` module if user code has imported it (fully), else ``None``."""
    tf = sys.modules.get("tensorflow")
    if tf is None or not hasattr(tf, "config"):
        return None
    return tf


def _eager_context() -> Any:
    from tensorflow.python.eager import context  # only reached once TF is loaded

    return context.context()


def runtime_started() -> bool:
    """True once TensorFlow has initialised its devices (after which they can't be configured)."""
    if loaded_tensorflow() is None:
        return False
    return bool(getattr(_eager_context(), "_initialized", True))


def runtime_started_elsewhere() -> bool:
    """``runtime_started`` for a thread other than the one running TensorFlow: true once
    ``import tensorflow`` has completed and the runtime has initialised its devices. It looks
    at what is already imported and creates nothing (no eager context, no import), so the
    code being watched can still configure its devices."""
    tf = sys.modules.get("tensorflow")
    if tf is None or getattr(getattr(tf, "__spec__", None), "_initializing", False) or not hasattr(tf, "config"):
        return False
    context = getattr(sys.modules.get("tensorflow.python.eager.context"), "_context", None)
    return bool(context is not None and getattr(context, "_initialized", False))


def start_runtime(tf: ModuleType) -> None:
    """Initialise TF's devices and run one tiny op, so the runtime's own start-up memory
    is not charged to whichever test happens to run its first op."""
    tf.config.list_logical_devices()
    tf.reduce_sum(tf.ones((8, 8)) @ tf.ones((8, 8))).numpy()


class TFAllocator:
    """A peak source over one device's TF allocator (``tf.config.experimental`` stats).

    ``pool_estimate`` is the highest level in use seen in this process (every peak is read
    before it is reset). TensorFlow does not say how large its pool is; a pooling allocator
    (BFC, oneDNN's) keeps what it once held, so the highest level ever in use is the estimate.
    """

    def __init__(self, tf: ModuleType, device: str) -> None:
        self._experimental = tf.config.experimental
        self.device = device
        self.name = f"tf:{device}"
        self.pool_estimate = 0

    def current(self) -> int:
        level = int(self._experimental.get_memory_info(self.device)["current"])
        self.pool_estimate = max(self.pool_estimate, level)
        return level

    def peak(self) -> int:
        level = int(self._experimental.get_memory_info(self.device)["peak"])
        self.pool_estimate = max(self.pool_estimate, level)
        return level

    def reset_peak(self) -> None:
        self.peak()  # the highest level since the last reset counts towards the pool
        self._experimental.reset_memory_stats(self.device)


def allocator_sources(tf: ModuleType) -> list[TFAllocator]:
    """One source per logical device whose allocator keeps statistics.

    ``CPU:0`` keeps them on Linux x86 with oneDNN on (the default); GPUs always do.
    """
    sources = []
    for logical in tf.config.list_logical_devices():
        device = logical.name.split("device:", 1)[-1]
        source = TFAllocator(tf, device)
        try:
            source.current()
        except (ValueError, RuntimeError, tf.errors.OpError):
            continue
        sources.append(source)
    return sources


def clear_keras_sessions() -> list[str]:
    """Call ``clear_session()`` of every Keras that is loaded; return what was cleared.

    Keras 3's ``clear_session`` also resets the global dtype policy to float32.
    """
    cleared = []
    for module_name in ("keras", "tf_keras"):
        keras = sys.modules.get(module_name)
        backend = getattr(keras, "backend", None)
        if backend is not None and hasattr(backend, "clear_session"):
            backend.clear_session()
            cleared.append(f"{module_name}.backend.clear_session()")
    return cleared


def clear_sessions() -> list[str]:
    """What a conftest file's clean-up fixture does after each test: every loaded Keras's
    ``clear_session()``, TensorFlow's default graph reset; return what was cleared."""
    cleared = clear_keras_sessions()
    tf = loaded_tensorflow()
    if tf is not None:
        try:
            tf.compat.v1.reset_default_graph()
        except (AssertionError, AttributeError):  # inside a graph's context: not ours to reset
            pass
        else:
            cleared.append("tf.compat.v1.reset_default_graph()")
    return cleared
