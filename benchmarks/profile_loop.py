"""A pytest plugin for ``benchmarks/per_test_profile.py``: ``cProfile`` over the test loop alone.

Loaded with ``-p benchmarks.profile_loop``, it profiles ``pytest_runtestloop`` (every test's
protocol, nothing of the session's start or end) and writes the statistics to the file named by
``PROFILE_LOOP_FILE``. Under ``python -m cProfile`` the whole process was profiled, TensorFlow's
import too (two thirds of the profiled session's CPU), and only functions called once a test or
more were read.
"""

from __future__ import annotations

import cProfile
import os
from collections.abc import Generator

import pytest


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, None, None]:
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        profiler.dump_stats(os.environ["PROFILE_LOOP_FILE"])
