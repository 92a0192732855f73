"""pytest-tfmem: exact, order-independent memory budgets for TensorFlow/Keras tests."""

from .errors import BudgetExceeded, TfmemFailure
from .measure import Measurement, Monitor, ViewReading
from .units import format_size, parse_size

__version__ = "0.1.0"

__all__ = [
    "BudgetExceeded",
    "Measurement",
    "Monitor",
    "TfmemFailure",
    "ViewReading",
    "__version__",
    "format_size",
    "parse_size",
]
