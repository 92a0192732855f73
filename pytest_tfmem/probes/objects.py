"""Python-level state a diagnosis reads: object types by name, sizes read statically, Keras's
name counters. Shared by the leak check's diagnosis and by what a test left
behind; nothing here imports TensorFlow or Keras (their state is read once user code loaded them).
"""

from __future__ import annotations

import collections
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

OWN_PACKAGE = __name__.split(".")[0]  # "pytest_tfmem": its own bookkeeping is not the user's
_TYPE_MODULE = type.__dict__["__module__"]
_TYPE_QUALNAME = type.__dict__["__qualname__"]


def type_name(kind: type) -> str:
    """``module.QualName``; some extension types carry a non-string ``__module__``."""
    module = _TYPE_MODULE.__get__(kind, type)  # type's own descriptor: bypasses odd metaclasses
    name = _TYPE_QUALNAME.__get__(kind, type)
    module = module if isinstance(module, str) else "?"
    return f"{module}.{name if isinstance(name, str) else kind.__name__}"


def module_global(module_name: str, attribute: str) -> Any:
    """A global of an imported module, read from its namespace: ``None`` where the module is not
    imported or has no such global. Never imports, and never calls a module's ``__getattr__``
    (a lazy module would import what it stands for)."""
    module = sys.modules.get(module_name)
    namespace = instance_dict(module) if isinstance(module, types.ModuleType) else None
    return namespace.get(attribute) if namespace is not None else None


def instance_dict(value: object) -> dict[str, Any] | None:
    """``value.__dict__`` as ``object`` reads it (no ``__getattr__``, no ``__getattribute__`` of
    the value's class), ``None`` for an object without one."""
    try:
        found = object.__getattribute__(value, "__dict__")
    except Exception:
        return None
    return found if isinstance(found, dict) else None


# Array types whose ``nbytes`` is their buffer's size, by the top-level module of the type: their
# own code (a C getter, or a property of the framework's), safe to call. Nothing is imported.
ARRAY_MODULES = ("numpy", "jax", "jaxlib", "torch", "tensorflow", "cupy")
# TensorFlow's types that hold their values (a graph's symbolic tensors and specs hold none):
# sized as their elements times their type's size, having no ``nbytes``.
TENSORS_WITH_VALUES = ("EagerTensor", "ResourceVariable")


def size_of(value: object) -> int:
    """Bytes an object holds: a known array type's buffer (``nbytes``), else its own size as the
    interpreter's ``object.__sizeof__`` or a builtin type's own ``__sizeof__`` gives it. Attributes
    are looked up on the type, statically: a user object's ``__getattr__``, properties and
    ``__sizeof__`` never run, a lazy module imports nothing, ``pytest.mark`` makes no mark."""
    return sizer(type(value))(value)


def sizer(kind: type) -> Callable[[Any], int]:
    """``size_of`` for the objects of ``kind``, its static lookups done once (``SizesByType`` keeps
    one per type: a test can leave tens of thousands of objects behind)."""
    own_size = _own_size(kind)
    if type_name(kind).split(".", 1)[0] not in ARRAY_MODULES:
        return own_size
    nbytes = inspect.getattr_static(kind, "nbytes", None)
    if _TYPE_QUALNAME.__get__(kind, type) in TENSORS_WITH_VALUES:
        shape, dtype = inspect.getattr_static(kind, "shape", None), inspect.getattr_static(kind, "dtype", None)
    else:
        shape = dtype = None

    def array_size(value: Any) -> int:
        size = _through(nbytes, value, kind)
        if not isinstance(size, int) and shape is not None:
            size = _tensor_bytes(_through(shape, value, kind), _through(dtype, value, kind))
        return size if isinstance(size, int) else own_size(value)

    return array_size


class SizesByType:
    """``size_of`` for one look over many objects, each type's lookups done once (``sizer``).
    Made for one look and dropped: kept, it would keep alive every type it saw."""

    def __init__(self) -> None:
        self._sizers: dict[type, Callable[[Any], int]] = {}

    def __call__(self, value: object) -> int:
        kind = type(value)
        size = self._sizers.get(kind)
        if size is None:
            size = self._sizers[kind] = sizer(kind)
        return size(value)


def _own_size(kind: type) -> Callable[[Any], int]:
    """A builtin type's own ``__sizeof__`` (a list's, a dict's, a bytearray's), else the
    interpreter's ``object.__sizeof__``; 0 where either fails."""
    method = inspect.getattr_static(kind, "__sizeof__", None)
    if not isinstance(method, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        method = object.__sizeof__

    def own_size(value: Any) -> int:
        try:
            return int(method(value))
        except Exception:
            return 0

    return own_size


def _through(descriptor: Any, value: object, kind: type) -> Any:
    """An attribute through the getter its type defines (an array type's own code), else ``None``."""
    try:
        return descriptor.__get__(value, kind) if hasattr(descriptor, "__get__") else descriptor
    except Exception:
        return None


def _tensor_bytes(shape: Any, dtype: Any) -> int | None:
    """``shape.num_elements() * dtype.size`` of a TensorFlow tensor or variable, else ``None``."""
    try:
        elements, size = shape.num_elements(), dtype.size
    except Exception:
        return None
    return elements * size if isinstance(elements, int) and isinstance(size, int) else None


def own_types() -> list[type]:
    """tfmem's own classes: its readings and reports are not the user's leak."""
    own = []
    for module_name, module in list(sys.modules.items()):
        if module_name == OWN_PACKAGE or module_name.startswith(OWN_PACKAGE + "."):
            own += [
                value
                for value in vars(module).values()
                if isinstance(value, type) and type_name(value).startswith(OWN_PACKAGE + ".")
            ]
    return own


def short_labels(names: list[str]) -> dict[str, str]:
    """``keras.src.layers.core.dense.Dense`` -> ``Dense``, unless two of ``names`` share it."""
    short = {name: name.rsplit(".", 1)[-1] for name in names}
    clashes = collections.Counter(short.values())
    return {name: label if clashes[label] == 1 else name for name, label in short.items()}


def keras_name_counters() -> dict[str, int]:
    """Keras's per-prefix name counters (``dense`` -> 12), labelled by the Keras they belong to."""
    counters: dict[str, int] = {}
    keras3_state = sys.modules.get("keras.src.backend.common.global_state")
    if keras3_state is not None:
        uids = keras3_state.get_global_attribute("object_name_uids") or {}
        counters.update({f"{prefix} (keras)": count for prefix, count in uids.items()})
    for module_name in ("tf_keras.src.backend", "keras.src.backend"):  # Keras 2: one counter per graph
        per_graph = module_global(module_name, "PER_GRAPH_OBJECT_NAME_UIDS")
        if per_graph is None:
            continue
        keras_name = module_name.split(".")[0]
        for graph_uids in list(per_graph.values()):
            for prefix, count in graph_uids.items():
                key = f"{prefix} ({keras_name})"
                counters[key] = counters.get(key, 0) + count
    return counters
