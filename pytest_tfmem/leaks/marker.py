"""The ``tfmem_leak`` marker, and leak numbers on test records.

``@pytest.mark.tfmem_leak(iterations=10, warmup=3, max_growth="1MB")`` runs the test body
``warmup + iterations`` times as a leak check. Fixtures are set up once: the body is called
again with the same fixture values (a ``unittest.TestCase`` method: between one ``setUp`` and
one ``tearDown``), so what grows is what the body leaves behind. A leak
fails the test with ``LeakDetected`` through the core's checks, like ``tfmem.assert_no_leak``.

Every leak check of a test (the marker's, or the ``tfmem`` fixture's) is put on its record as
``record.extra["leak"]`` (``LeakReport.to_dict()``; the largest growth if there were several).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pytest_tfmem.core import features
from pytest_tfmem.core.features import CallStep, Step
from pytest_tfmem.core.fixture import FIXTURE_TYPE
from pytest_tfmem.core.handoffs import LeakHandoff, put_on
from pytest_tfmem.core.manager import manager
from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.core.verdict import Verdict
from pytest_tfmem.leaks import check as leaks
from pytest_tfmem.leaks.fixture import LeakCheckingFixture

MARKER = "tfmem_leak"
KEYWORDS = ("iterations", "warmup", "max_growth")
ARGUMENTS = pytest.StashKey[tuple[int, int, int]]()
REPORT = pytest.StashKey[leaks.LeakReport]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[FIXTURE_TYPE] = LeakCheckingFixture  # ``tfmem.leak_check``, ``tfmem.assert_no_leak``
    manager(config).add_step(CallStep(Step.LEAKS, repeat_marked_body))
    config.addinivalue_line(
        "markers",
        f"{MARKER}(iterations={leaks.DEFAULT_ITERATIONS}, warmup={leaks.DEFAULT_WARMUP}, "
        f"max_growth='{leaks.DEFAULT_MAX_GROWTH}'): run the test body warmup + iterations times "
        "(fixtures set up once) and fail it with LeakDetected if memory grows by more than "
        "max_growth per iteration (pytest-tfmem)",
    )


def leak_arguments(item: pytest.Item) -> tuple[int, int, int] | None:
    """``(iterations, warmup, max_growth bytes)`` of the item's closest ``tfmem_leak`` marker.

    Raises ``pytest.UsageError`` naming the test, the bad argument and what is accepted.
    """
    mark = item.get_closest_marker(MARKER)
    if mark is None:
        return None
    where = f"pytest-tfmem: {item.nodeid}: @pytest.mark.{MARKER}"
    if mark.args:
        raise pytest.UsageError(f"{where} takes keyword arguments only ({', '.join(KEYWORDS)}), got {mark.args!r}")
    unknown = sorted(set(mark.kwargs) - set(KEYWORDS))
    if unknown:
        raise pytest.UsageError(f"{where}: unknown argument {unknown[0]!r}; accepted: {', '.join(KEYWORDS)}")
    try:
        return leaks.check_arguments(
            mark.kwargs.get("iterations", leaks.DEFAULT_ITERATIONS),
            mark.kwargs.get("warmup", leaks.DEFAULT_WARMUP),
            mark.kwargs.get("max_growth", leaks.DEFAULT_MAX_GROWTH),
        )
    except ValueError as error:
        raise pytest.UsageError(f"{where}: {error}") from None


def read_leak_marker(item: pytest.Item) -> None:
    """Keep the test's ``tfmem_leak`` arguments on it (``TFMEM_DECLARATIONS``: the core reads the
    markers of the selected tests)."""
    arguments = leak_arguments(item)
    if arguments is not None:
        item.stash[ARGUMENTS] = arguments


TFMEM_DECLARATIONS = features.Declarations(measuring_markers=(MARKER,), marker_readers=(read_leak_marker,))


@contextmanager
def repeat_marked_body(item: pytest.Item) -> Iterator[None]:
    """Make a marked test's body run repeatedly: a function with its fixture values (set up
    once), a ``unittest.TestCase`` method between one ``setUp`` and one ``tearDown``
    (``Step.LEAKS``: inside the measurement)."""
    arguments = item.stash.get(ARGUMENTS, None)
    if arguments is None:
        yield
        return
    if not isinstance(item, pytest.Function):
        pytest.fail(f"@pytest.mark.{MARKER} repeats test functions and unittest.TestCase methods, "
                    f"not a {type(item).__name__}", pytrace=False)
    function = item.obj
    if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
        pytest.fail(f"@pytest.mark.{MARKER} repeats plain test functions only; "
                    "call tfmem.assert_no_leak(...) inside an async test instead", pytrace=False)
    trackers = manager(item.config).trackers()

    @functools.wraps(function)
    def repeated(*args: object, **kwargs: object) -> None:
        item.stash[REPORT] = leaks.leak_check(
            functools.partial(function, *args, **kwargs), *arguments, trackers=trackers
        )

    item.obj = repeated  # what pytest calls: with the fixture values, or from unittest's run
    try:
        yield
    finally:
        item.obj = function


@pytest.hookimpl
def pytest_tfmem_check(item: pytest.Item, record: TestRecord) -> Verdict | None:
    """The marker's verdict; the numbers of every leak check of the test on its record."""
    marker_report = item.stash.get(REPORT, None)
    reports = [marker_report] if marker_report is not None else []
    fixture = getattr(item, "funcargs", {}).get("tfmem")
    if isinstance(fixture, LeakCheckingFixture):
        reports += fixture.leak_reports  # their verdicts were raised (or caught) in the test body
    if reports:
        largest = max(reports, key=lambda r: r.growth_per_iteration)
        put_on(record, LeakHandoff(largest.growth_per_iteration), largest.to_dict())
    return marker_report.verdict if marker_report is not None else None
