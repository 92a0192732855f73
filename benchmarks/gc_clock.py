"""A pytest plugin for the benchmarks: how much CPU time a session spends collecting garbage,
and in its test loop.

Loaded with ``-p benchmarks.gc_clock`` on both sides of a comparison, it counts every
collection (Python's own and any a plugin asks for) through ``gc.callbacks``, and reads the
process's CPU time (all its threads) and the collections' so far as each test finishes: from
the first test's finish to the last's is the test loop, which leaves out the session's start,
the first test's one-time work (imports on first use) and the session's end. When pytest
unconfigures it writes, to the file named by ``GC_CLOCK_FILE``, the collections' CPU seconds,
the loop's, the number of tests in it, and the collections' CPU seconds in the loop: Python's
own full collections come where its count of long-lived objects says, in the loop or not, and
with TensorFlow loaded one takes about 0.2 s (0.2 ms a test over a thousand tests).
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

import pytest

_started: list[float] = []
_spent = [0.0]
# when the first test finished and when the last did: the process's CPU time, and the collections' so far
_finished: list[tuple[float, float]] = []
_tests_after_first = [0]


def _clock(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started.append(time.thread_time())
    elif _started:
        _spent[0] += time.thread_time() - _started.pop()


def pytest_configure(config: pytest.Config) -> None:
    gc.callbacks.append(_clock)


def pytest_runtest_logfinish() -> None:
    now = (time.process_time(), _spent[0])
    if _finished:
        _tests_after_first[0] += 1
        _finished[1:] = [now]
    else:
        _finished.append(now)


def pytest_unconfigure(config: pytest.Config) -> None:
    gc.callbacks.remove(_clock)
    path = os.environ.get("GC_CLOCK_FILE")
    if path:
        loop_s, loop_gc_s = (_finished[-1][i] - _finished[0][i] for i in (0, 1)) if _finished else (0.0, 0.0)
        with open(path, "w") as out:
            out.write(f"{_spent[0]:.6f} {loop_s:.6f} {_tests_after_first[0]} {loop_gc_s:.6f}\n")
