"""Run a test's body once more, in the same process, right after it failed.

Used to look at a failed test with tools too costly to run on every test (the TensorFlow
profiler). What the second run shares with the first, and why that is the safer choice:

- the same fixture values: fixtures are not set up again (no second database, download or
  session-wide side effect), but a test that changed its fixtures sees them changed;
- the same warm process: TensorFlow's runtime and compiled functions are already there, so
  the second run shows the test rather than start-up work;
- it runs before teardown, inside pytest's output capture. The second run's output is kept
  apart from the first run's, which stays the test's captured output.

The second run never changes the test's outcome: its exception is caught and described.
A test whose body must not run twice opts out with ``@pytest.mark.tfmem(trace="off")``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from . import plugin
from .measure import Measurement, Monitor


@dataclass(frozen=True)
class RerunResult:
    """The second run: its measurement and how it ended (``None`` when it returned)."""

    measurement: Measurement
    error: str | None


@dataclass
class RerunOutput:
    """What the second run (and tools around it) printed, read when the ``with`` block ends."""

    text: str = ""


def can_rerun(item: pytest.Item) -> bool:
    """Plain (non-async) test functions only: their body can be called again directly."""
    return isinstance(item, pytest.Function) and not inspect.iscoroutinefunction(item.obj)


def _read_captured(item: pytest.Item) -> tuple[str, str]:
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        return "", ""
    try:
        out, err = capture.read_global_capture()
    except (AssertionError, AttributeError):  # capturing not started (pytest internals differ)
        return "", ""
    return out, err


@contextmanager
def separate_output(item: pytest.Item) -> Iterator[RerunOutput]:
    """Keep what the block prints out of the test's captured output.

    On entry the first run's captured output is filed as the test's ``call`` output; on exit
    what was printed since is read into the yielded ``RerunOutput`` instead.
    """
    out, err = _read_captured(item)
    item.add_report_section("call", "stdout", out)
    item.add_report_section("call", "stderr", err)
    output = RerunOutput()
    try:
        yield output
    finally:
        out, err = _read_captured(item)
        output.text = "".join(part for part in (out and f"--- stdout ---\n{out}", err and f"--- stderr ---\n{err}") if part)


def rerun_test_body(item: pytest.Function) -> RerunResult:
    """Call the test function again with its fixture values, measured by a fresh ``Monitor``."""
    arguments = {name: item.funcargs[name] for name in item._fixtureinfo.argnames}
    monitor = Monitor()
    item.stash[plugin.MONITOR] = monitor  # ``tfmem.peak()`` works in the second run too
    error = None
    monitor.start()
    try:
        item.obj(**arguments)
    except pytest.exit.Exception:
        raise
    except (Exception, pytest.fail.Exception, pytest.skip.Exception) as raised:
        error = f"{type(raised).__name__}: {raised}".strip()
        del raised
    finally:
        measurement = monitor.stop()
        del item.stash[plugin.MONITOR]
    return RerunResult(measurement, error)
