"""Exceptions raised by tfmem checks, and the warning of a memory limit that acts first.

They derive from pytest's own ``Failed`` outcome (``pytest.fail.Exception``) with
``pytrace=False``, so a check failure is reported as the test's failure with a plain
message instead of a traceback into the plugin, and can be named by
``pytest.raises(...)`` or ``pytest.mark.xfail(raises=...)``.

``Failed`` is a ``BaseException``: ``except Exception`` does not catch it, which keeps a test's
own ``try: ... except Exception`` from swallowing its failure. Outside a pytest test (a script,
a notebook) the library API (``assert_no_leak``) raises the same class made an ``Exception`` as
well (``failure``): ``except LeakDetected`` and ``except Exception`` both catch it, and IPython
shows one error rather than a crash report.
"""

from __future__ import annotations

import os
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


# Each failure class made an ``Exception`` too, for the library API outside pytest: made once.
_CATCHABLE: dict[type[TfmemFailure], type[TfmemFailure]] = {}
# pytest sessions configured in this process with tfmem's plugin (``core.manager``): a script a
# test starts inherits the test's environment, not its session.
_sessions = [0]


def session_configured(started: bool) -> None:
    """tfmem's plugin was configured (``True``) or unconfigured in a pytest session of this process."""
    _sessions[0] += 1 if started else -1


def in_a_pytest_test() -> bool:
    """A pytest test of this process is running: a session with tfmem's plugin is configured here,
    and pytest set ``PYTEST_CURRENT_TEST`` around the test's setup, call and teardown."""
    return _sessions[0] > 0 and "PYTEST_CURRENT_TEST" in os.environ


def catchable(failure_type: type[TfmemFailure]) -> type[TfmemFailure]:
    """``failure_type`` (``LeakDetected``) as a subclass that is an ``Exception`` too, of the same name."""
    if failure_type not in _CATCHABLE:
        _CATCHABLE[failure_type] = type(failure_type.__name__, (failure_type, Exception),
                                        {"__module__": failure_type.__module__, "__doc__": failure_type.__doc__})
    return _CATCHABLE[failure_type]


def failure(failure_type: type[TfmemFailure], message: str) -> TfmemFailure:
    """The exception the library API raises: ``failure_type`` itself inside a pytest test (it fails
    the test as a tfmem check does), ``catchable(failure_type)`` anywhere else."""
    return (failure_type if in_a_pytest_test() else catchable(failure_type))(message)


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
