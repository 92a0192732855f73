"""Peak windows: nesting, the sampled fallback, serialisation."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pytest_tfmem.measure import Measurement, PeakTracker, ViewReading
from pytest_tfmem.probes import host


class ScriptedSource:
    """A peak source whose level the test sets by hand."""

    name = "scripted"

    def __init__(self) -> None:
        self.level = 0
        self.high = 0

    def set(self, level: int) -> None:
        self.level = level
        self.high = max(self.high, level)

    def current(self) -> int:
        return self.level

    def peak(self) -> int:
        return self.high

    def reset_peak(self) -> None:
        self.high = self.level


def test_an_inner_window_reset_does_not_hide_the_outer_peak():
    source = ScriptedSource()
    tracker = PeakTracker(source)
    source.set(100)
    outer = tracker.open()
    source.set(900)  # outer peak
    source.set(150)
    inner = tracker.open()  # resets the source's peak to 150
    source.set(300)
    source.set(200)
    inner_reading = tracker.close(inner)
    outer_reading = tracker.close(outer)
    assert inner_reading == ViewReading("scripted", start=150, peak=300, end=200)
    assert outer_reading == ViewReading("scripted", start=100, peak=900, end=200)
    assert outer_reading.increase == 800 and outer_reading.net == 100


def test_sampled_fallback_when_the_kernel_mark_cannot_be_reset(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(host, "_CLEAR_REFS", "/nonexistent/clear_refs")
    source = host.HostRSS()
    assert not source.exact
    tracker = PeakTracker(source)
    window = tracker.open()
    block = np.ones(100 * 10**6, dtype=np.uint8)
    time.sleep(0.05)  # long enough for a 1 ms sampler
    del block
    reading = tracker.close(window)
    source._sampler.stop()
    assert reading.increase >= 95 * 10**6


def test_measurement_round_trips_through_a_dict():
    measurement = Measurement(
        views=(ViewReading("host", 10, 500, 20), ViewReading("tf:CPU:0", 0, 800, 0), ViewReading("tf:GPU:0", 5, 7, 5)),
        duration_s=0.25,
        notes=("a note",),
    )
    data = measurement.to_dict()
    assert data["peak"] == 800
    assert Measurement.from_dict(data) == measurement
    assert measurement.gpu == 2
    assert measurement.tf_host == 800 and measurement.host == 490
