"""The frameworks tfmem knows (TensorFlow, JAX, PyTorch), each behind ``base.Framework``, and
the questions every feature asks of all of them: which are loaded, their device views, what
they hold, their clean-up. No feature asks for a framework by name.

Keras 3 runs on any of them; ``keras_backend()`` says which one a session uses, from what Keras
reads itself (a loaded Keras, ``KERAS_BACKEND``, ``keras.json``), without importing Keras.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import warnings
from collections.abc import Callable, Collection, MutableMapping, Sequence
from dataclasses import dataclass
from types import FunctionType, ModuleType
from typing import Any

from . import keras as keras_first_use
from .base import DeviceView, Framework, Holder, NamedItems, ProfilerBusy, imported
from .jax import Jax
from .tensorflow import TensorFlow
from .torch import Torch

__all__ = ["DeviceView", "FirstUse", "Framework", "Holder", "ProfilerBusy", "KNOWN", "loaded", "started"]

KNOWN: tuple[Framework, ...] = (TensorFlow(), Jax(), Torch())
KERAS_MODULES = ("keras", "tf_keras")
# The packages whose code is a framework's (or Keras's): nothing of tfmem's may run inside theirs.
FRAMEWORK_PACKAGES = frozenset({*(framework.module for framework in KNOWN), *KERAS_MODULES, "jaxlib"})
_MODULE_OF_TYPE = type.__dict__["__module__"]  # type's own descriptors: no metaclass runs
_MODULE_OF_FUNCTION = FunctionType.__dict__["__module__"]
DEFAULT_KERAS_BACKEND = "tensorflow"


def is_framework_module(name: str) -> bool:
    """``name`` is a module of a framework, Keras or their libraries (``jax._src.lazy_loader``)."""
    return name.split(".", 1)[0] in FRAMEWORK_PACKAGES


def loaded() -> list[Framework]:
    """The frameworks user code imported, in ``KNOWN``'s order."""
    return [framework for framework in KNOWN if framework.loaded()]


def in_use(framework: Framework, named: set[str]) -> bool:
    """The session runs on ``framework``: it is Keras's backend (TensorFlow by default), or the
    test code names it (``named``: the top-level modules a test module refers to, or one a test
    imported itself). A framework a library loaded for its own ends (TensorFlow Lite imports JAX
    where it is installed) is not started by tfmem."""
    return framework.keras_backend == keras_backend()[0] or framework.module in named


def named_modules(namespace: dict[str, Any]) -> set[str]:
    """The top-level modules a module's globals refer to: modules, and the modules their
    functions and classes come from (read statically: nothing of the user's runs)."""
    named = set()
    for value in list(namespace.values()):
        if isinstance(value, ModuleType):
            name = vars(value).get("__name__")
        elif isinstance(value, FunctionType):
            name = _MODULE_OF_FUNCTION.__get__(value)
        elif isinstance(value, type):
            name = _MODULE_OF_TYPE.__get__(value, type)
        else:
            continue
        if isinstance(name, str):
            named.add(name.split(".", 1)[0])
    return named


def missing_views() -> list[str]:
    """What the loaded frameworks cannot give in this process, each with how to get it."""
    return [line for framework in loaded() for line in framework.missing_views()]


def started() -> list[Framework]:
    """The loaded frameworks whose runtime is up."""
    return [framework for framework in loaded() if framework.runtime_started()]


def runtime_refusal(started_while: str) -> str | None:
    """Why a fork of this process would fail its framework, or ``None``: a runtime is up, and its
    threads do not survive a fork. ``started_while`` says when it was started."""
    up = started()
    if up:
        return f"{up[0].name}'s runtime was started {started_while}: its threads do not survive a fork"
    return None


def keras_backend() -> tuple[str, str]:
    """``(backend, where it was read)``: Keras 3's backend for this session, as Keras itself
    decides it (``KERAS_BACKEND`` over ``keras.json`` over ``tensorflow``), or the loaded Keras's."""
    config = sys.modules.get("keras.src.backend.config")
    backend = vars(config).get("_BACKEND") if config is not None else None
    if isinstance(backend, str):
        return backend, "the loaded Keras"
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"], "KERAS_BACKEND"
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    path = os.path.join(home, "keras.json")
    backend = _configured_backend(path)
    if backend is not None:
        return backend, path
    return DEFAULT_KERAS_BACKEND, "Keras's default"


@functools.lru_cache(maxsize=4)  # asked before every test while a loaded framework is not in use
def _configured_backend(path: str) -> str | None:
    """The backend a ``keras.json`` names, read once a session, as Keras reads it once on import."""
    try:
        with open(path, encoding="utf-8") as file:
            backend = json.load(file).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    return backend if isinstance(backend, str) else None


def primary() -> Framework | None:
    """The framework a test's trace follows: Keras's backend where it is loaded, else the first
    loaded one."""
    frameworks = loaded()
    backend, _ = keras_backend()
    return next((f for f in frameworks if f.keras_backend == backend), frameworks[0] if frameworks else None)


def device_views() -> list[DeviceView]:
    return [view for framework in started() for view in framework.device_views()]


@functools.lru_cache(maxsize=256)  # a session has a few view names; each test's figures ask several times
@functools.cache  # a session has a few views, asked about for every test's figures and lines
def owner(view: str) -> Framework | None:
    """The framework whose device view ``view`` is (``tf:CPU:0``: TensorFlow)."""
    return next((framework for framework in KNOWN if view.startswith(framework.view_prefix)), None)


def view_label(view: str) -> str | None:
    """``tf:CPU:0`` -> ``TF CPU:0 allocator``; ``None`` for a view no framework owns."""
    framework = owner(view)
    return framework.view_label(view) if framework is not None else None


def column_title(view: str) -> str | None:
    """``tf:CPU:0`` -> ``TF CPU``, ``jax:gpu:0`` -> ``JAX gpu:0``; ``None`` for a view no framework owns."""
    framework = owner(view)
    return framework.column_title(view) if framework is not None else None


def column_order(view: str) -> tuple[int, bool, str]:
    """Where a framework view's column stands: by framework (TensorFlow, JAX, PyTorch), host
    views before GPU views, then by name."""
    framework = owner(view)
    rank = KNOWN.index(framework) if framework is not None else len(KNOWN)
    return rank, is_gpu_view(view), view


def is_gpu_view(view: str) -> bool:
    framework = owner(view)
    return framework is not None and framework.is_gpu_view(view)


def is_host_view(view: str) -> bool:
    """A framework's view of host memory (``tf:CPU:0``), which host RSS includes."""
    framework = owner(view)
    return framework is not None and not framework.is_gpu_view(view)


def holders(frameworks: Sequence[Framework] | None = None) -> dict[str, Holder]:
    """What the loaded frameworks hold, by holder name."""
    found: dict[str, Holder] = {}
    for framework in loaded() if frameworks is None else frameworks:
        try:
            found.update((holder.name, holder) for holder in framework.holders())
        except Exception:  # a framework shutting down, or one whose internals moved: say nothing
            continue
    return found


def flat_loop_advice(holder: str) -> str | None:
    """How the loaded framework that owns ``holder`` says a loop that grows it is made flat."""
    for framework in loaded():
        try:
            advice = framework.flat_loop_advice(holder)
        except Exception:  # shutting down, or internals that moved: say nothing
            continue
        if advice is not None:
            return advice
    return None


def named_items() -> tuple[Framework, NamedItems] | None:
    """The holder with named items (TensorFlow's function library) of the first started
    framework that has one, and that framework."""
    for framework in started():
        try:
            items = framework.named_items()
        except Exception:  # shutting down, or internals that moved: say nothing
            continue
        if items is not None:
            return framework, items
    return None


def clear_keras_sessions() -> list[str]:
    """Call ``clear_session()`` of every Keras that is loaded; return what was cleared.

    Keras 3's ``clear_session`` also resets the global dtype policy to float32.
    """
    cleared = []
    for module_name in KERAS_MODULES:
        keras = sys.modules.get(module_name)
        backend = getattr(keras, "backend", None)
        if backend is not None and hasattr(backend, "clear_session"):
            backend.clear_session()
            cleared.append(f"{module_name}.backend.clear_session()")
    return cleared


def clear() -> list[str]:
    """What a conftest file's clean-up fixture does after each test, on every backend: every
    loaded Keras's ``clear_session()``, then each started framework's own caches; what was done,
    with its cost where it has one (``jax.clear_caches() (each function JAX compiled is ...)``)."""
    cleared = clear_keras_sessions()
    for framework in started():  # a framework loaded but never started holds nothing to clear
        cost = f" ({framework.clear_cost})" if framework.clear_cost else ""
        cleared += [f"{action}{cost}" for action in framework.clear()]
    return cleared


@dataclass(frozen=True)
class FirstUse:
    """The one-time costs of a framework's first use, or of Keras's on its backend, to pay before
    the first measured test (``warm_up``): ``name`` for the session's account (``Keras``)."""

    name: str
    run: Callable[[], None]


def first_uses(started: Collection[str], finishing: str = "") -> list[FirstUse]:
    """What to warm up of the frameworks whose runtime tfmem started (``started``: their modules):
    each one's own first use, and Keras 3's where it is loaded (``finishing``: as
    ``keras_first_use.loaded_keras`` reads it) and runs on one of them."""
    keras = keras_first_use.loaded_keras(finishing)
    numpy = imported("numpy")
    runs_on = None
    if keras is not None and numpy is not None:
        runs_on = next((f for f in KNOWN if f.keras_backend == keras_first_use.backend(keras)), None)
    keras_warmed = runs_on is not None and runs_on.module in started
    found = [
        FirstUse(framework.name, framework.warm_up) for framework in KNOWN
        if framework.module in started and not (keras_warmed and framework is runs_on and framework.first_use_in_keras)
    ]
    if keras_warmed and keras is not None and numpy is not None:
        found.append(FirstUse(keras_first_use.NAME, functools.partial(keras_first_use.warm_up, keras, numpy.zeros)))
    return found


def warm_up(first_use: FirstUse) -> None:
    """Run ``first_use`` with its warnings silenced and every global random generator (Python's,
    NumPy's, each loaded framework's) put back as it was: a test draws the numbers it would draw
    without it."""
    numpy = imported("numpy")
    python_state = random.getstate()
    numpy_state = numpy.random.get_state() if numpy is not None else None
    put_back = [framework.keep_random_state() for framework in loaded()]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            first_use.run()
    finally:
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)
        for restore in put_back:
            restore()


def set_gpu_environment(environ: MutableMapping[str, str]) -> list[str]:
    """Set each framework's GPU variables (``TF_FORCE_GPU_ALLOW_GROWTH=true``,
    ``XLA_PYTHON_CLIENT_PREALLOCATE=false``) in ``environ`` unless the user set them; the
    ``NAME=value`` set. Without them a framework takes a GPU's memory as a pool at its start, and
    NVML reads the pool."""
    done = []
    for framework in KNOWN:
        for name, value in framework.gpu_environment.items():
            if name not in environ:
                environ[name] = value
                done.append(f"{name}={value}")
    return done
