"""Name a growing container for a leak report: what refers to it, and what it holds.

``list 'models' (closure variable of test_fit.<locals>.step) holding Sequential`` tells a user
where to look. Finding the referrers scans the heap (``gc.get_referrers``), so this runs only
for the few containers a report shows, once, after the measured iterations.
"""

from __future__ import annotations

import collections
import gc
import sys
import types
from collections.abc import Iterator
from typing import Any

from pytest_tfmem.probes.objects import instance_dict

# The containers whose growth a diagnosis follows (what piles up in a module global).
CONTAINER_TYPES = (list, dict, set, collections.deque)


def container_label(container: Any) -> str:
    """``list 'models' (closure variable of test_fit) holding Sequential``: kind, holder, items."""
    holder = _holder(container)
    return f"{type(container).__name__}{' ' + holder if holder else ''} holding {_item_types(container)}"


def last_items(container: Any) -> list[Any]:
    items = list(container.values()) if isinstance(container, dict) else list(container)
    return items[-8:]


def _item_types(container: Any) -> str:
    names = collections.Counter(type(item).__name__ for item in last_items(container))
    return "/".join(name for name, _ in names.most_common(3)) or "nothing"


def _holder(container: Any) -> str:
    """The most telling name a growing container goes by: a global, an attribute, a variable."""
    found: list[tuple[int, str]] = []
    modules: dict[int, str] = {}
    for name, module in list(sys.modules.items()):  # the first name wins: __main__, not an alias
        namespace = instance_dict(module) if isinstance(module, types.ModuleType) else None
        if namespace is not None:
            modules.setdefault(id(namespace), name)
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
        elif (attributes := instance_dict(referrer)) is not None and not isinstance(referrer, type):
            names = [key for key, value in attributes.items() if value is container]
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
