"""What piles up between the iterations of a leak check.

``GrowthTracker.observe()`` runs after the baseline and after each measured iteration (after
``gc.collect()``) and counts gc-visible Python objects by type, what the frameworks hold
(``frameworks.holders``: JAX's compiled executables and live arrays among them), the items of a
holder whose items have names, by kind (``frameworks.named_items``: TensorFlow's eager function
library by function, ``tf.function`` traces apart), and Keras's name counters. Such a quantity
is reported when it rose at *every* step: a cache filled once is not a trend. The lengths of
lists/dicts/sets/deques are compared once, baseline against the end, so a container that gains
items (numpy arrays, which gc does not track, included) is named with what holds it.

Nothing here imports TensorFlow or Keras: their state is read only once user code loaded them.
"""

from __future__ import annotations

import collections
import gc
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from itertools import compress, repeat
from typing import Any

from pytest_tfmem import frameworks
from pytest_tfmem.probes.holders import CONTAINER_TYPES, container_label, last_items
from pytest_tfmem.probes.objects import (
    keras_name_counters,
    module_global,
    own_types,
    short_labels,
    type_name,
)

_SHOWN_TYPES = 10
_SHOWN_FUNCTIONS = 3
_TRACES = "traces"  # the traces row's heading where the framework named none (older reports)
_SHOWN_CONTAINERS = 3  # naming a holder scans the heap: only for the first few
_LAST_RANK = 4  # of _type_rank: builtins


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
    """What grew at every measured iteration. ``function_library`` is the holder with named
    items (TensorFlow's function library; ``None`` where no started framework has one), with
    the kinds of its items that grew and its traces (``traces_heading``)."""

    types: tuple[Growth, ...] = ()
    containers: tuple[Growth, ...] = ()
    function_library: Growth | None = None
    library_functions: tuple[Growth, ...] = ()  # library names (numbers stripped) that grew
    keras_names: tuple[Growth, ...] = ()
    retracing: tuple[Growth, ...] = ()
    holders: tuple[Growth, ...] = ()  # the frameworks' holders (JAX executables...) that grew
    traces_heading: str = _TRACES
    # How a loop that grows the holders above is made flat, as their frameworks say (``flat_loop_advice``)
    advice: tuple[str, ...] = ()

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
            library_functions=growths("library_functions"),
            keras_names=growths("keras_names"),
            retracing=growths("retracing"),
            holders=growths("holders"),
            traces_heading=data.get("traces_heading", _TRACES),
            advice=tuple(data.get("advice", ())),
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
            text += f" ({library.start} -> {library.end})"
            if self.library_functions:
                text += ", e.g. " + _list_growths(self.library_functions, _SHOWN_FUNCTIONS, "names")
            rows.append((library.label, text))
        if self.holders:
            rows.append(("framework holders", ", ".join(
                f"{g.signed()} {g.label} per iteration ({g.start} -> {g.end})" for g in self.holders
            )))
        if self.keras_names:
            rows.append(("Keras name counters", ", ".join(f"{g.signed()} {g.label}" for g in self.keras_names)))
        if self.retracing:
            traces = ", ".join(f"{g.signed()} {g.label}" for g in self.retracing)
            rows.append((self.traces_heading, f"{traces} per iteration (new traces kept in the library)"))
        if leaked:
            rows += [("to make it flat", advice) for advice in self.advice]
        return rows


def _list_types(growths: tuple[Growth, ...], leaked: bool) -> str:
    if not growths:
        if leaked:
            return ("none: the growth is not in gc-tracked Python objects (numpy arrays, bytes and str "
                    "are not tracked) or is outside Python (TensorFlow runtime, C extensions)")
        return "none"
    return _list_growths(growths, _SHOWN_TYPES, "types")


def _list_growths(growths: tuple[Growth, ...], shown: int, what: str) -> str:
    listed = ", ".join(f"{g.signed()} {g.label}" for g in growths[:shown])
    more = len(growths) - shown
    return f"{listed}, ... ({more} more {what})" if more > 0 else listed


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


def _loaded_classes(*paths: str) -> tuple[type, ...]:
    """Classes named ``module:attribute`` whose module is already imported (never imports)."""
    classes = []
    for path in paths:
        module_name, attribute = path.split(":")
        found = module_global(module_name, attribute)
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
    return len(tiers) + type_name(kind).startswith("builtins.")  # at most _LAST_RANK


class GrowthTracker:
    """Observe the process after the baseline and each measured iteration; diagnose at the end."""

    def __init__(self) -> None:
        self._types = _EveryStep()
        self._own_types = set(own_types())
        self._container_baseline: dict[int, int] | None = None
        self._steps = -1  # observations after the baseline
        # the holder with named items (TF's function library): (size at first observation, size now)
        self._library: tuple[int, int] | None = None
        self._library_steps = 0  # observations since the first one that found it
        self._library_name = self._traces_heading = ""
        self._names = _EveryStep()
        self._kinds = _EveryStep()
        self._traces = _EveryStep()
        self._holders = _EveryStep()
        self._ignored: set[int] = set()

    def ignore(self, *containers: object) -> None:
        """Leave the caller's own growing bookkeeping (reading series) out of the diagnosis."""
        self._ignored.update(id(container) for container in containers)

    def _own_ids(self) -> set[int]:
        own = {id(self._ignored), id(self._container_baseline), *self._ignored}
        for step in (self._types, self._names, self._kinds, self._traces, self._holders):
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
        found = frameworks.named_items()
        named_by = None
        if found is not None:
            named_by, items = found
            if self._library is not None:
                self._library_steps += 1
            self._library = (items.count if self._library is None else self._library[0], items.count)
            self._library_name, self._traces_heading = items.holder, items.traces_heading
            self._kinds.observe(dict(items.kinds))
            self._traces.observe(dict(items.traces))
        self._names.observe(keras_name_counters())
        # each framework's holders read once a step: the one with named items was read above
        others = [framework for framework in frameworks.loaded() if framework is not named_by]
        self._holders.observe({
            name: holder.count for name, holder in frameworks.holders(others).items() if name != self._library_name
        })

    def diagnosis(self) -> LeakDiagnosis:
        type_growth = {type_name(kind): (kind, growth) for kind, growth in self._types.growths().items()}
        ranked = sorted(
            type_growth,
            key=lambda name: (_type_rank(type_growth[name][0]), type_growth[name][1][0], name),
        )
        labels = short_labels(ranked)
        growing = dict(self._growing_containers())
        alive = _objects_by_id(set(growing))
        containers = sorted(  # what they hold ranks them: models before thread-locals or weakrefs
            (key for key in growing if key in alive),
            key=lambda key: (_items_rank(alive[key]), -growing[key][0]),
        )[:_SHOWN_CONTAINERS]
        library = None
        if self._library is not None:
            first, last = self._library
            library = Growth(self._library_name, (last - first) / max(1, self._library_steps), first, last)
        holders = _by_growth(_growth(key, value) for key, value in self._holders.growths().items())
        grown = [growth.label for growth in (library, *holders) if growth is not None and growth.per_iteration > 0]
        advice = [found for label in grown if (found := frameworks.flat_loop_advice(label)) is not None]
        return LeakDiagnosis(
            types=tuple(_growth(labels[name], type_growth[name][1]) for name in ranked),
            containers=tuple(_growth(container_label(alive[key]), growing[key]) for key in containers),
            function_library=library,
            keras_names=_by_growth(_growth(key, value) for key, value in self._names.growths().items()),
            holders=holders,
            library_functions=_by_growth(_growth(name, value) for name, value in self._kinds.growths().items()),
            retracing=_by_growth(_growth(name, value) for name, value in self._traces.growths().items()),
            traces_heading=self._traces_heading or _TRACES,
            advice=tuple(advice),
        )

    def _growing_containers(self) -> list[tuple[int, tuple[float, int, int]]]:
        """``(id, growth)`` of the containers that existed at the baseline and gained at least
        one item per iteration."""
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
        return growing


def _container_lengths(objects: list[Any], own: set[int]) -> dict[int, int]:
    """``id -> len`` of every list/dict/set/deque (C-speed scan), leaving out tfmem's own."""
    with warnings.catch_warnings():  # isinstance reads ``__class__``: a deprecated module attribute warns
        warnings.simplefilter("ignore")
        containers = compress(objects, map(isinstance, objects, repeat(CONTAINER_TYPES)))
        lengths = {id(o): len(o) for o in containers}
    for key in own:
        lengths.pop(key, None)
    return lengths


def _growth(label: str, value: tuple[float, int, int]) -> Growth:
    return Growth(label, *value)


def _by_growth(growths: Iterable[Growth]) -> tuple[Growth, ...]:
    return tuple(sorted(growths, key=lambda g: (-g.per_iteration, g.label)))


def _objects_by_id(ids: set[int]) -> dict[int, Any]:
    if not ids:
        return {}
    return {id(o): o for o in gc.get_objects() if id(o) in ids}


def _items_rank(container: Any) -> int:
    return min((_type_rank(type(item)) for item in last_items(container)), default=_LAST_RANK)
