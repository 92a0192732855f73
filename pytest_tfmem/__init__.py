"""pytest-tfmem: exact, order-independent memory budgets for TensorFlow/Keras tests."""

from .batchsize import BatchSizeReport, BatchTrial, find_max_batch_size
from .errors import BudgetExceeded, DeviceOutOfMemory, GpuBudgetExceeded, MemoryRegression, TfmemFailure
from .leaks import LeakDetected, LeakReport, assert_no_leak, leak_check
from .measure import Measurement, Monitor, ViewReading
from .units import format_size, parse_size

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
