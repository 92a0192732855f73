"""Run a test's body once more, in the same process, after it failed a tfmem memory check.

Used to confirm a verdict on a test's figures before it stands (``core.confirm``: a first run
that paid one-time costs of the process is told apart from a test's own need), and to look at a
memory failure with tools too costly to run on every test (TensorFlow's profiler, the line
tracer). Only a tfmem verdict (budget, leak, baseline, history, GPU budget, device out of memory)
or a figure far above the test's recorded level leads to a re-run, never an ordinary failure, and
the body runs again at most once however many features asked for it (each with a ``RerunUse``,
from ``pytest_tfmem_rerun_wanted``).
What the second run shares with the first, and why that is the safer choice:

- the same fixture values: fixtures are not set up again (no second database, download or
  session-wide side effect), but a test that changed its fixtures sees them changed. The
  ``subtests`` fixture is the exception: its subtests run but are not reported again. A
  ``unittest.TestCase`` method runs on a fresh instance of its class, with ``setUp`` and
  ``tearDown`` around it, as unittest runs it (class-level set-up is not repeated);
- the same warm process: TensorFlow's runtime and compiled functions are already there, so
  the second run shows the test rather than start-up work;
- it runs before teardown, inside pytest's output capture. The second run's output is kept
  apart from the first run's, which stays the test's captured output.

The second run's exception is caught and described: a re-run that raised confirms nothing, and
the first run's verdict stands.
A test whose body must not run twice opts out with ``@pytest.mark.tfmem(rerun=False)``; its
report then says what was skipped and why.
"""

from __future__ import annotations

import inspect
import unittest
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import pytest

from pytest_tfmem.core import pytest_internals
from pytest_tfmem.core.features import Step
from pytest_tfmem.core.measure import Measurement, Monitor
from pytest_tfmem.core.subtests import for_rerun

RERUN_KEYWORD = "rerun"  # tfmem(rerun=False) forbids re-runs of a test


@dataclass(frozen=True)
class RerunResult:
    """The second run: its measurement and how it ended (``None`` when it returned)."""

    measurement: Measurement
    error: str | None


@dataclass(frozen=True)
class RerunUse:
    """What one feature makes of the re-run after a memory failure, and how it takes part.

    ``around(rerun)`` is entered before the body runs again and left after it, in the order of
    ``step`` (``core.features.Step``): set up there (a profiler, a line tracer) and read
    ``rerun.result`` on the way out. TensorFlow runs one profiler at a time: the first use that
    ``profiles`` runs it, and while it does ``core.handoffs.PROFILER_IN_USE`` is in the item's
    stash.
    """

    step: Step
    gives: str  # what the report names it: "TensorBoard trace" ("not re-run, so no TensorBoard trace")
    around: Callable[[Rerun], AbstractContextManager[object]]
    profiles: bool = False


@dataclass
class Rerun:
    """The one re-run of a test, shared by the features that asked for it."""

    uses: tuple[RerunUse, ...]
    result: RerunResult | None = None  # set by the core once the body has run
    output: str = ""  # what the body printed


def is_unittest_method(item: pytest.Item) -> bool:
    """A ``unittest.TestCase`` method (``tf.test.TestCase``, absl ``parameterized.TestCase``...)."""
    cls = getattr(item, "cls", None)
    return isinstance(item, pytest.Function) and isinstance(cls, type) and issubclass(cls, unittest.TestCase)


def rerun_refusal(item: pytest.Item, allowed: bool) -> str | None:
    """Why the test's body cannot run again (``allowed``: its marker's ``rerun``), or ``None``."""
    if not allowed:
        return f"re-runs are off for this test (tfmem({RERUN_KEYWORD}=False))"
    if not isinstance(item, pytest.Function):
        kind = type(item).__name__
        article = "an" if kind[:1].upper() in "AEIOU" else "a"
        return (f"{article} {kind} is not re-run: only test functions and unittest.TestCase methods are (a "
                "notebook's cell or a file's items would run again in a state the first run changed)")
    if inspect.iscoroutinefunction(item.obj) or inspect.iscoroutinefunction(getattr(item.cls, item.name, None)):
        return "an async test cannot be re-run"
    return None


def _read_captured(item: pytest.Item) -> tuple[str, str]:
    return pytest_internals.read_global_capture(item.config) or ("", "")


@contextmanager
def separate_output(item: pytest.Item) -> Iterator[None]:
    """Keep what the block prints out of the test's captured output.

    On entry the first run's captured output is filed as the test's ``call`` output; inside,
    ``read_output`` reads what was printed since; on exit the rest is dropped.
    """
    out, err = _read_captured(item)
    item.add_report_section("call", "stdout", out)
    item.add_report_section("call", "stderr", err)
    try:
        yield
    finally:
        _read_captured(item)


def read_output(item: pytest.Item) -> str:
    """What was printed since the last read, as one text (inside ``separate_output``)."""
    out, err = _read_captured(item)
    return "".join(part for part in (out and f"--- stdout ---\n{out}", err and f"--- stderr ---\n{err}") if part)


def _run_unittest_method(item: pytest.Function) -> str | None:
    """Run the method on a fresh instance of its class, as unittest does; how it ended."""
    assert item.cls is not None
    result = unittest.TestResult()
    item.cls(item.name).run(result)
    for _, traceback_text in result.errors + result.failures:
        return traceback_text.strip().splitlines()[-1]
    for _, reason in result.skipped:
        return f"skipped: {reason}"
    return None


def rerun_test_body(item: pytest.Function, monitor_key: pytest.StashKey[Monitor], monitor: Monitor) -> RerunResult:
    """Run the test's body again, measured by ``monitor`` (a fresh one, made as the first run's
    was, so that the two figures compare; kept in the item's stash under ``monitor_key``
    meanwhile, so ``tfmem.peak()`` works in the second run too)."""
    item.stash[monitor_key] = monitor
    error = None
    monitor.start()
    try:
        if is_unittest_method(item):
            error = _run_unittest_method(item)
        else:
            item.obj(**{name: for_rerun(item.funcargs[name]) for name in pytest_internals.fixture_argnames(item)})
    except pytest.exit.Exception:
        raise
    except (Exception, pytest.fail.Exception, pytest.skip.Exception) as raised:
        error = f"{type(raised).__name__}: {raised}".strip()
        del raised
    finally:
        measurement = monitor.stop()
        del item.stash[monitor_key]
    return RerunResult(measurement, error)
