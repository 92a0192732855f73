"""A pytest plugin for the benchmarks: how much CPU time a session spends collecting garbage,
and in its test loop.

Loaded with ``-p benchmarks.gc_clock`` on both sides of a comparison, it counts every
collection (Python's own and any a plugin asks for) through ``gc.callbacks``, and reads the
process's CPU time (all its threads) when the first test has finished and when the session
finishes: the loop after the first test, which leaves out the session's start, the first test's
one-time work (imports on first use) and the summaries at its end. When pytest unconfigures it
writes the garbage collections' CPU seconds and the loop's, with the number of tests in it, to
the file named by ``GC_CLOCK_FILE``.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any

import pytest

_started: list[float] = []
_spent = [0.0]
_loop: list[float] = []  # process CPU time when the first test finished, and when the session finished
_tests_after_first = [0]


def _clock(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started.append(time.thread_time())
    elif _started:
        _spent[0] += time.thread_time() - _started.pop()


def pytest_configure(config: pytest.Config) -> None:
    gc.callbacks.append(_clock)


def pytest_runtest_logfinish() -> None:
    if _loop:
        _tests_after_first[0] += 1
    else:
        _loop.append(time.process_time())


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish() -> None:
    if _loop:
        _loop.append(time.process_time())


def pytest_unconfigure(config: pytest.Config) -> None:
    gc.callbacks.remove(_clock)
    path = os.environ.get("GC_CLOCK_FILE")
    if path:
        loop_s = _loop[1] - _loop[0] if len(_loop) == 2 else 0.0
        with open(path, "w") as out:
            out.write(f"{_spent[0]:.6f} {loop_s:.6f} {_tests_after_first[0]}\n")
