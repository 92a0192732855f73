"""Memory held outside a framework's host pool and inside it at the same moment, sampled.

A test that holds NumPy data while it makes tensors needs both at once. The exact views see
one part each when TensorFlow serves the tensors from memory it pooled earlier: host RSS sees
the NumPy data but not the tensors, TensorFlow's allocator sees the tensors only. Their sum
is wrong too, for a test that frees its data before making tensors. What the test needs is
the largest, over time, of

    (RSS - pool) - (RSS - pool at the start)  +  (allocator in use - in use at the start)

where the pool is TensorFlow's, which RSS includes. TensorFlow says how much of its allocator
is in use, not how large the pool is; a pooling allocator keeps what it once held, so the pool
is estimated as the highest level ever in use (``PooledHostView.pool_estimate``). TensorFlow's
CPU allocator is the one such pool (``Framework.pooled_host_view``). The two levels
must be read together, so a background thread reads them every ``interval_s``: a coexistence
shorter than that can be missed, and the figure is an estimate. It never lowers the exact
views' figure (``Measurement.peak`` takes the larger).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pytest_tfmem.frameworks.base import PooledHostView
from pytest_tfmem.probes import host
from pytest_tfmem.probes.sampler import Sampler

DEFAULT_INTERVAL_S = 0.01


@dataclass(frozen=True)
class MixedReading:
    """The sampled figure of one window, in bytes, and how it was read."""

    peak: int
    pool_growth: int  # how much the pool estimate grew in the window
    interval_s: float
    samples: int


class MixedSampler:
    """Samples the process's host and TF memory while a window is armed (one at a time)."""

    def __init__(self, allocator: PooledHostView, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.allocator = allocator
        self.interval_s = interval_s
        self._armed = threading.Event()
        self._lock = threading.Lock()
        self._sampler: Sampler | None = None
        self._start_host = self._start_in_use = self._start_pool = 0
        self._peak = 0
        self._samples = 0
        self._left_out_from: tuple[int, int, int] | None = None  # (host, in use, pool) where a span began

    def _levels(self) -> tuple[int, int, int]:
        in_use = self.allocator.current()  # also raises the allocator's pool estimate
        return host.current_rss(), in_use, self.allocator.pool_estimate

    def _sample(self) -> None:
        with self._lock:
            if not self._armed.is_set() or self._left_out_from is not None:
                return
            rss, in_use, pool = self._levels()
            need = (rss - pool) - (self._start_host - self._start_pool) + (in_use - self._start_in_use)
            self._peak = max(self._peak, need)
            self._samples += 1

    def _sample_in_background(self) -> bool:
        try:
            self._sample()
        except Exception:  # TensorFlow shutting down, /proc gone: stop sampling this window
            self._armed.clear()
            return False
        return True

    def arm(self, min_room: int = 0) -> bool:
        """Start a window from the levels now (after the exact views were reset), if TensorFlow's
        pool has more than ``min_room`` bytes free; return whether it started.

        The window's figure exceeds the RSS increase by at most the pool's free memory at the
        start: tensors beyond it grow the pool, and RSS with it. A caller that needs the figure
        only where it exceeds the exact views by a margin passes the margin, and a window that
        could not exceed it costs no thread and no readings.
        """
        with self._lock:
            start_in_use = self.allocator.current()
            if self.allocator.pool_estimate - start_in_use <= min_room:
                return False
            self._start_in_use = start_in_use
            self._start_pool = self.allocator.pool_estimate
            self._start_host = host.current_rss()
            self._peak = 0
            self._samples = 0
            self._left_out_from = None
            self._armed.set()
        self._sampler = Sampler(self._sample_in_background, self.interval_s, "tfmem-mixed-sampler").start()
        return True

    def leave_out_begin(self) -> None:
        """A span that is not the window's begins (a first import): one last sample, then none
        until ``leave_out_end``, which takes what the span kept out of the starting levels."""
        if not self._armed.is_set():
            return
        self._sample()
        with self._lock:
            self._left_out_from = self._levels()

    def leave_out_end(self) -> None:
        with self._lock:
            began, self._left_out_from = self._left_out_from, None
            if began is None or not self._armed.is_set():
                return
            rss, in_use, pool = self._levels()
            self._start_host += rss - began[0]
            self._start_in_use += in_use - began[1]
            self._start_pool += pool - began[2]

    def reading(self) -> MixedReading:
        """The window so far (with one last sample)."""
        self._sample()
        self.allocator.peak()  # the window's highest level in use counts towards the pool
        with self._lock:
            growth = self.allocator.pool_estimate - self._start_pool
            return MixedReading(max(0, self._peak), growth, self.interval_s, self._samples)

    def disarm(self) -> MixedReading:
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None
        reading = self.reading()
        self._armed.clear()
        return reading
