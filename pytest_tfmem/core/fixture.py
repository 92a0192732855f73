"""The ``tfmem`` fixture: measure a block, read the test's memory so far, clean up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from pytest_tfmem import frameworks, platforms
from pytest_tfmem.core.measure import Measurement, Monitor, PeakTracker
from pytest_tfmem.probes import host
from pytest_tfmem.units import format_size


class MeasureResult:
    """What ``tfmem.measure()`` yields; filled in when the block ends.

    Reads like a ``Measurement`` (``peak``, ``host``, ``tf_host``, ``views``...) once the
    ``with`` block has finished.
    """

    def __init__(self) -> None:
        self.measurement: Measurement | None = None

    def __getattr__(self, name: str) -> object:
        measurement = self.__dict__.get("measurement")
        if measurement is None:
            raise RuntimeError(f"tfmem.measure(): .{name} is available once the with-block has ended")
        return getattr(measurement, name)

    def __repr__(self) -> str:
        return f"MeasureResult({self.measurement!r})"


@dataclass(frozen=True)
class CleanReport:
    """What ``tfmem.clean()`` did and how much RSS it gave back."""

    freed: int
    actions: tuple[str, ...]

    def __str__(self) -> str:
        return f"freed {format_size(self.freed)} of RSS ({'; '.join(self.actions)})"


class TfmemFixture:
    """Finer control inside a test; the test's own window keeps measuring around it."""

    def __init__(
        self, test_monitor: Callable[[], Monitor | None], trackers: Callable[[], list[PeakTracker]] = list
    ) -> None:
        self._test_monitor = test_monitor  # the per-test window opens after fixtures are set up
        self._trackers = trackers  # the features' own trackers (NVML...), read in every window

    @contextmanager
    def measure(self) -> Iterator[MeasureResult]:
        """Measure the block: ``with tfmem.measure() as m: ...`` then ``m.peak`` (bytes)."""
        result = MeasureResult()
        monitor = Monitor(trackers=self._trackers()).start()
        try:
            yield result
        finally:
            result.measurement = monitor.stop()

    def _so_far(self) -> Measurement:
        monitor = self._test_monitor()
        if monitor is None:
            raise RuntimeError("tfmem: peak()/current() are only available inside the test body")
        return monitor.snapshot()

    def peak(self) -> int:
        """Peak memory need of the test so far, in bytes (same definition as the verdict)."""
        return self._so_far().peak

    def current(self) -> int:
        """Host RSS now, above the level at the start of the test, in bytes."""
        reading = self._so_far().view("host")
        return reading.end - reading.start if reading else 0

    def clean(self) -> CleanReport:
        """Release what a test may hold: Keras sessions, each framework's caches (JAX's compiled
        functions, PyTorch's CUDA cache), garbage, freed heap."""
        before = host.current_rss()
        release = platforms.current().release_action()  # malloc_trim(0) on Linux
        actions = [*frameworks.clear(), "gc.collect()", *([release] if release else [])]
        host.release_freed_memory()
        return CleanReport(max(0, before - host.current_rss()), tuple(actions))


# What the ``tfmem`` fixture is: ``TfmemFixture``, or the subclass a feature that adds methods
# to it puts here when it configures (the leaks feature: ``leak_check``, ``assert_no_leak``).
FIXTURE_TYPE = pytest.StashKey[type[TfmemFixture]]()
