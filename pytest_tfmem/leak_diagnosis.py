"""What piles up between the iterations of a leak check.

``GrowthTracker.observe()`` runs after the baseline and after each measured iteration (after
``gc.collect()``) and counts gc-visible Python objects by type, the size of TensorFlow's eager
function library and the traces in it per ``tf.function``, and Keras's name counters. Such a
quantity is reported when it rose at *every* step: a cache filled once is not a trend. The
lengths of lists/dicts/sets/deques are compared once, baseline against the end, so a
container that gains items (numpy arrays, which gc does not track, included) is named with
what holds it.

Nothing here imports TensorFlow or Keras: their state is read only once user code loaded them.
"""

from __future__ import annotations

import collections
import gc
import re
import sys
import types
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from itertools import compress, repeat
from typing import Any

_CONTAINERS = (list, dict, set, collections.deque)
_OWN_MODULE = __name__.rsplit(".", 1)[0]  # "pytest_tfmem": its own bookkeeping is not a leak
_SHOWN_TYPES = 10
_INFERENCE = re.compile(r"^__inference_(.+)_\d+$")  # a tf.function trace in the function library
_TYPE_MODULE = type.__dict__["__module__"]
_TYPE_QUALNAME = type.__dict__["__qualname__"]
_SHOWN_CONTAINERS = 3  # naming a holder scans the heap: only for the largest few


@dataclass(frozen=True)
class Growth:
    """One quantity that grew at every step: ``label`` grew ``per_iteration`` on average."""

    label: str
    per_iteration: float
    start: int
    end: int

    def signed(self) -> str:
        return f"+{self.per_iteration:.1f}".removesuffix(".0")


@dataclass(frozen=True)
class LeakDiagnosis:
    """What grew at every measured iteration. ``function_library`` is ``None`` without TF."""

    types: tuple[Growth, ...] = ()
    containers: tuple[Growth, ...] = ()
    function_library: Growth | None = None
    keras_names: tuple[Growth, ...] = ()
    retracing: tuple[Growth, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LeakDiagnosis:
        def growths(key: str) -> tuple[Growth, ...]:
            return tuple(Growth(**g) for g in data.get(key, ()))

        library = data.get("function_library")
        return cls(
            types=growths("types"),
            containers=growths("containers"),
            function_library=Growth(**library) if library else None,
            keras_names=growths("keras_names"),
            retracing=growths("retracing"),
        )

    def rows(self, leaked: bool) -> list[tuple[str, str]]:
        """``(heading, text)`` rows of the report table."""
        rows = [("growing types", _list_types(self.types, leaked))]
        if self.containers:
            rows.append(("growing containers", "; ".join(_describe_container(c) for c in self.containers)))
        if self.function_library is not None:
            library = self.function_library
            growth = library.per_iteration
            text = f"{library.signed()} functions per iteration" if growth > 0 else "no growth"
            rows.append(("TF function library", f"{text} ({library.start} -> {library.end})"))
        if self.keras_names:
            rows.append(("Keras name counters", ", ".join(f"{g.signed()} {g.label}" for g in self.keras_names)))
        if self.retracing:
            traces = ", ".join(f"{g.signed()} {g.label}" for g in self.retracing)
            rows.append(("tf.function traces", f"{traces} per iteration (new traces kept in the library)"))
        return rows


def _list_types(growths: tuple[Growth, ...], leaked: bool) -> str:
    if not growths:
        if leaked:
            return ("none: the growth is not in gc-tracked Python objects (numpy arrays, bytes and str "
                    "are not tracked) or is outside Python (TensorFlow runtime, C extensions)")
        return "none"
    shown = ", ".join(f"{g.signed()} {g.label}" for g in growths[:_SHOWN_TYPES])
    more = len(growths) - _SHOWN_TYPES
    return f"{shown}, ... ({more} more types)" if more > 0 else shown


def _describe_container(growth: Growth) -> str:
    return f"{growth.signed()} items per iteration: {growth.label} ({growth.start} -> {growth.end})"


class _EveryStep:
    """Keys whose value rose at every step since the first observation."""

    def __init__(self) -> None:
        self.first: dict[Any, int] | None = None
        self.last: dict[Any, int] = {}
        self.rising: set[Any] | None = None  # None until the first step
        self.steps = 0

    def observe(self, values: dict[Any, int]) -> None:
        if self.first is None:
            self.first = values
        else:
            rose = {key for key, value in values.items() if value > self.last.get(key, 0)}
            self.rising = rose if self.rising is None else self.rising & rose
            self.first = {key: self.first.get(key, 0) for key in self.rising}  # keep only what matters
            self.steps += 1
        self.last = values

    def growths(self) -> dict[Any, tuple[float, int, int]]:
        """key -> (mean growth per step, first value, last value) for keys that rose at every step."""
        if not self.rising or self.first is None:
            return {}
        return {
            key: ((self.last[key] - self.first[key]) / self.steps, self.first[key], self.last[key])
            for key in self.rising
        }


def _type_name(kind: type) -> str:
    """``module.QualName``; some extension types carry a non-string ``__module__``."""
    module = _TYPE_MODULE.__get__(kind, type)  # type's own descriptor: bypasses odd metaclasses
    name = _TYPE_QUALNAME.__get__(kind, type)
    module = module if isinstance(module, str) else "?"
    return f"{module}.{name if isinstance(name, str) else kind.__name__}"


def _own_types() -> list[type]:
    """tfmem's own classes: its readings and reports are not the user's leak."""
    own = []
    for module_name, module in list(sys.modules.items()):
        if module_name == _OWN_MODULE or module_name.startswith(_OWN_MODULE + "."):
            own += [
                value
                for value in vars(module).values()
                if isinstance(value, type) and _type_name(value).startswith(_OWN_MODULE + ".")
            ]
    return own


def _loaded_classes(*paths: str) -> tuple[type, ...]:
    """Classes named ``module:attribute`` whose module is already imported (never imports)."""
    classes = []
    for path in paths:
        module_name, attribute = path.split(":")
        found = getattr(sys.modules.get(module_name), attribute, None)
        if isinstance(found, type):
            classes.append(found)
    return tuple(classes)


def _type_rank(kind: type) -> int:
    """Order growing types so the likely culprits come first: models, layers, TF functions, ..."""
    tiers = (
        _loaded_classes("keras:Model", "tf_keras:Model"),
        _loaded_classes("keras.layers:Layer", "tf_keras.layers:Layer", "keras.optimizers:Optimizer",
                        "tf_keras.optimizers:Optimizer", "keras:Variable", "tensorflow:Variable"),
        _loaded_classes(
            "tensorflow.python.eager.polymorphic_function.polymorphic_function:Function",
            "tensorflow.python.eager.polymorphic_function.concrete_function:ConcreteFunction",
            "tensorflow.python.eager.polymorphic_function.atomic_function:AtomicFunction",
            "tensorflow.python.framework.ops:Graph",
        ),
    )
    for rank, classes in enumerate(tiers):
        if classes and issubclass(kind, classes):
            return rank
    return len(tiers) + _type_name(kind).startswith("builtins.")


def function_library_names() -> list[str] | None:
    """Names of the functions in TF's eager context, or ``None`` before TF's runtime started."""
    from .probes import tf as tf_probe

    if not tf_probe.runtime_started():
        return None
    from tensorflow.python.eager import context  # loaded: runtime_started() found TF

    return list(context.context().list_function_names())


def traced_function(name: str) -> str | None:
    """``__inference_one_step_on_data_1395`` -> ``one_step_on_data``: each trace adds one."""
    match = _INFERENCE.match(name)
    return match.group(1) if match else None


def keras_name_counters() -> dict[str, int]:
    """Keras's per-prefix name counters (``dense`` -> 12), labelled by the Keras they belong to."""
    counters: dict[str, int] = {}
    keras3_state = sys.modules.get("keras.src.backend.common.global_state")
    if keras3_state is not None:
        uids = keras3_state.get_global_attribute("object_name_uids") or {}
        counters.update({f"{prefix} (keras)": count for prefix, count in uids.items()})
    for module_name in ("tf_keras.src.backend", "keras.src.backend"):  # Keras 2: one counter per graph
        per_graph = getattr(sys.modules.get(module_name), "PER_GRAPH_OBJECT_NAME_UIDS", None)
        if per_graph is None:
            continue
        keras_name = module_name.split(".")[0]
        for graph_uids in list(per_graph.values()):
            for prefix, count in graph_uids.items():
                key = f"{prefix} ({keras_name})"
                counters[key] = counters.get(key, 0) + count
    return counters


class GrowthTracker:
    """Observe the process after the baseline and each measured iteration; diagnose at the end."""

    def __init__(self) -> None:
        self._types = _EveryStep()
        self._own_types = set(_own_types())
        self._container_baseline: dict[int, int] | None = None
        self._steps = -1  # observations after the baseline
        self._library: tuple[int, int] | None = None  # (size at first observation, size now)
        self._library_steps = 0  # observations since the first one that found TF running
        self._names = _EveryStep()
        self._traces = _EveryStep()
        self._ignored: set[int] = set()

    def ignore(self, *containers: object) -> None:
        """Leave the caller's own growing bookkeeping (reading series) out of the diagnosis."""
        self._ignored.update(id(container) for container in containers)

    def _own_ids(self) -> set[int]:
        own = {id(self._ignored), id(self._container_baseline), *self._ignored}
        for step in (self._types, self._names, self._traces):
            own.update((id(step.first), id(step.last), id(step.rising)))
        return own

    def record_containers(self) -> None:
        """Lengths of every container now, to compare with the end (unchanged in between)."""
        objects = gc.get_objects()
        self._container_baseline = _container_lengths(objects, self._own_ids())
        del objects

    def observe(self) -> None:
        objects = gc.get_objects()
        try:
            self._observe(objects)
        finally:
            del objects

    def _observe(self, objects: list[Any]) -> None:
        # The scans run at C speed (map/compress); a TF process holds ~400k tracked objects.
        # Keyed by type, named at the end: no new strings per step to fragment the heap.
        counts = collections.Counter(map(type, objects))
        for kind in self._own_types:
            counts.pop(kind, None)
        self._types.observe(counts)

        self._steps += 1
        names = function_library_names()
        if names is not None:
            if self._library is not None:
                self._library_steps += 1
            self._library = (len(names) if self._library is None else self._library[0], len(names))
            self._traces.observe(collections.Counter(filter(None, map(traced_function, names))))
        self._names.observe(keras_name_counters())

    def diagnosis(self) -> LeakDiagnosis:
        type_growth = {_type_name(kind): (kind, growth) for kind, growth in self._types.growths().items()}
        ranked = sorted(
            type_growth,
            key=lambda name: (_type_rank(type_growth[name][0]), type_growth[name][1][0], name),
        )
        labels = _short_labels(ranked)
        containers = self._growing_containers()
        alive = _objects_by_id({key for key, _ in containers})
        library = None
        if self._library is not None:
            first, last = self._library
            library = Growth("TF function library", (last - first) / max(1, self._library_steps), first, last)
        return LeakDiagnosis(
            types=tuple(_growth(labels[name], type_growth[name][1]) for name in ranked),
            containers=_by_growth(
                _growth(_container_label(alive[key]), value)
                for key, value in containers
                if key in alive
            ),
            function_library=library,
            keras_names=_by_growth(_growth(key, value) for key, value in self._names.growths().items()),
            retracing=_by_growth(_growth(name, value) for name, value in self._traces.growths().items()),
        )

    def _growing_containers(self) -> list[tuple[int, tuple[float, int, int]]]:
        """Containers that existed at the baseline and gained at least one item per iteration."""
        if self._container_baseline is None or self._steps < 1:
            return []
        objects = gc.get_objects()
        now = _container_lengths(objects, self._own_ids())
        del objects
        growing = []
        for key, start in self._container_baseline.items():
            end = now.get(key, 0)
            if end - start >= self._steps:
                growing.append((key, ((end - start) / self._steps, start, end)))
        growing.sort(key=lambda item: -item[1][0])
        return growing[:_SHOWN_CONTAINERS]


def _container_lengths(objects: list[Any], own: set[int]) -> dict[int, int]:
    """``id -> len`` of every list/dict/set/deque (C-speed scan), leaving out tfmem's own."""
    containers = compress(objects, map(isinstance, objects, repeat(_CONTAINERS)))
    lengths = {id(o): len(o) for o in containers}
    for key in own:
        lengths.pop(key, None)
    return lengths


def _growth(label: str, value: tuple[float, int, int]) -> Growth:
    return Growth(label, *value)


def _by_growth(growths: Iterable[Growth]) -> tuple[Growth, ...]:
    return tuple(sorted(growths, key=lambda g: (-g.per_iteration, g.label)))


def _short_labels(names: list[str]) -> dict[str, str]:
    """``keras.src.layers.core.dense.Dense`` -> ``Dense``, unless two growing types share it."""
    short = {name: name.rsplit(".", 1)[-1] for name in names}
    clashes = collections.Counter(short.values())
    return {name: label if clashes[label] == 1 else name for name, label in short.items()}


def _objects_by_id(ids: set[int]) -> dict[int, Any]:
    if not ids:
        return {}
    return {id(o): o for o in gc.get_objects() if id(o) in ids}


def _container_label(container: Any) -> str:
    """``list 'models' (closure variable of test_fit) holding Sequential``: kind, holder, items."""
    holder = _holder(container)
    return f"{type(container).__name__}{' ' + holder if holder else ''} holding {_item_types(container)}"


def _item_types(container: Any) -> str:
    items = list(container.values()) if isinstance(container, dict) else list(container)
    names = collections.Counter(type(item).__name__ for item in items[-8:])
    return "/".join(name for name, _ in names.most_common(3)) or "nothing"


def _holder(container: Any) -> str:
    """The most telling name a growing container goes by: a global, an attribute, a variable."""
    found: list[tuple[int, str]] = []
    modules = {id(vars(module)): name for name, module in list(sys.modules.items()) if hasattr(module, "__dict__")}
    for referrer in gc.get_referrers(container):
        if isinstance(referrer, dict):
            keys = [key for key, value in referrer.items() if value is container and isinstance(key, str)]
            if keys and id(referrer) in modules:
                found.append((0, f"{keys[0]!r} (global of {modules[id(referrer)]})"))
            elif keys:
                found.append((4, repr(keys[0])))
        elif isinstance(referrer, types.CellType):
            found += [(1, name) for name in _closure_names(referrer)]
        elif isinstance(referrer, types.FrameType):
            names = [name for name, value in referrer.f_locals.items() if value is container]
            found += [(3, f"{name!r} (local of {referrer.f_code.co_name})") for name in names]
        elif isinstance(getattr(referrer, "__dict__", None), dict) and not isinstance(referrer, type):
            names = [key for key, value in referrer.__dict__.items() if value is container]
            found += [(2, f"{name!r} (attribute of {type(referrer).__name__})") for name in names]
    return min(found)[1] if found else ""


def _closure_names(cell: types.CellType) -> Iterator[str]:
    for closure in gc.get_referrers(cell):
        if not isinstance(closure, tuple):
            continue
        for function in gc.get_referrers(closure):
            if isinstance(function, types.FunctionType) and function.__closure__ is closure:
                name = function.__code__.co_freevars[closure.index(cell)]
                yield f"{name!r} (closure variable of {function.__qualname__})"
