"""pytest-tfmem: exact, order-independent memory budgets for TensorFlow/Keras tests."""

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
