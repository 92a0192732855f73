"""Hooks that pytest-tfmem calls, for its own feature modules and for users' conftest files."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_tfmem.core.measure import PeakTracker
    from pytest_tfmem.core.record import TestRecord
    from pytest_tfmem.core.rerun import Rerun
    from pytest_tfmem.core.verdict import Verdict


@pytest.hookspec
def pytest_tfmem_marker_keywords() -> dict[str, Callable[[object, str], Any]] | None:
    """The keyword arguments your feature adds to ``@pytest.mark.tfmem``: name -> parser.

    A parser takes the value and a description of it (``"tfmem marker argument NAME"``) and
    returns the parsed value or raises ``ValueError`` naming the value and the accepted forms.
    Called once, when pytest is configured: implement it as a module-level function.
    """


@pytest.hookspec
def pytest_tfmem_measuring_markers() -> Iterable[str] | None:
    """Markers besides ``tfmem`` that make a test measured (``tfmem_leak``...).

    Called once, when pytest is configured: implement it as a module-level function.
    """


@pytest.hookspec
def pytest_tfmem_measure_all(config: pytest.Config) -> bool | None:
    """Return ``True`` when your feature's settings need every test measured (a baseline to
    compare with, a GPU budget, isolation...). Asked once, when the first test is looked at.
    """


@pytest.hookspec(firstresult=True)
def pytest_tfmem_known_peak(item: pytest.Item) -> int | None:
    """The peak this test is known to reach (bytes; its baseline entry's), or ``None``.

    Asked before any test runs, to size pytest-xdist workers (``--tfmem-workers=fit``).
    """


@pytest.hookspec
def pytest_tfmem_trackers() -> list[PeakTracker] | None:
    """More peak trackers for every measurement window of a test (NVML's per-GPU views...).

    Return the same trackers at every call, so that nested windows fold their peaks into
    each other. Their views are reported beside the others; a test's headline ``peak`` reads
    only the host and TensorFlow CPU views.
    """


@pytest.hookspec
def pytest_tfmem_profiles(item: pytest.Item, rerun: Rerun | None) -> bool | None:
    """Return ``True`` if your feature runs TensorFlow's profiler over this run of the test:
    its own run (``rerun`` is ``None``), or the one re-run after a memory failure.

    TensorFlow runs one profiler at a time: a feature that would profile the same run reads
    the other one's trace (in the test record) instead of starting its own.
    """


@pytest.hookspec
def pytest_tfmem_report_sections(item: pytest.Item, record: TestRecord) -> list[tuple[str, str]] | None:
    """Sections ``(title, text)`` your feature adds to a measured test's call report, below the
    core's ``tfmem`` section. Called just before the report is made, once every feature has
    finished with the test's own run (and its one re-run): a record published now reaches it.
    """


@pytest.hookspec
def pytest_tfmem_configure_tensorflow(config: pytest.Config, tf: ModuleType, runtime_started: bool) -> None:
    """TensorFlow was found loaded, before tfmem starts its runtime: before the first measured
    test, or inside a test's own first import of TensorFlow, right after it (the import's memory
    is not charged to the test).

    Device settings (memory growth, logical memory limits) can only be applied while
    ``runtime_started`` is false.
    """


@pytest.hookspec
def pytest_tfmem_check(item: pytest.Item, record: TestRecord, error: BaseException | None) -> Verdict | None:
    """Return a verdict on a measured test (budget, baseline regression, ...), or ``None``.

    ``error`` is what the test body raised (also for ``unittest.TestCase`` methods, whose
    errors unittest catches), or ``None``.
    """


@pytest.hookspec
def pytest_tfmem_check_retained(item: pytest.Item, record: TestRecord) -> Verdict | None:
    """Return a verdict on what a measured test left behind (``record.retained``), or ``None``.

    Asked after the test's teardown (a limit on what stays, a baseline's retained figure); a
    failed verdict fails the test as an error at its teardown.
    """


@pytest.hookspec
def pytest_tfmem_rerun_wanted(item: pytest.Item, record: TestRecord) -> str | None:
    """The test failed a tfmem check: return what a re-run of its body would give (e.g. ``"the
    TensorBoard trace"``) to ask for one, or ``None``.

    The body runs again at most once, however many features ask; see ``pytest_tfmem_rerun``.
    """


@pytest.hookspec
def pytest_tfmem_rerun(item: pytest.Item, rerun: Rerun) -> None:
    """The one re-run of a test that failed a tfmem check, after its own run and before teardown.

    Implement it as a wrapper (``@pytest.hookimpl(wrapper=True)``): set up around the ``yield``
    (a profiler, a line tracer) and read ``rerun.result`` after it. The core's own
    implementation, innermost, runs the body. Features whose name is not in
    ``rerun.wanted_by`` should only ``yield``.
    """
