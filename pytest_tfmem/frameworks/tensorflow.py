"""TensorFlow: allocator statistics per device, its runtime start, function library, clean-up
and profiler.

TensorFlow pools freed memory and never returns it to the OS, so after a heavier test a
TF-heavy test may not raise RSS at all; the allocator's ``peak - current at start`` still
reads what the test needed (see README, "What is measured").
"""

from __future__ import annotations

import collections
import os
import random
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .base import DeviceView, Holder, NamedItems, ProfilerBusy, imported, nothing_to_put_back

MODULE = "tensorflow"
LIBRARY_HOLDER = "TF function library"  # its holder; the leak check also follows it by function name
TRACE_PREFIX = "__inference_"  # a tf.function trace in the function library
TRUE = ("1", "true", "yes", "on")  # as TensorFlow reads a boolean environment variable
_NUMBERS = re.compile(r"_\d+(?=_|$)")  # the parts of a library name that differ per copy


def loaded_tensorflow() -> ModuleType | None:
    """The ``tensorflow`` module if user code has imported it (fully), else ``None``."""
    tf = sys.modules.get(MODULE)
    if tf is None or not hasattr(tf, "config"):
        return None
    return tf


def _eager_context() -> Any:
    from tensorflow.python.eager import context  # only reached once TF is loaded

    return context.context()


def _devices_initialised() -> bool:
    """Whether TensorFlow's eager context exists and has initialised its devices. It reads the
    context and creates none: ``context.context()`` would create one."""
    context = getattr(sys.modules.get("tensorflow.python.eager.context"), "_context", None)
    return bool(context is not None and getattr(context, "_initialized", False))


def runtime_started() -> bool:
    """True once TensorFlow has initialised its devices (after which they can't be configured)."""
    return loaded_tensorflow() is not None and _devices_initialised()


def runtime_started_elsewhere() -> bool:
    """``runtime_started`` for a thread other than the one running TensorFlow: true once
    ``import tensorflow`` has completed and the runtime has initialised its devices. It looks
    at what is already imported and creates nothing (no eager context, no import), so the
    code being watched can still configure its devices."""
    tf = sys.modules.get(MODULE)
    if tf is None or getattr(getattr(tf, "__spec__", None), "_initializing", False) or not hasattr(tf, "config"):
        return False
    return _devices_initialised()


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


def function_library_names() -> list[str] | None:
    """Names of the functions in TF's eager context, or ``None`` before TF's runtime started."""
    if not runtime_started():
        return None
    return list(_eager_context().list_function_names())


def function_group(name: str) -> str:
    """``adam_dense_1_kernel_momentum_cond_true_1163`` -> ``adam_dense_kernel_momentum_cond_true``."""
    return _NUMBERS.sub("", name)


TURN_ON_CPU_STATISTICS = (
    "TF_ENABLE_ONEDNN_OPTS=1 (or TF_CPU_ALLOCATOR_USE_BFC=1) set before TensorFlow loads turns it on"
)


def _no_cpu_statistics() -> str | None:
    """Why TensorFlow's CPU allocator keeps no statistics in this process, or ``None`` where it does
    (or TensorFlow is not loaded)."""
    if loaded_tensorflow() is None:
        return None
    port = sys.modules.get("tensorflow.python.util._pywrap_util_port")
    if port is None or port.IsMklEnabled() or os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in TRUE:
        return None
    if "TF_ENABLE_ONEDNN_OPTS" in os.environ:
        return "TF_ENABLE_ONEDNN_OPTS is off"
    return "oneDNN is off by default on this CPU"


class TensorFlow:
    """TensorFlow behind the ``Framework`` protocol (``frameworks.base``)."""

    name = "TensorFlow"
    module = MODULE
    keras_backend = "tensorflow"
    view_prefix = "tf:"
    gpu_environment = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    clear_cost = ""  # the default graph is rebuilt as tests need it
    data_pipeline = "tf.data"
    first_use_in_keras = False  # a fit pays no tf.data pipeline of its own

    def loaded(self) -> bool:
        return loaded_tensorflow() is not None

    def runtime_started(self) -> bool:
        return runtime_started()

    def runtime_started_elsewhere(self) -> bool:
        return runtime_started_elsewhere()

    def start_runtime(self) -> None:
        """Initialise TF's devices and run one tiny op."""
        tf = loaded_tensorflow()
        if tf is None:
            return
        tf.config.list_logical_devices()
        tf.reduce_sum(tf.ones((8, 8)) @ tf.ones((8, 8))).numpy()

    def warm_up(self) -> None:
        """A ``tf.data`` pipeline (map, shuffle, batch), a gradient taken on a tape and applied, a
        ``tf.function`` traced through autograph, conv and pooling kernels."""
        tf = loaded_tensorflow()
        if tf is None:
            return
        pipeline = tf.data.Dataset.from_tensor_slices(tf.zeros((16, 4))).map(lambda row: row * 2.0)
        for _ in pipeline.shuffle(8).batch(4).prefetch(1):
            pass
        weights = tf.Variable(tf.zeros((4, 1)))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.ones((4, 4)), weights)))
        weights.assign_sub(0.1 * tape.gradient(loss, weights))

        @tf.function
        def features(images: Any) -> Any:
            if tf.reduce_sum(images) > 0:  # a condition autograph converts
                images = tf.nn.relu(images)
            filters = tf.zeros((3, 3, 1, 2))
            return tf.nn.max_pool2d(tf.nn.conv2d(images, filters, 1, "SAME"), 2, 2, "VALID")

        features(tf.ones((2, 8, 8, 1)))

    def keep_random_state(self) -> Callable[[], None]:
        """The generator of op seeds TensorFlow draws from once a global seed is set
        (``tf.random.set_seed``); unseeded ops keep no state."""
        if loaded_tensorflow() is None:
            return nothing_to_put_back
        context = _eager_context()
        generator: random.Random | None = getattr(context, "_rng", None)
        if generator is None:
            return nothing_to_put_back
        seeded = generator
        state = seeded.getstate()

        def put_back() -> None:
            if getattr(context, "_rng", None) is seeded:  # not reseeded meanwhile
                seeded.setstate(state)

        return put_back

    def missing_views(self) -> list[str]:
        """The CPU allocator's view, where its allocator keeps no statistics: with oneDNN off, its
        default on CPUs without the vector instructions TensorFlow looks for (some AMD EPYC)."""
        why = _no_cpu_statistics()
        if why is None:
            return []
        return [
            f"no TF CPU allocator view: TensorFlow's CPU allocator keeps no statistics here ({why}), so tensors "
            f"count as host memory only; {TURN_ON_CPU_STATISTICS}"
        ]

    def device_views(self) -> list[TFAllocator]:
        tf = loaded_tensorflow()
        if tf is None or not runtime_started():
            return []
        return allocator_sources(tf)

    def is_gpu_view(self, name: str) -> bool:
        return name.startswith("tf:GPU")

    def pooled_host_view(self, views: Sequence[DeviceView]) -> TFAllocator | None:
        return next((view for view in views if isinstance(view, TFAllocator) and view.device == "CPU:0"), None)

    def view_label(self, name: str) -> str:
        return f"TF {name[3:]} allocator"

    def column_title(self, name: str) -> str:
        device = name[3:]
        return "TF CPU" if device == "CPU:0" else f"TF {device}"  # the one CPU allocator a process has

    def limit_gpu_memory(self, limit: int, runtime_started: bool) -> str:
        """A logical device memory limit on every GPU (TensorFlow takes MiB: rounded down, to at
        least 1 MiB); it must be set before TensorFlow initialises its GPUs."""
        tf = loaded_tensorflow()
        assert tf is not None
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            return "TensorFlow sees no GPU"
        if runtime_started:
            return (
                "TensorFlow had already initialised its GPUs (something ran a TF op before the first "
                "test, e.g. at import of a test module or conftest.py)"
            )
        limit_mib = max(1, limit // 2**20)
        try:
            for gpu in gpus:
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mib)]
                )
        except (RuntimeError, ValueError) as error:
            return f"TensorFlow refused it: {error}"
        return ""

    def device_oom_message(self, error: BaseException) -> str | None:
        tf = loaded_tensorflow()
        if tf is None or not isinstance(error, tf.errors.ResourceExhaustedError):
            return None
        return str(getattr(error, "message", error))

    def holders(self) -> list[Holder]:
        names = function_library_names()
        return [] if names is None else [Holder(LIBRARY_HOLDER, len(names), unit="functions")]

    def named_items(self) -> NamedItems | None:
        names = function_library_names()
        if names is None:
            return None
        groups = collections.Counter(map(function_group, names))
        return NamedItems(
            LIBRARY_HOLDER,
            len(names),
            kinds={name: count for name, count in groups.items() if not name.startswith(TRACE_PREFIX)},
            traces={name.removeprefix(TRACE_PREFIX): count for name, count in groups.items()
                    if name.startswith(TRACE_PREFIX)},
            traces_heading="tf.function traces",
        )

    def flat_loop_advice(self, holder: str) -> str | None:
        """The function library, under a Keras fit: what ``clear_session()`` leaves, and what is flat."""
        tf = loaded_tensorflow()
        if holder != LIBRARY_HOLDER or tf is None or not any(imported(name) for name in ("keras", "tf_keras")):
            return None
        return (
            f"each compiled Keras fit traces functions into TensorFlow's function library (Adam's slot "
            f"initializers among them), and on TensorFlow {getattr(tf, '__version__', '?')} "
            "keras.backend.clear_session() does not remove them. Flat: compile(run_eagerly=True), or one "
            "compiled model fitted in every iteration (its weights and optimizer reset); measured in "
            "docs/leaks.md, \"Keras in a loop\""
        )

    def clear(self) -> list[str]:
        """TensorFlow's default graph reset (Keras's ``clear_session`` is ``frameworks.clear``'s)."""
        tf = loaded_tensorflow()
        if tf is None:
            return []
        try:
            tf.compat.v1.reset_default_graph()
        except (AssertionError, AttributeError):  # inside a graph's context: not ours to reset
            return []
        return ["tf.compat.v1.reset_default_graph()"]

    def start_profiler(self, logdir: Path) -> None:
        tf = loaded_tensorflow()
        assert tf is not None
        experimental = tf.profiler.experimental
        options = experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0, device_tracer_level=1)
        try:
            experimental.start(str(logdir), options=options)
        except (tf.errors.AlreadyExistsError, tf.errors.UnavailableError) as error:
            raise ProfilerBusy(f"{type(error).__name__}: {error.message}") from error

    def stop_profiler(self, logdir: Path) -> list[Path]:
        tf = loaded_tensorflow()
        assert tf is not None
        tf.profiler.experimental.stop()
        return sorted(logdir.glob("plugins/profile/*/*.xplane.pb"))

    def profile_description(self) -> str:
        return "TensorFlow profiler trace (Profile tab in TensorBoard)"

    def no_memory_profile(self) -> str:
        """Its allocators record every allocation at host_tracer_level 2, CPU's too: where the CPU
        allocator keeps none (and no GPU's allocator is there), a CPU trace has no memory profile."""
        why = _no_cpu_statistics()
        if why is None or any(self.is_gpu_view(view.name) for view in self.device_views()):
            return ""
        return f"TensorFlow's CPU allocator keeps no statistics here ({why}); {TURN_ON_CPU_STATISTICS}"
