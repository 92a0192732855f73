"""Exceptions raised by tfmem checks, and the warning of a memory limit that acts first.

They derive from pytest's own ``Failed`` outcome (``pytest.fail.Exception``) with
``pytrace=False``, so a check failure is reported as the test's failure with a plain
message instead of a traceback into the plugin, and can be named by
``pytest.raises(...)`` or ``pytest.mark.xfail(raises=...)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import pytest

# The last line of every tfmem failure in a report: where each figure's meaning is said.
FIGURES_HELP = "what each figure counts: pytest-tfmem's README.md, \"What each figure counts\""


class TfmemFailure(pytest.fail.Exception):  # type: ignore[name-defined]  # an attribute of a function, not a name
    """Base class of every memory verdict that fails a test."""

    def __init__(self, message: str) -> None:
        super().__init__(message, pytrace=False)


class BudgetExceeded(TfmemFailure):
    """A test's peak memory need went over its budget."""


class MemoryRegression(TfmemFailure):
    """A test's peak memory grew beyond tolerance over its baseline."""


class GpuBudgetExceeded(TfmemFailure):
    """A test's peak GPU memory need went over its GPU budget."""


class DeviceOutOfMemory(TfmemFailure):
    """TensorFlow ran out of memory (``ResourceExhaustedError``) in a measured test.

    ``tf_error`` is TensorFlow's error.
    """

    tf_error: BaseException | None = None


class IsolatedTestDied(TfmemFailure):
    """The isolated test's process ended before it could report the test."""


class KilledAtLimit(IsolatedTestDied):
    """tfmem's watchdog killed the isolated test at its ``kill_at`` limit."""


class KilledBySignal(IsolatedTestDied):
    """The isolated test's process died of a signal tfmem did not send (OOM killer, crash)."""


class RetainedExceeded(TfmemFailure):
    """A test left more memory behind after its teardown than ``max_retained`` allows."""


class RetainedRegression(TfmemFailure):
    """A test left more memory behind than its baseline entry, beyond tolerance."""


class LeakDetected(TfmemFailure):
    """Memory grew per iteration by more than ``max_growth`` in a leak check."""


class MemoryLimitWarning(pytest.PytestWarning):
    """A budget, ``kill_at`` or pytest-xdist worker count above the memory limit that applies:
    the OOM killer comes first."""


# The exception a failed verdict raises, by its check (``Verdict.check``).
FAILURE_BY_CHECK: Mapping[str, type[TfmemFailure]] = MappingProxyType(
    {
        "budget": BudgetExceeded,
        "baseline": MemoryRegression,
        "gpu_budget": GpuBudgetExceeded,
        "oom": DeviceOutOfMemory,
        "leak": LeakDetected,
        "max_retained": RetainedExceeded,
        "retained_baseline": RetainedRegression,
        "kill_at": KilledAtLimit,
        "signal": KilledBySignal,
        "died": IsolatedTestDied,
    }
)


def failure_for(check: str, message: str) -> TfmemFailure:
    return FAILURE_BY_CHECK.get(check, TfmemFailure)(message)


# A tfmem failure's class name -> its check: a record names the exception that ended its call phase.
CHECK_BY_FAILURE: Mapping[str, str] = MappingProxyType(
    {failure.__name__: check for check, failure in FAILURE_BY_CHECK.items()} | {TfmemFailure.__name__: "tfmem"}
)
