"""Hooks that pytest-tfmem calls, for its own feature modules and for users' conftest files."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_tfmem.core.record import TestRecord
    from pytest_tfmem.core.rerun import Rerun
    from pytest_tfmem.core.verdict import Verdict


@pytest.hookspec
def pytest_tfmem_configure_tensorflow(config: pytest.Config, tf: ModuleType, runtime_started: bool) -> None:
    """TensorFlow was found loaded, before tfmem starts its runtime.

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
