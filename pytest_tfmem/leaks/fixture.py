"""The ``tfmem`` fixture's leak checks: ``tfmem.leak_check(fn)`` and ``tfmem.assert_no_leak(fn)``."""

from __future__ import annotations

from collections.abc import Callable

from pytest_tfmem.core.fixture import TfmemFixture
from pytest_tfmem.core.measure import Monitor, PeakTracker
from pytest_tfmem.leaks import check as leaks


class LeakCheckingFixture(TfmemFixture):
    """The ``tfmem`` fixture with leak checks over the same views as the test's own window."""

    def __init__(
        self, test_monitor: Callable[[], Monitor | None], trackers: Callable[[], list[PeakTracker]] = list
    ) -> None:
        super().__init__(test_monitor, trackers)
        self.leak_reports: list[leaks.LeakReport] = []  # this test's leak checks, for its record

    def leak_check(
        self,
        fn: Callable[[], object],
        iterations: int = leaks.DEFAULT_ITERATIONS,
        warmup: int = leaks.DEFAULT_WARMUP,
        max_growth: int | str = leaks.DEFAULT_MAX_GROWTH,
    ) -> leaks.LeakReport:
        """Call ``fn`` ``warmup`` times, then ``iterations`` measured times; report the growth."""
        report = leaks.leak_check(fn, iterations, warmup, max_growth, trackers=self._trackers())
        self.leak_reports.append(report)
        return report

    assert_no_leak = leaks.failing_on_leak(
        leak_check, "``leak_check``, then fail the test with ``LeakDetected`` if it grew over ``max_growth``."
    )
