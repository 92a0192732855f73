"""Peak windows: nesting, the sampled fallback, serialisation."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from measure_helpers import ScriptedSource

from pytest_tfmem.core.measure import MIXED_MARGIN, Measurement, PeakTracker, ViewReading
from pytest_tfmem.platforms.linux import Linux
from pytest_tfmem.platforms.portable import Portable
from pytest_tfmem.probes import host
from pytest_tfmem.probes.mixed import MixedSampler

MIB = 2**20


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


def test_a_span_left_out_counts_neither_its_peak_nor_what_it_kept():
    source = ScriptedSource()
    tracker = PeakTracker(source)
    source.set(100)
    window = tracker.open()
    source.set(900)  # the window's own peak: 800 above its start
    source.set(150)
    tracker.leave_out_begin()
    source.set(2000)  # the import's peak
    source.set(650)  # it kept 500
    tracker.leave_out_end()
    source.set(1250)  # 600 above the level the import left: 100 more than at 150, plus 500 new
    assert tracker.close(window) == ViewReading("scripted", start=600, peak=1400, end=1250)
    # A tracker with no window open has nothing to leave out.
    idle = PeakTracker(source)
    idle.leave_out_begin()
    idle.leave_out_end()


def test_sampled_where_the_platform_keeps_no_mark():
    source = host.HostRSS(Portable())
    assert source.method == "sampled" and not source.exact
    tracker = PeakTracker(source)
    window = tracker.open()
    block = np.ones(100 * 10**6, dtype=np.uint8)
    time.sleep(0.05)  # long enough for a 1 ms sampler
    del block
    reading = tracker.close(window)
    source._sampler.stop()
    assert reading.increase >= 95 * 10**6
    assert tracker.method(window) == "sampled"


class ReadingAcrossAReset(Portable):
    """A portable platform whose sampler reads a size, then is held until the window was reset:
    what a loaded machine does when the sampling thread loses the CPU between read and store."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.hold_next_sample = False
        self.sample_read = threading.Event()
        self.reset_done = threading.Event()

    def current_size(self) -> int:
        size = self.size
        if self.hold_next_sample and threading.current_thread().name == "tfmem-rss-sampler":
            self.hold_next_sample = False
            self.sample_read.set()
            self.reset_done.wait(5)
        return size


def test_a_sample_read_before_a_reset_does_not_count_in_the_next_window():
    platform = ReadingAcrossAReset(size=300 * MIB)  # the previous test's level
    source = host.HostRSS(platform)
    platform.hold_next_sample = True
    assert platform.sample_read.wait(5)
    platform.size = 50 * MIB  # the previous test freed its data; the next window opens
    source.reset_peak()
    platform.reset_done.set()
    time.sleep(0.02)  # the held sample lands, then a few more at the new level
    assert source.peak() == 50 * MIB
    source._sampler.stop()


def test_a_lifetime_mark_is_exact_for_the_window_that_raised_it():
    """Linux's own VmHWM with clear_refs unwritable: the process's lifetime mark (what Windows and
    macOS < 10.14 keep). A window that raises it reads it exactly; one below it is sampled."""
    platform = Linux(clear_refs="/nonexistent/clear_refs")
    source = host.HostRSS(platform)
    assert source.method == "exact-if-raised"
    tracker = PeakTracker(source)
    above = (platform.peak_mark() or 0) - platform.current_size() + 60 * MIB  # 60 MiB past the lifetime mark
    raising = tracker.open()
    block = np.ones(above, dtype=np.uint8)
    mark = platform.peak_mark()
    del block
    raised = tracker.close(raising)
    assert tracker.method(raising) == "exact-if-raised"
    # the kernel's mark itself (its RSS counters are batched per thread: a few pages apart)
    assert mark is not None and abs(raised.peak - mark) < MIB and raised.increase > above - MIB
    below = tracker.open()
    block = np.ones(30 * MIB, dtype=np.uint8)  # far under the mark just set
    time.sleep(0.05)
    del block
    sampled = tracker.close(below)
    source._sampler.stop()
    assert tracker.method(below) == "sampled"
    assert 29 * MIB <= sampled.increase < 60 * MIB


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


def test_the_sampled_mixed_figure_is_the_headline_only_when_clearly_above_the_exact_views():
    views = (ViewReading("host", 0, 300 * MIB, 300 * MIB), ViewReading("tf:CPU:0", 0, 300 * MIB, 0))
    mixed = Measurement(views, 1.0, mixed=600 * MIB, mixed_interval_s=0.001)
    assert (mixed.peak, mixed.sampled, mixed.basis) == (600 * MIB, True, "sampled mixed")
    noise = Measurement(views, 1.0, mixed=300 * MIB + 4096, mixed_interval_s=0.001)  # a page of RSS noise
    assert (noise.peak, noise.sampled, noise.basis) == (300 * MIB, False, "exact")
    assert Measurement.from_dict(mixed.to_dict()) == mixed and mixed.to_dict()["basis"] == "sampled mixed"


class ScriptedAllocator:
    """The interface of ``probes.tf.TFAllocator``: levels set by the test, as TF would report them."""

    def __init__(self, in_use: int, pool: int) -> None:
        self.in_use, self.pool_estimate = in_use, pool

    def current(self) -> int:
        self.pool_estimate = max(self.pool_estimate, self.in_use)
        return self.in_use

    def peak(self) -> int:
        return self.current()


def test_the_sampled_figure_leaves_the_span_out_too():
    # Free heap that earlier tests left would serve the allocations below without RSS growing:
    # hand it back first, as a measurement window does.
    host.return_freed_heap()
    allocator = ScriptedAllocator(in_use=0, pool=200 * MIB)
    sampler = MixedSampler(allocator, interval_s=3600)  # type: ignore[arg-type]  # read by hand
    assert sampler.arm()
    sampler.leave_out_begin()
    kept = b"i" * (50 * MIB)  # host memory the import keeps
    allocator.in_use = 30 * MIB  # and tensors
    sampler.leave_out_end()
    assert sampler.reading().peak < 4 * MIB
    more = b"t" * (20 * MIB)  # the test's own
    reading = sampler.disarm()
    assert 19 * MIB <= reading.peak < 24 * MIB, reading
    del kept, more


def test_the_mixed_sampler_adds_host_memory_outside_the_pool_to_the_tensors_in_use():
    """A pool of 500 MiB from an earlier test serves 300 MiB of tensors (RSS does not grow for
    them) while the test holds 100 MiB of real host memory: it needs about 400 MiB."""
    allocator = ScriptedAllocator(in_use=0, pool=500 * MIB)
    sampler = MixedSampler(allocator, interval_s=0.001)  # type: ignore[arg-type]
    sampler.arm()
    allocator.in_use = 300 * MIB
    block = np.ones(100 * MIB, dtype=np.uint8)
    reading = sampler.disarm()
    assert 395 * MIB <= reading.peak <= 410 * MIB, reading
    assert reading.pool_growth == 0 and reading.samples >= 1
    del block


def test_the_mixed_sampler_starts_only_where_the_pool_has_more_than_the_margin_free():
    """With 4 MiB free in the pool the sampled figure exceeds the RSS increase by at most 4 MiB,
    never enough to be the headline: no thread is started. With more free, it samples."""
    allocator = ScriptedAllocator(in_use=100 * MIB, pool=104 * MIB)
    sampler = MixedSampler(allocator, interval_s=0.001)  # type: ignore[arg-type]
    assert not sampler.arm(min_room=MIXED_MARGIN)
    assert "tfmem-mixed-sampler" not in {thread.name for thread in threading.enumerate()}
    allocator.pool_estimate = 105 * MIB
    assert sampler.arm(min_room=MIXED_MARGIN)
    assert "tfmem-mixed-sampler" in {thread.name for thread in threading.enumerate()}
    assert sampler.disarm().samples >= 1


def test_swapped_memory_is_read_from_vmswap(tmp_path):
    real = Path("/proc/self/status").read_text()
    swapped, unswapped = tmp_path / "swapped", tmp_path / "no-swap-line"
    swapped.write_text("".join(line if not line.startswith("VmSwap:") else "" for line in real.splitlines(True)) + "VmSwap:\t    2048 kB\n")
    unswapped.write_text("".join(line for line in real.splitlines(True) if not line.startswith("VmSwap:")))
    assert Linux(status=str(swapped)).swapped_bytes() == 2 * 2**20
    assert Linux(status=str(unswapped)).swapped_bytes() == 0  # kernels without swap accounting: nothing to say
    assert Linux(status=str(tmp_path / "missing")).swapped_bytes() == 0


SWAPPED_CONFTEST = """
import pathlib

from pytest_tfmem import platforms
from pytest_tfmem.platforms.linux import Linux

# This machine has no swap: the status file the swap reading sees says 300 MiB were swapped out.
status = pathlib.Path(__file__).with_name("status")
lines = pathlib.Path("/proc/self/status").read_text().splitlines(True)
status.write_text("".join(l for l in lines if not l.startswith("VmSwap:")) + "VmSwap:\\t  307200 kB\\n")


class SwappedLinux(Linux):
    def swapped_bytes(self):
        return Linux(status=str(status)).swapped_bytes()


platforms.use(SwappedLinux())
"""

SWAPPED_TESTS = """
import unittest

def test_function():
    pass

class Case(unittest.TestCase):
    def test_method(self):
        pass
"""


def test_a_test_ending_with_memory_in_swap_carries_a_note(pytester: pytest.Pytester):
    from conftest import dump_records, dumped_records

    pytester.makeconftest(SWAPPED_CONFTEST)
    pytester.makepyfile(test_swapped=SWAPPED_TESTS)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB", f"--junitxml={junit}", "-rA",
                                           *dump_records(pytester.path))
    result.assert_outcomes(passed=2)
    note = "300.0 MiB of this process was in swap at the end: the host view counts resident memory only, so it may read low by up to that much"
    assert result.stdout.str().count(note) == 2  # in each test's tfmem section
    records = dumped_records(pytester.path)
    assert [records[name].measurement.notes for name in ("test_function", "test_method")] == [(note,), (note,)]
