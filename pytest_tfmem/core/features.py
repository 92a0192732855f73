"""How features plug into the core: what they declare, and the order in which they act.

- Static facts (marker keywords, measuring markers): a module-level constant named
  ``TFMEM_DECLARATIONS`` in the feature's module (or a ``conftest.py``); the core reads it from
  every registered plugin when the manager is made. Nothing is called: a declaration is a
  value, so it can be read before any feature's object exists.
- What a feature does around one test's call phase: a ``CallStep``, registered with
  ``manager(config).add_step`` when pytest is configured; the core runs the steps in ``Step``
  order, which is the one place that order is declared.
- What a feature does once a test's teardown ran: a ``TeardownStep``, registered with
  ``manager(config).add_teardown_step``; the core runs them in ``Teardown`` order.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_tfmem.core.record import TestRecord

ATTRIBUTE = "TFMEM_DECLARATIONS"

# A marker keyword's parser: takes the value and a description of it ("tfmem marker argument
# NAME"); returns the parsed value or raises ValueError naming the value and the accepted forms.
KeywordParser = Callable[[object, str], Any]


@dataclass(frozen=True)
class Declarations:
    """A feature's static facts."""

    # Keyword arguments the feature adds to @pytest.mark.tfmem: name -> parser.
    marker_keywords: Mapping[str, KeywordParser] = field(default_factory=dict)
    # Markers besides tfmem that make a test measured (tfmem_leak...).
    measuring_markers: tuple[str, ...] = ()
    # Readers of those markers' arguments: each reads a selected test's marker once collection is
    # done, keeps what it parsed on the item, and raises ``pytest.UsageError`` for a bad one (the
    # core reports every bad marker of the session at once).
    marker_readers: tuple[Callable[[pytest.Item], None], ...] = ()


def declared(config: pytest.Config) -> list[Declarations]:
    """The declarations of every registered plugin that has one."""
    found = (getattr(plugin, ATTRIBUTE, None) for plugin in config.pluginmanager.get_plugins())
    return [declarations for declarations in found if isinstance(declarations, Declarations)]


class Step(enum.IntEnum):
    """The order in which the features act on one test, outermost (first in, last out) first.

    Before any of these, ``--tfmem-isolate`` runs a whole isolated test's protocol in another
    process (``pytest_runtest_protocol``, ``tryfirst`` against pytest's own runner): the steps
    below then happen there. The core runs them inside pytest's output and log capture.
    """

    # A ResourceExhaustedError becomes a DeviceOutOfMemory whose message quotes the verdict the
    # measurement made and the trace's directory: so it is outside both.
    GPU = 1
    # Explanations (line tracer) outside the trace: in the re-run after a memory failure the
    # explanation reads the trace, written when the trace's step ends; its report sections
    # come above the trace's.
    EXPLAIN = 2
    # TensorBoard traces (TensorFlow's profiler) outside the measurement, whose window then
    # holds only the test (and the profiler's memory while it runs).
    TRACE = 3
    # The core: the measurement window, the verdicts (budget, then ``pytest_tfmem_check``),
    # and after a memory failure the one re-run (its uses in this order too, see ``RerunUse``).
    MEASURE = 4
    # The tfmem_leak marker repeats the body inside the window: the window holds every repeat.
    LEAKS = 5


class Teardown(enum.IntEnum):
    """The order in which the features act once a test's teardown ran (pytest's and the
    fixtures'), in the process that ran it; the core runs them inside its own wrapper of
    ``pytest_runtest_teardown``, so an error one returns is the test's teardown error."""

    # The session's books: the boundary's reading (``manager(config).last_boundary``), the
    # test's retained figure and the checks on it (``pytest_tfmem_check_retained``).
    BOOKS = 1
    # The session limit reads that boundary (rather than the process again) and, past the
    # limit, finishes the fixtures the process still holds: after the books, which book them.
    LIMIT = 2


class Summary(enum.IntEnum):
    """The order of tfmem's parts of the terminal summary (``manager(config).add_summary``)."""

    GATES = 1  # the baseline comparison and the CI gates: what decides the run, first
    TABLE = 2  # the core's table of peaks, and the tests that were not measured
    SESSION = 3  # what the tests left behind: the session's account, beside the peaks
    TRACE = 4  # where the failing tests' traces are
    ISOLATE = 5  # the isolated tests' own table, and the session limit's replacements
    GPU = 6  # notes on the GPU views (NVML's problems, GPU budgets with nothing to check)


def _never(item: pytest.Item) -> bool:
    return False


@dataclass(frozen=True)
class CallStep:
    """A feature's part in each test's call phase.

    ``around(item)`` is entered before the test's call phase, in ``Step`` order, and left after
    it (with the test's exception, which it may replace). ``profiles(item)``: it runs
    TensorFlow's profiler over this test's own run; TensorFlow runs one at a time, so the
    first step that profiles a test marks it (``core.handoffs.PROFILER_IN_USE``) before any
    step starts. ``sections(item, record)``: the measured test's report sections from this
    feature, in ``Step`` order below the core's ``tfmem`` section.
    """

    step: Step
    around: Callable[[pytest.Item], AbstractContextManager[object]] | None = None
    profiles: Callable[[pytest.Item], bool] = _never
    sections: Callable[[pytest.Item, TestRecord], list[tuple[str, str]] | None] | None = None


@dataclass(frozen=True)
class TeardownStep:
    """A feature's part after each test's teardown: ``after(item, nextitem)`` returns the
    error to fail the teardown with, or ``None``. It runs whether or not the teardown raised
    (then the teardown's own error stands); every step runs, and the first error returned
    is raised."""

    step: Teardown
    after: Callable[[pytest.Item, pytest.Item | None], BaseException | None]
