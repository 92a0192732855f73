"""Measurement windows over every peak source: ``Monitor`` and the ``Measurement`` it returns.

A window opens by returning freed memory to the OS and resetting each source's peak; it
closes by reading each source's peak. Windows nest (the per-test window, the ``tfmem``
fixture's ``measure()``, leak-check iterations): before any reset, the peak seen so far is
folded into every open window, so an inner reset never hides an outer window's peak.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_tfmem import frameworks, platforms
from pytest_tfmem.frameworks.base import PooledHostView
from pytest_tfmem.platforms import EXACT, EXACT_IF_RAISED, SAMPLED
from pytest_tfmem.probes import children as children_probe, host
from pytest_tfmem.probes.children import ChildrenReading
from pytest_tfmem.probes.imports import FirstImport
from pytest_tfmem.probes.mixed import MixedReading, MixedSampler
from pytest_tfmem.units import format_size


class PeakSource(Protocol):
    name: str

    def current(self) -> int: ...

    def peak(self) -> int: ...

    def reset_peak(self) -> None: ...


@dataclass(eq=False)  # windows are compared by identity
class _Window:
    start: int
    peak: int
    mark: int = 0  # the source's lifetime mark as the window opened (an ``exact-if-raised`` source)


class PeakTracker:
    """Open and close nested peak windows on one source."""

    def __init__(self, source: PeakSource) -> None:
        self.source = source
        self._open: list[_Window] = []
        self._left_out_from: int | None = None  # the level where a span left out began

    @property
    def _sampled_every_s(self) -> float | None:
        return getattr(self.source, "sampled_every_s", None)

    def _fold(self) -> None:
        if self._open:
            seen = self.source.peak()
            for window in self._open:
                window.peak = max(window.peak, seen)

    def open(self) -> _Window:
        self._fold()
        self.source.reset_peak()
        current = self.source.current()
        window = _Window(start=current, peak=current)
        if getattr(self.source, "method", None) == EXACT_IF_RAISED:
            window.mark = self.source.lifetime_mark()  # type: ignore[attr-defined]
        self._open.append(window)
        return window

    def method(self, window: _Window) -> str:
        """How the window's peak was obtained: ``exact``, ``sampled``, or ``exact-if-raised``
        where the source's lifetime mark rose while it was open (the host view; other sources
        keep a mark of their own, or say how often they were read)."""
        method = getattr(self.source, "method", EXACT)
        if method == EXACT_IF_RAISED and not self.source.raised_since(window.mark):  # type: ignore[attr-defined]
            return SAMPLED
        return str(method)

    def peek(self, window: _Window) -> ViewReading:
        """The window's reading so far, leaving it open."""
        self._fold()
        return ViewReading(self.source.name, window.start, window.peak, self.source.current(), self._sampled_every_s)

    def close(self, window: _Window) -> ViewReading:
        reading = self.peek(window)
        self._open.remove(window)
        return reading

    def leave_out_begin(self) -> None:
        """A span that is not the open windows' begins (a first import): fold the peak so far
        into them and note the level, so that ``leave_out_end`` can take the span out."""
        self._fold()
        self._left_out_from = self.source.current() if self._open else None

    def leave_out_end(self) -> None:
        """The span ends: what it kept moves the open windows' levels up (down, if it freed),
        and its own peak, which the source's peak holds now, is dropped."""
        began, self._left_out_from = self._left_out_from, None
        if began is None:
            return
        kept = self.source.current() - began
        for window in self._open:
            window.start += kept
            window.peak += kept
        self.source.reset_peak()

    def restart(self, window: _Window) -> ViewReading:
        """Fold and reset: the window's reading so far, then the window starts over from the
        current level. One fold and one reset, where ``close`` + ``open`` do two of each: the
        line tracer restarts a window at every line."""
        self._fold()
        self.source.reset_peak()
        current = self.source.current()
        reading = ViewReading(self.source.name, window.start, max(window.peak, current), current, self._sampled_every_s)
        window.start = window.peak = current
        return reading


@dataclass(frozen=True)
class ViewReading:
    """What one source saw in a window, in bytes: level at start, highest level, level at end."""

    view: str
    start: int
    peak: int
    end: int
    # Seconds between background readings of a source that keeps no peak of its own (NVML); 0
    # when read only at the window's edges; ``None`` for sources with an exact peak.
    sampled_every_s: float | None = None

    @property
    def increase(self) -> int:
        """Peak above the starting level: the memory this window needed from this source."""
        return max(0, self.peak - self.start)

    @property
    def net(self) -> int:
        """Level at the end minus level at the start (what the window kept)."""
        return self.end - self.start


# How much the sampled mixed figure must exceed the exact views to be the headline.
MIXED_MARGIN = 4 * 2**20
MIXED_MARGIN_SHARE = 0.02


@dataclass(frozen=True)
class Measurement:
    """Immutable record of one window: one ``ViewReading`` per source.

    ``peak`` is the window's peak memory need: the larger of the host RSS increase and the
    increase of TensorFlow's host (CPU) allocators. The two overlap (TF's CPU memory is
    part of RSS), so they are not added; the allocator view carries the figure when TF
    serves a test from memory it pooled earlier, which RSS cannot see.
    """

    views: tuple[ViewReading, ...]
    duration_s: float
    # How the host view's peak was obtained (``platforms``: exact, exact-if-raised, sampled) and
    # what it counts (RSS, phys_footprint, working set).
    method: str = EXACT
    counts: str = "RSS"
    notes: tuple[str, ...] = ()
    # Host memory outside TensorFlow's pool plus TF's CPU allocator, held at once: sampled
    # (``probes.mixed``), ``None`` where not sampled.
    mixed: int | None = None
    mixed_interval_s: float | None = None
    # Modules first imported in the window: left out of every view (``probes.imports``).
    first_imports: tuple[FirstImport, ...] = ()
    # The processes the window started (``probes.children``), ``None`` if it started none.
    children: ChildrenReading | None = None

    def view(self, name: str) -> ViewReading | None:
        return next((v for v in self.views if v.view == name), None)

    @property
    def host(self) -> int:
        reading = self.view("host")
        return reading.increase if reading else 0

    @property
    def tf_host(self) -> int:
        """Largest increase among the frameworks' views of host memory (TensorFlow's CPU
        allocators, the one framework that pools host memory; 0 where none is read)."""
        return max((v.increase for v in self.views if frameworks.is_host_view(v.view)), default=0)

    @property
    def gpu(self) -> int | None:
        """Largest increase among the frameworks' GPU views, ``None`` without one."""
        gpus = [v.increase for v in self.views if frameworks.is_gpu_view(v.view)]
        return max(gpus) if gpus else None

    def gpu_views(self) -> tuple[ViewReading, ...]:
        """The views a GPU budget reads: the frameworks' GPU views (TensorFlow's and PyTorch's
        allocators, JAX's devices), else NVML's per-GPU views."""
        own = tuple(v for v in self.views if frameworks.is_gpu_view(v.view))
        return own or tuple(v for v in self.views if v.view.startswith("nvml:"))

    @property
    def nvml_interval_s(self) -> float | None:
        """How often NVML was read in this window, the longest over its GPUs (0: at the start and
        end only); ``None`` without NVML views. NVML keeps no peak: a shorter one can be missed."""
        nvml = [v.sampled_every_s for v in self.views if v.view.startswith("nvml:")]
        intervals = [interval for interval in nvml if interval is not None]
        return max(intervals) if intervals else None

    @property
    def exact_peak(self) -> int:
        """The larger exact view: host RSS or TF's CPU allocators (see the class docstring)."""
        return max(self.host, self.tf_host)

    @property
    def own_peak(self) -> int:
        """This process's figure: the exact views', or the sampled mixed figure where that is
        clearly larger."""
        return self.mixed if self.sampled and self.mixed is not None else self.exact_peak

    @property
    def children_peak(self) -> int:
        """The combined figure of the processes the window started (0 if none)."""
        return self.children.combined if self.children is not None else 0

    @functools.cached_property  # read by every check, section, table and report of the test
    def peak(self) -> int:
        """The process tree's figure: this process's own, plus the processes it started."""
        return self.own_peak + self.children_peak

    @property
    def sampled(self) -> bool:
        """The headline rests on the sampled mixed figure: it exceeds the exact views by more
        than RSS's own noise (a page here and there), so the test held host and TF memory at once."""
        if self.mixed is None:
            return False
        return self.mixed > self.exact_peak + max(MIXED_MARGIN, int(MIXED_MARGIN_SHARE * self.exact_peak))

    @property
    def exact(self) -> bool:
        """The host view's peak is a mark the platform kept, not the highest of samples."""
        return self.method != SAMPLED

    @property
    def basis(self) -> str:
        """What the headline rests on: ``exact`` (a resettable mark and TF's own statistics),
        ``exact-if-raised`` (a lifetime mark the window raised), ``sampled mixed`` (host and TF
        memory held at once, ``probes.mixed``) or ``sampled host`` (no mark the window could use)."""
        if self.sampled:
            return "sampled mixed"
        return "sampled host" if self.method == SAMPLED else self.method

    def to_dict(self) -> dict[str, Any]:
        """Its fields as JSON values, with ``peak`` and ``basis``. Built field by field rather than
        with ``dataclasses.asdict``, whose deep copy took a third of the time every test's record
        costs to publish."""
        data = {name: value for name, value in vars(self).items() if name in _FIELDS}
        data.update(
            views=[dict(vars(view)) for view in self.views],
            notes=list(self.notes),
            first_imports=[booking.to_dict() for booking in self.first_imports],
            children=self.children.to_dict() if self.children is not None else None,
            peak=self.peak,
            basis=self.basis,
        )
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        return cls(
            views=tuple(ViewReading(**view) for view in data["views"]),
            duration_s=data["duration_s"],
            # written before platforms were labelled: Linux's RSS, exact unless said otherwise
            method=data.get("method") or (EXACT if data.get("exact", True) else SAMPLED),
            counts=data.get("counts", "RSS"),
            notes=tuple(data.get("notes", ())),
            mixed=data.get("mixed"),
            mixed_interval_s=data.get("mixed_interval_s"),
            first_imports=tuple(FirstImport.from_dict(booking) for booking in data.get("first_imports", ())),
            children=ChildrenReading.from_dict(data["children"]) if data.get("children") else None,
        )


_FIELDS = frozenset(field.name for field in dataclasses.fields(Measurement))  # not what is cached beside them


@dataclass
class Probes:
    """The process-wide trackers: host RSS always, each framework's device views once its
    runtime started (``frameworks``); and the monitors whose windows are open, which a span left
    out (a first import) reaches."""

    host: PeakTracker = field(default_factory=lambda: PeakTracker(host.HostRSS()))
    platform: platforms.Platform = field(default_factory=platforms.current)
    devices: dict[str, list[PeakTracker]] = field(default_factory=dict)  # by framework module
    _mixed: MixedSampler | None = None
    monitors: list[Monitor] = field(default_factory=list)  # started, not stopped yet
    _left_out: list[PeakTracker] = field(default_factory=list)

    def mixed_sampler(self) -> MixedSampler | None:
        """The sampler of host memory and a framework's host pool held at once, where a started
        framework pools host memory (TensorFlow's CPU allocator) and the host peak is exact (a
        sampled host view says nothing more)."""
        if self._mixed is None and getattr(self.host.source, "exact", True):
            pool = self.pooled_host_view()
            if pool is not None:
                self._mixed = MixedSampler(pool)
        return self._mixed

    def pooled_host_view(self) -> PooledHostView | None:
        """The tracked view of host memory a started framework pools (``Framework.pooled_host_view``)."""
        self.trackers()
        for framework in frameworks.KNOWN:
            tracked = self.devices.get(framework.module)
            pool = framework.pooled_host_view([tracker.source for tracker in tracked]) if tracked else None
            if pool is not None:
                return pool
        return None

    def trackers(self) -> list[PeakTracker]:
        for framework in frameworks.KNOWN:
            # asked again until it has views (CUDA's come once PyTorch first uses a GPU)
            if not self.devices.get(framework.module) and framework.loaded() and framework.runtime_started():
                self.devices[framework.module] = [PeakTracker(view) for view in framework.device_views()]
        return [self.host, *(tracker for trackers in self.devices.values() for tracker in trackers)]

    def leave_out_begin(self) -> None:
        """A span that is no window's own begins (a first import): every tracker, the monitors'
        own too, folds the peak so far into its open windows and notes its level."""
        every = [*self.trackers(), *(tracker for monitor in self.monitors for tracker in monitor.trackers)]
        self._left_out = list({id(tracker): tracker for tracker in every}.values())
        for tracker in self._left_out:
            tracker.leave_out_begin()
        if self._mixed is not None:
            self._mixed.leave_out_begin()
        children_probe.watch().leave_out_begin()

    def leave_out_end(self) -> None:
        """The span ends: the open windows leave out what it kept and its peak, and open views
        that appeared in it (TensorFlow's allocators, once its runtime started)."""
        left_out, self._left_out = self._left_out, []
        for tracker in left_out:
            tracker.leave_out_end()
        if self._mixed is not None:
            self._mixed.leave_out_end()
        children_probe.watch().leave_out_end()
        for monitor in self.monitors:
            monitor.open_new_views()


# Process-wide on purpose: the host's high-water mark and TensorFlow's allocators are the
# process's, and nested windows (a test's, its ``tfmem.measure()`` blocks, a leak check's, with or
# without a pytest session) must share one tracker per view to fold their peaks into each other.
# Not a session's state: a session run inside a test (pytester's inline runs) would reset the
# high-water mark under the outer test's open window.
_probes: Probes | None = None


def probes() -> Probes:
    global _probes
    if _probes is None or _probes.platform is not platforms.current():  # another platform was selected
        _probes = Probes()
    return _probes


class Monitor:
    """Measure a window: ``start()`` ... ``stop() -> Measurement``, or use as a context manager.

    ``collect`` is how garbage is collected before the window opens (``gc.collect`` by default;
    the per-test windows use ``garbage.Collector.collect``, which costs only the new objects).
    ``trackers`` are read besides the process-wide ones (host, TensorFlow's allocators): the
    features' own (the manager's ``tracker_sources``), the same objects for every window of a test.
    """

    def __init__(
        self,
        *,
        release_first: bool = True,
        collect: Callable[[], object] = gc.collect,
        sample_mixed: bool = False,
        trackers: Sequence[PeakTracker] = (),
        between_tests: bool = False,
    ) -> None:
        self.release_first = release_first
        self.between_tests = between_tests  # a test's window: its trim is done where it pays (``host.HeapTrims``)
        self.collect = collect
        self.sample_mixed = sample_mixed  # the per-test window: also sample host + TF memory held at once
        self.trackers = tuple(trackers)
        self._mixed: MixedSampler | None = None
        self.measurement: Measurement | None = None
        self._children: children_probe.ChildWindow | None = None
        self._windows: list[tuple[PeakTracker, _Window]] = []
        self._t0 = 0.0

    def start(self) -> Monitor:
        if self.release_first:
            host.release_freed_memory(self.collect, between_tests=self.between_tests)
        self._windows = [(tracker, tracker.open()) for tracker in (*probes().trackers(), *self.trackers)]
        self._arm_mixed()
        probes().monitors.append(self)
        self._children = children_probe.watch().open()
        self._t0 = time.perf_counter()
        return self

    def _arm_mixed(self) -> None:
        sampler = probes().mixed_sampler() if self.sample_mixed else None
        # With no more than the margin free in TensorFlow's pool, the sampled figure could never
        # be the headline (see ``MixedSampler.arm``): nothing to sample.
        self._mixed = sampler if sampler is not None and sampler.arm(min_room=MIXED_MARGIN) else None

    def open_new_views(self) -> None:
        """Open windows on the process-wide trackers that appeared since the window opened
        (TensorFlow's allocators, once a first import started its runtime), beside the others."""
        opened = {id(tracker) for tracker, _ in self._windows}
        new = [(tracker, tracker.open()) for tracker in probes().trackers() if id(tracker) not in opened]
        if new:
            own = {id(tracker) for tracker in self.trackers}
            process = [pair for pair in self._windows if id(pair[0]) not in own]
            self._windows = [*process, *new, *(pair for pair in self._windows if id(pair[0]) in own)]
        if self._mixed is None:
            self._arm_mixed()

    def _host_method(self) -> str:
        return next((tracker.method(window) for tracker, window in self._windows if tracker is probes().host), EXACT)

    def _measurement(
        self, readings: tuple[ViewReading, ...], mixed: MixedReading | None, children: ChildrenReading | None = None
    ) -> Measurement:
        host_source = probes().host.source
        notes = []  # how the host figure was obtained is the section's basis line (core/summary.py)
        measurement = Measurement(
            readings, time.perf_counter() - self._t0, self._host_method(), getattr(host_source, "counts", "RSS"), (),
            mixed.peak if mixed is not None else None, mixed.interval_s if mixed is not None else None,
            children=children,
        )
        swapped = host.swapped_bytes()
        if swapped:
            notes.append(
                f"{format_size(swapped)} of this process was in swap at the end: the host view counts "
                "resident memory only, so it may read low by up to that much"
            )
        if measurement.sampled:
            assert mixed is not None
            notes.append(
                f"host memory and TensorFlow tensors held at once: estimated from readings every "
                f"{mixed.interval_s * 1000:g} ms of RSS and TF's CPU allocator, less TensorFlow's pool "
                f"(the exact views alone: {format_size(measurement.host)} host RSS, "
                f"{format_size(measurement.tf_host)} TF CPU allocator)"
            )
        return dataclasses.replace(measurement, notes=tuple(notes))

    def snapshot(self) -> Measurement:
        """The measurement so far, without ending the window."""
        mixed = self._mixed.reading() if self._mixed is not None else None
        return self._measurement(tuple(tracker.peek(window) for tracker, window in self._windows), mixed)

    def stop(self) -> Measurement:
        if self in probes().monitors:
            probes().monitors.remove(self)
        mixed = self._mixed.disarm() if self._mixed is not None else None
        readings = tuple(tracker.close(w) for tracker, w in self._windows)
        started = children_probe.watch().close(self._children) if self._children is not None else None
        self._children = None
        self.measurement = self._measurement(readings, mixed, started)
        return self.measurement

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
