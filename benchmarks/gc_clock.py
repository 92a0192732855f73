"""A pytest plugin for the benchmarks: how much CPU time a session spends collecting garbage.

Loaded with ``-p benchmarks.gc_clock`` on both sides of a comparison, it counts every
collection (Python's own and any a plugin asks for) through ``gc.callbacks`` and writes the
total CPU seconds to the file named by ``GC_CLOCK_FILE`` when pytest unconfigures.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

import pytest

_started: list[float] = []
_spent = [0.0]


def _clock(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started.append(time.thread_time())
    elif _started:
        _spent[0] += time.thread_time() - _started.pop()


def pytest_configure(config: pytest.Config) -> None:
    gc.callbacks.append(_clock)


def pytest_unconfigure(config: pytest.Config) -> None:
    gc.callbacks.remove(_clock)
    path = os.environ.get("GC_CLOCK_FILE")
    if path:
        with open(path, "w") as out:
            out.write(f"{_spent[0]:.6f}\n")
