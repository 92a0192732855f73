"""pytest-tfmem: exact, order-independent memory budgets for TensorFlow/Keras tests.

The public names are imported on first use (PEP 562 ``__getattr__``): ``from pytest_tfmem
import Monitor`` works as ever, while ``tfmem run`` and ``tfmem compare``, which import
``pytest_tfmem.cli.main``, do not pay for pytest and the measuring code (a quarter of a
second of CPU) before running anything.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_tfmem.batchsize import BatchSizeReport, BatchTrial, find_max_batch_size
    from pytest_tfmem.core.measure import Measurement, Monitor, ViewReading
    from pytest_tfmem.errors import (
        BudgetExceeded,
        DeviceOutOfMemory,
        GpuBudgetExceeded,
        LeakDetected,
        MemoryRegression,
        TfmemFailure,
    )
    from pytest_tfmem.leaks.check import LeakReport, assert_no_leak, leak_check
    from pytest_tfmem.units import format_size, parse_size

__version__ = "0.1.0"

# public name -> the module that defines it
_PUBLIC = {
    "BatchSizeReport": "pytest_tfmem.batchsize",
    "BatchTrial": "pytest_tfmem.batchsize",
    "find_max_batch_size": "pytest_tfmem.batchsize",
    "Measurement": "pytest_tfmem.core.measure",
    "Monitor": "pytest_tfmem.core.measure",
    "ViewReading": "pytest_tfmem.core.measure",
    "BudgetExceeded": "pytest_tfmem.errors",
    "DeviceOutOfMemory": "pytest_tfmem.errors",
    "GpuBudgetExceeded": "pytest_tfmem.errors",
    "LeakDetected": "pytest_tfmem.errors",
    "MemoryRegression": "pytest_tfmem.errors",
    "TfmemFailure": "pytest_tfmem.errors",
    "LeakReport": "pytest_tfmem.leaks.check",
    "assert_no_leak": "pytest_tfmem.leaks.check",
    "leak_check": "pytest_tfmem.leaks.check",
    "format_size": "pytest_tfmem.units",
    "parse_size": "pytest_tfmem.units",
}

__all__ = [
    "BatchSizeReport",
    "BatchTrial",
    "BudgetExceeded",
    "DeviceOutOfMemory",
    "GpuBudgetExceeded",
    "LeakDetected",
    "LeakReport",
    "Measurement",
    "MemoryRegression",
    "Monitor",
    "TfmemFailure",
    "ViewReading",
    "__version__",
    "assert_no_leak",
    "find_max_batch_size",
    "format_size",
    "leak_check",
    "parse_size",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext pytest_tfmem``: the ``%%tfmem`` and ``%tfmem`` magics (``pytest_tfmem.notebook``)."""
    from pytest_tfmem.notebook import load_ipython_extension as load

    load(ipython)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
