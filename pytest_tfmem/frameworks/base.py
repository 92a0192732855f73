"""What every framework module offers (``Framework``), and the plain values it hands out.

A framework module needs nothing but the standard library and the other modules of this
package (``tfmem run``'s agent loads it without the rest of pytest-tfmem), and never imports its
framework: each method works on the module user code loaded, found in ``sys.modules``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Protocol


def imported(name: str) -> ModuleType | None:
    """A module whose import finished, else ``None``; imports nothing."""
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def nothing_to_put_back() -> None:
    """What ``Framework.keep_random_state`` returns where a framework keeps no random state."""


@dataclass(frozen=True)
class Holder:
    """Something a framework keeps that holds memory: what it is, how many, and its bytes where
    the framework says (``None``: it does not, e.g. JAX's executables on CPU)."""

    name: str  # "JAX compiled executables"
    count: int
    bytes: int | None = None
    unit: str = ""  # what is counted, where the name does not say: "functions"


@dataclass(frozen=True)
class NamedItems:
    """The items of a holder whose items have names, counted by kind (a name with its per-copy
    numbers stripped), so that a leak check can say which kinds grew: TensorFlow's function
    library, by function."""

    holder: str  # the holder's name: "TF function library"
    count: int
    kinds: Mapping[str, int]  # the items that are not traces
    traces: Mapping[str, int]  # the items that are traces of a function, by the function traced
    traces_heading: str  # what such traces are called: "tf.function traces"


class DeviceView(Protocol):
    """A framework's own figure of one device's memory, read as a peak source (``core.measure``).
    ``name`` is ``<framework>:<device>``: ``tf:CPU:0``, ``jax:gpu:0``, ``torch:cuda:0``."""

    name: str

    def current(self) -> int: ...

    def peak(self) -> int: ...

    def reset_peak(self) -> None: ...


class PooledHostView(DeviceView, Protocol):
    """A view of host memory the framework serves from a pool of its own, which host RSS
    includes and which never shrinks (TensorFlow's CPU allocator). ``pool_estimate`` is the
    highest level in use seen in this process: the pool's size as far as anyone can tell."""

    pool_estimate: int


class ProfilerBusy(Exception):
    """The framework's profiler is already running (user code started one)."""


class Framework(Protocol):
    """One framework, as every feature asks it (``frameworks.loaded()`` lists those in use)."""

    name: str  # for people: "TensorFlow"
    module: str  # its top-level module: "tensorflow"
    keras_backend: str  # Keras 3's name for it: "tensorflow", "jax", "torch"
    view_prefix: str  # its device views' names start with this: "tf:"
    # set while a GPU option is on, unless the user set them: what makes its GPU figures mean
    # something (no preallocated pool)
    gpu_environment: dict[str, str]
    # what its ``clear`` costs later ("" where nothing to speak of), said beside what it did
    clear_cost: str
    # how to stream a dataset in batches with it, for advice: "tf.data"
    data_pipeline: str
    # Keras's first use on it pays its own first use too (a fit compiles a loss and its gradient):
    # where Keras runs on it, its own warm-up is left out
    first_use_in_keras: bool

    def loaded(self) -> bool:
        """User code imported it (fully). Imports nothing."""
        ...

    def runtime_started(self) -> bool:
        """Its runtime (devices, compiler, thread pools) is up."""
        ...

    def runtime_started_elsewhere(self) -> bool:
        """``runtime_started`` asked from a thread other than the one running the framework
        (``tfmem run``'s agent): it reads only what is imported, creates and configures nothing."""
        ...

    def start_runtime(self) -> None:
        """Start its runtime with one tiny computation, so that start-up is booked apart."""
        ...

    def warm_up(self) -> None:
        """Pay the one-time costs of its first use (a traced or compiled function, a gradient,
        its data pipeline, common kernels) on tiny inputs, once its runtime started, keeping
        nothing it made. Its random generators are put back by the caller (``keep_random_state``)."""
        ...

    def keep_random_state(self) -> Callable[[], None]:
        """Read the state of its global random generators; the function returned puts it back."""
        ...

    def device_views(self) -> Sequence[DeviceView]:
        """Its own per-device memory figures, where it keeps them (once the runtime started)."""
        ...

    def missing_views(self) -> list[str]:
        """The views it cannot give in this process, and how to get them: a sentence each (asked
        once it is loaded, before its runtime starts; starts nothing)."""
        ...

    def is_gpu_view(self, name: str) -> bool:
        """One of its views is a GPU's (it counts towards GPU budgets, not the host figure)."""
        ...

    def pooled_host_view(self, views: Sequence[DeviceView]) -> PooledHostView | None:
        """Of ``views`` (its own, as ``device_views`` gave them), the one of host memory it
        pools, where it has one."""
        ...

    def view_label(self, name: str) -> str:
        """``tf:CPU:0`` -> ``TF CPU:0 allocator``."""
        ...

    def column_title(self, name: str) -> str:
        """The title of the view's column in the tables: ``TF CPU``, ``JAX gpu:0``, ``torch cuda:0``."""
        ...

    def limit_gpu_memory(self, limit: int, runtime_started: bool) -> str:
        """Hold each GPU it uses to ``limit`` bytes; ``""`` when applied (or no GPU), else why not."""
        ...

    def device_oom_message(self, error: BaseException) -> str | None:
        """The message of ``error`` when it is this framework's device out-of-memory error."""
        ...

    def holders(self) -> list[Holder]:
        """What it keeps that holds memory: caches, compiled code, live arrays (cheap to read)."""
        ...

    def named_items(self) -> NamedItems | None:
        """Its holder whose items have names, where it has one (dearer than ``holders``: read
        at a leak check's iterations, not at every test)."""
        ...

    def flat_loop_advice(self, holder: str) -> str | None:
        """How a loop whose ``holder`` (one of its own) grows every iteration is made flat, in a
        sentence, where that was measured (the page is named); ``None`` otherwise."""
        ...

    def clear(self) -> list[str]:
        """Free what it caches between tests; return what was done (``jax.clear_caches()``)."""
        ...

    def start_profiler(self, logdir: Path) -> None:
        """Start its profiler writing into ``logdir``; ``ProfilerBusy`` if one is running."""
        ...

    def stop_profiler(self, logdir: Path) -> list[Path]:
        """Stop the profiler started here; the trace files it wrote into ``logdir``."""
        ...

    def profile_description(self) -> str:
        """What the trace files are and how to open them."""
        ...

    def no_memory_profile(self) -> str:
        """Why its trace holds no allocator memory profile (xprof's ``memory_profile`` tool) on
        the devices it uses now, in a sentence; ``""`` where it holds one. Asked before the
        reader is imported: a trace with nothing to read costs no import."""
        ...
