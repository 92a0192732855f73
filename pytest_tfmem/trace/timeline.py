"""The memory timeline of one traced test: sampled, then written as TensorBoard scalars and a PNG.

A ``Sampler`` reads host RSS and each framework device view's current level every
``INTERVAL_S``. Values are kept in bytes and shown above the test's starting level (the
quantity the budget applies to). The sampled curve can miss a spike shorter than the
interval; the exact peak of the run (kernel high-water mark, allocator peak) is drawn beside
it. TensorBoard scalars use the elapsed milliseconds as the step, so the x axis reads as time.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_tfmem.core.verdict import view_label
from pytest_tfmem.files import write_file_atomic
from pytest_tfmem.probes import host
from pytest_tfmem.probes.sampler import Sampler
from pytest_tfmem.units import format_size

INTERVAL_S = 0.01
MIB = 2**20
SCALAR_PREFIX = "memory/"


@dataclass(frozen=True)
class MemoryView:
    """One source of the timeline: ``host`` or ``tf:CPU:0`` ..., and how to read it now."""

    name: str
    read: Callable[[], int]


def host_view() -> MemoryView:
    return MemoryView("host", host.current_rss)


def scalar_tag(view: str) -> str:
    """``host`` -> ``memory/host_rss_mib``; ``tf:CPU:0`` -> ``memory/tf_CPU:0_mib``; ``jax:gpu:0`` ->
    ``memory/jax_gpu:0_mib``; ``children`` -> ``memory/children_mib``."""
    return SCALAR_PREFIX + ("host_rss" if view == "host" else view.replace(":", "_", 1)) + "_mib"


@dataclass
class Timeline:
    """Samples of several views: ``times`` (seconds since start) and bytes per view."""

    views: list[str]
    times: list[float] = field(default_factory=list)
    wall_times: list[float] = field(default_factory=list)
    values: dict[str, list[int]] = field(default_factory=dict)
    interval_s: float = INTERVAL_S

    def window(self, duration_s: float, starts: dict[str, int]) -> Timeline:
        """The last ``duration_s`` seconds (the measured window, which ended at the last sample),
        re-timed to start at 0 with the window's exact starting levels as the first point."""
        if not self.times:
            return self
        begin = self.times[-1] - duration_s
        kept = [i for i, t in enumerate(self.times) if t > begin]
        window = Timeline(list(self.views), interval_s=self.interval_s)
        window.times = [0.0] + [self.times[i] - begin for i in kept]
        window.wall_times = [self.wall_times[-1] - duration_s] + [self.wall_times[i] for i in kept]
        window.values = {
            v: [starts[v] if v in starts else self.values[v][-1]] + [self.values[v][i] for i in kept]
            for v in self.views
        }
        return window

    def without_idle(self, view: str) -> Timeline:
        """The timeline less ``view`` where it read 0 throughout (no process ran, say)."""
        if any(self.values.get(view, ())):
            return self
        return Timeline([v for v in self.views if v != view], list(self.times), list(self.wall_times),
                        {v: values for v, values in self.values.items() if v != view}, self.interval_s)

    def above(self, view: str, start: int) -> list[float]:
        """The view's samples in MiB above ``start``."""
        return [(value - start) / MIB for value in self.values[view]]


class TimelineSampler:
    """Sample ``views`` every ``interval_s`` in the background between ``start`` and ``stop``."""

    def __init__(self, views: Sequence[MemoryView], interval_s: float = INTERVAL_S) -> None:
        self._views = list(views)
        self.timeline = Timeline([v.name for v in self._views], interval_s=interval_s)
        self.timeline.values = {v.name: [] for v in self._views}
        self._sampler = Sampler(self._sample, interval_s, "tfmem-timeline")
        self._t0 = 0.0

    def _sample(self) -> bool:
        readings = []
        for view in self._views:
            try:
                readings.append(view.read())
            except Exception:  # a source that fails mid-test (TF shutting down) ends the timeline
                return False
        self.timeline.times.append(time.perf_counter() - self._t0)
        self.timeline.wall_times.append(time.time())
        for view, reading in zip(self._views, readings):
            self.timeline.values[view.name].append(reading)
        return True

    def start(self) -> TimelineSampler:
        self._t0 = time.perf_counter()
        self._sampler.start()  # its first sample is the level at the start
        return self

    def stop(self) -> Timeline:
        self._sampler.stop()
        self._sample()  # the level at the end
        return self.timeline


class ScalarEventFile:
    """A TensorBoard event file of scalars, written with TensorBoard's own record format and
    protos. (``tensorboard.summary.Writer`` would import TensorFlow to open the file, which a
    process that never loaded it should not pay for.) Written under a temporary name and
    renamed when complete, so TensorBoard never reads half a file."""

    def __init__(self, logdir: Path) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.scalar import metadata
        from tensorboard.summary.writer.record_writer import RecordWriter
        from tensorboard.util import tensor_util

        self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
        self._metadata, self._tensor_util = metadata, tensor_util
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.tfmem"
        self.path = logdir / name
        self._temporary = logdir / f".{name}.partial".replace("tfevents", "events")
        self._file = open(self._temporary, "wb")  # noqa: SIM115 (kept open for the writer; close() closes it)
        self._records = RecordWriter(self._file)
        self._described: set[str] = set()
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event: object) -> None:
        self._records.write(event.SerializeToString())  # type: ignore[attr-defined]

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float, description: str) -> None:
        summary_metadata = self._metadata.create_summary_metadata(display_name="", description="")
        if tag not in self._described:  # metadata once per tag, as TensorBoard's writers do
            self._described.add(tag)
            summary_metadata.summary_description = description
        summary_metadata.data_class = self._summary_pb2.DataClass.DATA_CLASS_SCALAR
        event = self._event_pb2.Event(wall_time=wall_time, step=step)
        tensor = self._tensor_util.make_tensor_proto(float(value))
        event.summary.value.add(tag=tag, tensor=tensor, metadata=summary_metadata)
        self._write(event)

    def close(self) -> None:
        self._records.close()
        os.replace(self._temporary, self.path)

    def discard(self) -> None:
        self._records.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._temporary)


def write_scalars(logdir: Path, timeline: Timeline, starts: dict[str, int], budget: int | None) -> list[str]:
    """Write the timeline as TensorBoard scalars into ``logdir``; return the tags written."""
    events = ScalarEventFile(logdir)
    tags = []
    try:
        for view in timeline.views:
            tag = scalar_tag(view)
            tags.append(tag)
            description = f"{view_label(view)}, MiB above the level at the start of the test"
            values = timeline.above(view, starts[view])
            for elapsed, wall_time, value in zip(timeline.times, timeline.wall_times, values):
                events.add_scalar(tag, value, round(elapsed * 1000), wall_time, description)
        if budget is not None and timeline.times:
            tag = SCALAR_PREFIX + "budget_mib"
            tags.append(tag)
            for index in (0, -1):
                events.add_scalar(tag, budget / MIB, round(timeline.times[index] * 1000), timeline.wall_times[index],
                                  "the test's memory budget, MiB")
    except BaseException:
        events.discard()
        raise
    events.close()
    return tags


def plot_png(
    path: Path,
    timeline: Timeline,
    starts: dict[str, int],
    *,
    title: str,
    budget: int | None,
    exact_peak: int | None,
    verdict_peak: int | None,
) -> None:
    """Draw the timeline with the budget line (and exact peaks) into a PNG, atomically."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    figure = Figure(figsize=(9, 4.8), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    for view in timeline.views:
        axes.plot(timeline.times, timeline.above(view, starts[view]), label=view_label(view), linewidth=1.2)
    if budget is not None:
        axes.axhline(budget / MIB, color="tab:red", linestyle="--", label=f"budget {format_size(budget)}")
    if exact_peak is not None:
        label = f"exact peak of this run {format_size(exact_peak)}"
        axes.axhline(exact_peak / MIB, color="0.35", linestyle=":", label=label)
    if verdict_peak is not None and verdict_peak != exact_peak:
        axes.axhline(verdict_peak / MIB, color="tab:purple", linestyle="-.", linewidth=0.9,
                     label=f"peak of the verdict run {format_size(verdict_peak)}")
    axes.set_xlabel("seconds since the test started")
    axes.set_ylabel("MiB above the level at the start")
    axes.set_title(title, fontsize=9, loc="left")
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize=8)
    write_file_atomic(path, lambda temporary: figure.savefig(temporary, format="png"))
