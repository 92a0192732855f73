"""Hooks that pytest-tfmem calls, for its own feature modules and for users' conftest files."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .checks import Verdict
    from .records import TestRecord


@pytest.hookspec
def pytest_tfmem_configure_tensorflow(config: pytest.Config, tf: ModuleType, runtime_started: bool) -> None:
    """TensorFlow was found loaded, before tfmem starts its runtime.

    Device settings (memory growth, logical memory limits) can only be applied while
    ``runtime_started`` is false.
    """


@pytest.hookspec
def pytest_tfmem_check(item: pytest.Item, record: TestRecord) -> Verdict | None:
    """Return a verdict on a measured test (budget, baseline regression, ...), or ``None``."""
