"""JAX: device memory statistics, its runtime start, compiled executables and live arrays,
``jax.clear_caches()`` and its profiler.

JAX keeps every function it compiled (a set per model that lowers to new code) until
``jax.clear_caches()``; Keras's ``clear_session()`` leaves them alone. On CPU its devices keep
no memory statistics (``memory_stats()`` is ``None``): the host figures carry JAX's memory.
On a GPU, ``memory_stats()`` reports ``bytes_in_use`` and ``peak_bytes_in_use``; the peak is the
process's lifetime peak and cannot be reset (see ``JaxDevice``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .base import DeviceView, Holder, NamedItems, ProfilerBusy, imported, nothing_to_put_back

MODULE = "jax"
EXECUTABLES = "JAX compiled executables"  # its holder of compiled code


def _backends() -> dict[str, Any]:
    """JAX's initialised backends (``cpu``, ``cuda``...): empty until its runtime started."""
    bridge = imported("jax._src.xla_bridge")
    backends = vars(bridge).get("_backends") if bridge is not None else None
    return dict(backends) if isinstance(backends, dict) else {}


class JaxDevice:
    """A peak source over one JAX device's ``memory_stats()``.

    JAX's ``peak_bytes_in_use`` is the highest level since the process started, never reset. A
    window's peak is that figure when the window raised it (exact); otherwise the window stayed
    under an earlier peak, and its peak is the higher of the levels at its start and end, a lower
    bound (the tracker's samples raise it where the view is sampled).
    """

    def __init__(self, device: Any) -> None:
        self._device = device
        self.name = f"jax:{device.platform}:{device.id}"
        self._lifetime_at_reset = 0
        self._level_at_reset = 0

    def _stats(self) -> dict[str, int]:
        return self._device.memory_stats() or {}

    def current(self) -> int:
        return int(self._stats().get("bytes_in_use", 0))

    def peak(self) -> int:
        stats = self._stats()
        lifetime = int(stats.get("peak_bytes_in_use", 0))
        if lifetime > self._lifetime_at_reset:
            return lifetime
        return max(self._level_at_reset, int(stats.get("bytes_in_use", 0)))

    def reset_peak(self) -> None:
        stats = self._stats()
        self._lifetime_at_reset = int(stats.get("peak_bytes_in_use", 0))
        self._level_at_reset = int(stats.get("bytes_in_use", 0))


class Jax:
    """JAX behind the ``Framework`` protocol (``frameworks.base``)."""

    name = "JAX"
    module = MODULE
    keras_backend = "jax"
    view_prefix = "jax:"
    gpu_environment = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    clear_cost = "each function JAX compiled is compiled again at its next call"
    data_pipeline = "a keras.utils.PyDataset or tf.data"
    first_use_in_keras = True

    def loaded(self) -> bool:
        jax = imported(MODULE)
        return jax is not None and "devices" in vars(jax)

    def runtime_started(self) -> bool:
        return self.loaded() and bool(_backends())

    def runtime_started_elsewhere(self) -> bool:
        return self.runtime_started()  # two dictionary reads: safe from any thread

    def start_runtime(self) -> None:
        """Create JAX's backends (the CPU client, the XLA compiler), compile one tiny op and draw
        from its random number generator (which every Keras model's initialisers use)."""
        jax = imported(MODULE)
        if jax is None:
            return
        numpy = jax.numpy
        (numpy.ones((8, 8)) @ numpy.ones((8, 8))).sum().block_until_ready()
        jax.random.normal(jax.random.key(0), (8,)).block_until_ready()

    def warm_up(self) -> None:
        """A loss and its gradient compiled together (``jit`` of ``value_and_grad``) and run."""
        jax = imported(MODULE)
        if jax is None:
            return
        numpy = jax.numpy

        def loss(weights: Any, inputs: Any) -> Any:
            return numpy.mean(numpy.tanh(inputs @ weights) ** 2)

        value, gradient = jax.jit(jax.value_and_grad(loss))(numpy.zeros((4, 2)), numpy.ones((8, 4)))
        gradient.block_until_ready()

    def keep_random_state(self) -> Callable[[], None]:
        return nothing_to_put_back  # JAX's random numbers come from keys passed in: no global state

    def missing_views(self) -> list[str]:
        return []  # its host memory is the host view's; its GPU views need only a GPU

    def device_views(self) -> list[JaxDevice]:
        if not self.runtime_started():
            return []
        views = []
        for backend in _backends().values():
            for device in backend.local_devices():
                try:
                    if device.memory_stats() is not None:
                        views.append(JaxDevice(device))
                except Exception:  # a backend without statistics
                    continue
        return views

    def is_gpu_view(self, name: str) -> bool:
        return name.startswith("jax:") and not name.startswith("jax:cpu")

    def pooled_host_view(self, views: Sequence[DeviceView]) -> None:
        return None  # JAX keeps no host pool of its own: its CPU arrays are plain host memory

    def view_label(self, name: str) -> str:
        return f"JAX {name[4:]} device"

    def column_title(self, name: str) -> str:
        return f"JAX {name[4:]}"

    def limit_gpu_memory(self, limit: int, runtime_started: bool) -> str:
        gpus = [view for view in self.device_views() if self.is_gpu_view(view.name)]
        if not gpus:
            return "JAX sees no GPU"
        return "JAX takes a fraction of each GPU: set XLA_PYTHON_CLIENT_MEM_FRACTION before JAX starts"

    def device_oom_message(self, error: BaseException) -> str | None:
        message = str(error)
        if type(error).__name__ in ("XlaRuntimeError", "JaxRuntimeError") and "RESOURCE_EXHAUSTED" in message:
            return message
        return None

    def holders(self) -> list[Holder]:
        backends = list(_backends().values())
        if not backends:
            return []
        executables = [executable for backend in backends for executable in backend.live_executables()]
        arrays = [array for backend in backends for array in backend.live_arrays()]
        code = sum(_code_size(executable) for executable in executables)
        return [
            Holder(EXECUTABLES, len(executables), code or None),
            Holder("live jax.Arrays", len(arrays), sum(int(array.nbytes) for array in arrays)),
        ]

    def named_items(self) -> NamedItems | None:
        return None  # its holders' items have no names worth following

    def flat_loop_advice(self, holder: str) -> str | None:
        if holder != EXECUTABLES:
            return None
        return (
            "JAX keeps the code it compiles for each new shape; keras.backend.clear_session() does not drop it. "
            "Flat: jax.clear_caches() after each iteration, or one model for every shape, its inputs padded "
            "to the largest; measured in docs/scenarios.md, \"4. Models built in a loop\""
        )

    def clear(self) -> list[str]:
        jax = imported(MODULE)
        if jax is None:
            return []
        jax.clear_caches()
        return ["jax.clear_caches()"]

    def start_profiler(self, logdir: Path) -> None:
        jax = imported(MODULE)
        assert jax is not None
        try:
            jax.profiler.start_trace(str(logdir))
        except RuntimeError as error:  # "Profile has already been started"
            raise ProfilerBusy(str(error)) from error

    def stop_profiler(self, logdir: Path) -> list[Path]:
        jax = imported(MODULE)
        assert jax is not None
        jax.profiler.stop_trace()
        return sorted(logdir.glob("plugins/profile/*/*.xplane.pb"))

    def profile_description(self) -> str:
        return "JAX profiler trace (Profile tab in TensorBoard)"

    def no_memory_profile(self) -> str:
        if not self.runtime_started() or any(self.is_gpu_view(view.name) for view in self.device_views()):
            return ""  # XLA's GPU allocator records its allocations (not started: not known yet)
        return "JAX on CPU records no allocations in its trace (only its GPU allocator does)"


def _code_size(executable: Any) -> int:
    """The executable's generated code in bytes, where JAX says (0 on CPU)."""
    try:
        stats = executable.get_compiled_memory_stats()
    except Exception:
        return 0
    return int(stats.generated_code_size_in_bytes + stats.host_generated_code_size_in_bytes)
