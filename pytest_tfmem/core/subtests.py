"""Subtests: a figure for each subtest of a measured test.

pytest (9 and later) runs ``with subtests.test(...)`` blocks (the ``subtests`` fixture) and
``unittest``'s ``with self.subTest(...)`` blocks as subtests: each one is reported on its own
(a ``pytest.SubtestReport``, ``when == "call"``) as it ends, from inside the test's call phase.
The test itself is measured as always, over its whole call phase, and its budget applies to
that; its subtests get figures of their own beside it, listed under it.

No hook marks where a subtest starts, so a subtest's window opens where the one before it ended:
the first subtest's is the test's own window so far (nothing is opened for a test without
subtests), each later one's opens where the subtest before it ended. What a test does before its
first subtest, or between two, is counted in the next subtest's figure; what it does after its
last one, in none (only in the test's). The later windows nest in the test's own
(``core.measure``), so they never change its figure.

Between two windows freed heap is handed back to the OS, so that a subtest does not reuse what
the one before it freed without its RSS rising; only the young generations of garbage are
collected there (a full collection costs a quarter of a second with TensorFlow loaded).

What a subtest *retained* is what it left for the rest of its test: the process read where its
window opened and where the next one opens (after that collection and heap return; the first
subtest's start is the test's window's), in the two views of a test's retained figure
(``core.retained``): host memory outside TensorFlow's pool, and TensorFlow's CPU allocator in
use. So the subtests' retained figures add up to what the test's subtests kept, in process and
isolated alike. Garbage only an older generation's collection would free counts as kept.
"""

from __future__ import annotations

import gc
import unittest
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_tfmem.core.measure import Measurement, Monitor, PeakTracker
from pytest_tfmem.core.retained import Level, ResidentPool, current_level

# pytest 9's subtest reports and ``subtests`` fixture; ``None`` on pytest 8, which has no subtests of its own.
_SUBTEST_REPORT: type | None = getattr(pytest, "SubtestReport", None)
_SUBTESTS_FIXTURE: type | None = getattr(pytest, "Subtests", None)


@dataclass(frozen=True)
class SubtestFigure:
    """One subtest's measurement, as listed under its test (in the record and the JSON report)."""

    description: str  # what pytest shows after SUBPASSED: "[message] (i=2)"
    outcome: str  # the subtest's own: passed, failed, skipped
    measurement: Measurement
    # What it left for the rest of its test (module docstring), in bytes: host memory outside
    # TensorFlow's pool, and TensorFlow's CPU allocator in use. ``None`` in older records.
    retained_host: int | None = None
    retained_tf: int | None = None

    @property
    def retained(self) -> int | None:
        """The headline, as a test's: host outside TensorFlow's pool plus tensors, kept."""
        if self.retained_host is None:
            return None
        return self.retained_host + (self.retained_tf or 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "description": self.description,
            "outcome": self.outcome,
            "measurement": self.measurement.to_dict(),
            "retained_bytes": self.retained,
            "retained_host_bytes": self.retained_host,
            "retained_tf_bytes": self.retained_tf,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SubtestFigure:
        return cls(
            data["description"],
            data["outcome"],
            Measurement.from_dict(data["measurement"]),
            data.get("retained_host_bytes"),
            data.get("retained_tf_bytes"),
        )


def subtest_description(report: pytest.TestReport) -> str | None:
    """``[message] (i=2)`` for a subtest's report (as pytest shows it), ``None`` for any other."""
    if _SUBTEST_REPORT is None or not isinstance(report, _SUBTEST_REPORT):
        return None
    domain = report.location[2]
    head_line = report.head_line or ""  # "<domain> <description>"
    return head_line[len(domain):].strip() if head_line.startswith(domain) else head_line


def _young_garbage() -> None:
    gc.collect(1)


@dataclass
class _OpenTest:
    test_window: Monitor
    start: Level  # the process where the current subtest's window opened
    pool: ResidentPool  # TensorFlow's pool as resident memory, from one of the test's readings to the next
    figures: list[SubtestFigure]
    window: Monitor | None = None  # the current subtest's, from the second subtest on


def _can_have_subtests(item: pytest.Item) -> bool:
    """pytest reports subtests (9 and later) of a test that uses the ``subtests`` fixture and of
    a ``unittest.TestCase`` method (``self.subTest``); no other test has any."""
    if _SUBTEST_REPORT is None:
        return False
    if "subtests" in getattr(item, "fixturenames", ()):
        return True
    case = getattr(item, "cls", None)
    return isinstance(case, type) and issubclass(case, unittest.TestCase)


class SubtestWindows:
    """The subtest windows of the tests being measured in this process, by node id.

    ``begin`` when a test's window opens, ``ended`` for each subtest report, ``end`` when the
    test's window closes (it returns the test's subtest figures, in the order they ran).
    """

    def __init__(self, trackers: Callable[[], Sequence[PeakTracker]]) -> None:
        self._trackers = trackers  # the features' trackers, as the test's own window reads them
        self._open: dict[str, _OpenTest] = {}

    def begin(self, item: pytest.Item, test_window: Monitor) -> None:
        """The test's window just opened: until its first subtest ends, that is the subtest's too.
        Nothing is read for a test that can have no subtests."""
        if not _can_have_subtests(item):
            return
        pool = ResidentPool()
        self._open[item.nodeid] = _OpenTest(test_window, pool.level(current_level()), pool, [])

    def ended(self, report: pytest.TestReport) -> bool:
        """A subtest of a test measured here ended with this report: close its window, open the
        next one. False for any other report (also for subtest reports that reach an xdist
        controller or the parent of an isolated test: their figures come in the test's record)."""
        test = self._open.get(report.nodeid)
        description = subtest_description(report)
        if test is None or description is None:
            return False
        measurement = test.test_window.snapshot() if test.window is None else test.window.stop()
        test.window = Monitor(collect=_young_garbage, trackers=self._trackers()).start()
        after = test.pool.level(current_level())
        host, tf = after.outside_pool - test.start.outside_pool, after.tf_in_use - test.start.tf_in_use
        test.figures.append(SubtestFigure(description, report.outcome, measurement, host, tf))
        test.start = after
        return True

    def end(self, nodeid: str) -> list[SubtestFigure]:
        """The test's window closes: its subtests' figures (none for a test without subtests)."""
        test = self._open.pop(nodeid, None)
        if test is None:
            return []
        if test.window is not None:
            test.window.stop()  # what ran after the last subtest is no subtest's
        return test.figures


class QuietSubtests:
    """Stands in for the ``subtests`` fixture when tfmem runs a test's body once more after a
    memory failure (``core.rerun``): the subtests run as in the test's own run, a failing one
    does not stop the body, and none is reported (the test's reports are its own run's)."""

    def test(self, msg: str | None = None, **kwargs: Any) -> AbstractContextManager[None]:
        return _quiet_subtest()


@contextmanager
def _quiet_subtest() -> Iterator[None]:
    try:
        yield
    except (Exception, pytest.fail.Exception, pytest.skip.Exception):
        pass  # as with the fixture's own subtests, the body goes on after a failed one


def for_rerun(value: object) -> object:
    """A fixture value as a re-run of the test's body gets it: the ``subtests`` fixture quieted."""
    if _SUBTESTS_FIXTURE is not None and isinstance(value, _SUBTESTS_FIXTURE):
        return QuietSubtests()
    return value
