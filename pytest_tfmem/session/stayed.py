"""What stayed after a test: the lines that say what a test left behind, and who holds it.

At each test's start a ``Snapshot`` is cheap: the lengths of the containers (lists, dicts, sets,
deques) that the user's own modules hold as globals (test modules, conftest files, the project's
code: modules outside the standard library and site-packages), the size of TensorFlow's eager
function library, Keras's name counters and the number of modules imported. After a test that
left more than the threshold, ``what_stayed`` compares them, and lists the objects that survived
the test: after ``gc.freeze()`` at the previous window, ``gc.get_objects()`` lists only objects
made since, so the new survivors cost no scan of the whole heap. NumPy arrays are not tracked by
the collector: they are found through the containers that gained them.

What the frameworks hold (``frameworks.holders``: TensorFlow's function library, JAX's compiled
executables and live arrays, PyTorch's CUDA cache) is compared too. The lines lead with the
largest holder in bytes and end by saying how much of the test's figure the named holders account
for; what is counted but not sized (functions, executables on CPU) is the native rest.
"""

from __future__ import annotations

import collections
import os
import sys
import sysconfig
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pytest_tfmem import frameworks
from pytest_tfmem.frameworks import Holder
from pytest_tfmem.probes.holders import CONTAINER_TYPES
from pytest_tfmem.probes.objects import (
    OWN_PACKAGE,
    SizesByType,
    instance_dict,
    keras_name_counters,
    own_types,
    short_labels,
    type_name,
)
from pytest_tfmem.units import format_size

_SHOWN = 3
_SHOWN_TYPES = 5
_SMALL = 64 * 2**10  # new objects of pytest's own, or small builtins, are not worth a mention
_NAMED_AT_LEAST = 2**10  # a holder of less is left out of the lines
_FRAMEWORKS = ("keras", "tf_keras", *(framework.module for framework in frameworks.KNOWN))


@dataclass(frozen=True)
class Snapshot:
    """The cheap figures read at a test's start (see the module docstring)."""

    modules: int
    containers: dict[tuple[str, str], int] = field(default_factory=dict)  # (module, global) -> len
    holders: dict[str, Holder] = field(default_factory=dict)  # what the frameworks hold, by name
    keras_names: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Stayed:
    """What stayed after a test: the holders sized in bytes (``sized``, largest first, and their
    sum ``named_bytes``), and what was counted but not sized (``native``)."""

    sized: tuple[str, ...]
    named_bytes: int
    native: tuple[str, ...] = ()

    def lines(self, figure: int) -> tuple[str, ...]:
        """The lines for a test that left ``figure`` bytes: the sized holders, then ``named 9.8
        of 243.3 MiB; the rest is native memory (...)``. The test is never said to have left more
        than ``figure``: holders that gained more (memory the process had freed earlier, reused)
        are named up to it, and the line says so."""
        rest = f"; the rest is native memory ({', '.join(self.native)})" if self.native else ""
        if self.named_bytes > figure:
            rest = (f"; the holders above gained {format_size(self.named_bytes)}, more than the process grew: "
                    "part of it reused memory freed before the test")
        return (*self.sized, f"named {_share(self.named_within(figure), figure)}{rest}")

    def named_within(self, figure: int) -> int:
        """What the holders account for of a test that left ``figure`` bytes: never more than it."""
        return max(0, min(self.named_bytes, figure))


class Watcher:
    """Takes snapshots and says what stayed; remembers which modules are the user's."""

    def __init__(self) -> None:
        paths = [sysconfig.get_paths().get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")]
        # Both as configured and with links resolved; module files are compared as strings (no
        # system call per module: a session imports thousands)
        self._library_paths = tuple(
            {os.path.join(form, "") for path in paths if path for form in (path, os.path.realpath(path))}
        )
        self._users: dict[str, bool] = {}
        self._modules_seen = -1
        self._watched: list[tuple[str, dict[str, Any]]] = []
        self._own_types: set[type] | None = None

    def _is_users(self, name: str, module: Any) -> bool:
        known = self._users.get(name)
        if known is None:
            namespace = instance_dict(module) if isinstance(module, types.ModuleType) else None
            file = namespace.get("__file__") if namespace is not None else None
            known = False
            if isinstance(file, str) and name != OWN_PACKAGE and not name.startswith(OWN_PACKAGE + "."):
                known = not file.startswith(self._library_paths)
            self._users[name] = known
        return known

    def _watched_modules(self) -> list[tuple[str, dict[str, Any]]]:
        if len(sys.modules) != self._modules_seen:
            self._modules_seen = len(sys.modules)
            self._watched = [  # each module is classified once: a later scan is dictionary lookups
                (name, namespace) for name, module in list(sys.modules.items())
                if self._is_users(name, module) and (namespace := instance_dict(module)) is not None
            ]
        return self._watched

    def snapshot(self) -> Snapshot:
        containers = {
            (name, key): len(value)
            for name, namespace in self._watched_modules()
            for key, value in list(namespace.items())
            if isinstance(value, CONTAINER_TYPES)
        }
        return Snapshot(len(sys.modules), containers, frameworks.holders(), keras_name_counters())

    def what_stayed(self, before: Snapshot, new_objects: Iterable[Any]) -> Stayed:
        """What a test left: the holders sized in bytes (containers that grew, new objects, the
        frameworks' sized holders), and what was counted but not sized (the frameworks' other
        holders, Keras's name counters, modules imported)."""
        size_of = SizesByType()
        containers, items = self._grown_containers(before, size_of)
        left = (obj for obj in new_objects if id(obj) not in items)  # no double count
        sized = containers + self._new_objects(left, size_of)
        counted: list[tuple[None, str]] = []
        for holder in frameworks.holders().values():
            grown = _holder_growth(before.holders.get(holder.name), holder)
            if grown is not None and grown[0] is None:
                counted.append((None, grown[1]))
            elif grown is not None and grown[0] is not None:
                sized.append((grown[0], grown[1]))
        sized = sorted((entry for entry in sized if entry[0] >= _NAMED_AT_LEAST), key=lambda entry: -entry[0])
        grown_names = {
            key: count - before.keras_names.get(key, 0)
            for key, count in keras_name_counters().items() if count > before.keras_names.get(key, 0)
        }
        if grown_names:
            names = sorted(grown_names.items(), key=lambda item: (-item[1], item[0]))
            counted.append((None, "Keras name counters " + ", ".join(f"+{n} {key}" for key, n in names[:_SHOWN])))
        imported = list(sys.modules)[before.modules:]
        if imported:
            more = f", ... ({len(imported) - _SHOWN} more)" if len(imported) > _SHOWN else ""
            counted.append((None, f"modules imported: {len(imported)} ({', '.join(imported[:_SHOWN])}{more})"))
        return Stayed(tuple(text for _, text in sized), sum(size for size, _ in sized), tuple(t for _, t in counted))

    def _grown_containers(self, before: Snapshot, size_of: SizesByType) -> tuple[list[tuple[int, str]], set[int]]:
        """The user's global containers that gained items, with the bytes the new items hold;
        and the ids of those items."""
        found = []
        ids: set[int] = set()
        namespaces = dict(self._watched_modules())
        for (module, key), length in before.containers.items():
            container = namespaces.get(module, {}).get(key)
            if not isinstance(container, CONTAINER_TYPES) or len(container) <= length:
                continue
            added = len(container) - length
            if isinstance(container, dict):
                items: list[Any] = list(container.values())[-added:]
            elif isinstance(container, set):
                items = []  # no order: which items are new is not known
            else:
                items = list(container)[-added:]
            ids.update(map(id, items))
            size = sum(map(size_of, items))
            kinds = collections.Counter(type(item).__name__ for item in items)
            held = "/".join(kind for kind, _ in kinds.most_common(_SHOWN))
            what = f": {held} {format_size(size)}" if items else ""
            found.append((size, f"{type(container).__name__} {key!r} (global of {module}) "
                                f"+{added} item{'s' if added != 1 else ''}{what}"))
        found.sort(key=lambda entry: -entry[0])
        return found[:_SHOWN], ids

    def _telling_type(self, kind: type) -> bool:
        """A TensorFlow or Keras type, or one of the user's own: worth naming however small."""
        module = type_name(kind).rsplit(".", 1)[0]
        return module.split(".")[0] in _FRAMEWORKS or self._users.get(module, False)

    def _new_objects(self, objects: Iterable[Any], size_of: SizesByType) -> list[tuple[int, str]]:
        if self._own_types is None:
            self._own_types = set(own_types())
        counts: collections.Counter[type] = collections.Counter()
        sizes: collections.Counter[type] = collections.Counter()
        for value in objects:
            kind = type(value)
            if kind in self._own_types:
                continue
            counts[kind] += 1
            sizes[kind] += size_of(value)
        telling = [kind for kind in counts if sizes[kind] >= _SMALL or self._telling_type(kind)]
        if not telling:
            return []
        ranked = sorted(telling, key=lambda kind: (-sizes[kind], -counts[kind]))[:_SHOWN_TYPES]
        labels = short_labels([type_name(kind) for kind in ranked])
        listed = ", ".join(
            f"{labels[type_name(kind)]} +{counts[kind]} ({format_size(sizes[kind])})" for kind in ranked
        )
        return [(sum(sizes[kind] for kind in ranked), f"new objects alive: {listed}")]


def _holder_growth(before: Holder | None, now: Holder) -> tuple[int | None, str] | None:
    """``(bytes or None, "JAX compiled executables +12 (3 -> 15)")`` where the holder grew."""
    count_before = before.count if before is not None else 0
    bytes_before = (before.bytes or 0) if before is not None else 0
    added = now.count - count_before
    grew_bytes = now.bytes - bytes_before if now.bytes is not None else None
    if added <= 0 and not grew_bytes:
        return None
    unit = f" {now.unit}" if now.unit else ""
    text = f"{now.name} {added:+d}{unit} ({count_before} -> {now.count})"
    if grew_bytes is None:
        return None, text
    return grew_bytes, f"{text} {format_size(grew_bytes, signed=True)}"


def _share(named: int, figure: int) -> str:
    """``9.8 of 243.3 MiB``: both in the unit of the larger."""
    unit, scale = next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if max(named, figure) >= s),
                       ("B", 1))
    digits = 0 if unit == "B" else 1
    return f"{named / scale:.{digits}f} of {figure / scale:.{digits}f} {unit}"
