"""Capture one run of a test into a TensorBoard log directory, and write what it holds.

A traced test's directory holds:

- ``plugins/profile/<run>/<host>.xplane.pb``: TensorFlow's or JAX's profiler trace (Profile tab),
  or PyTorch's ``*.pt.trace.json`` with its memory events;
- ``events.out.tfevents.*``: the memory timeline as scalars (Scalars tab);
- ``timeline.png``: the same timeline with the budget line, for readers without TensorBoard;
- ``summary.json``: what was traced, the numbers, and the command that opens the directory;
- ``output.txt``: what a re-run printed (only when it printed anything).

Writing a trace never fails the test run: a step that fails (a missing optional package, a
full disk) is noted in ``summary.json`` and in the report, and the other steps go on.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_tfmem import frameworks
from pytest_tfmem.core.handoffs import TRACE_SUMMARY
from pytest_tfmem.core.measure import Measurement
from pytest_tfmem.core.retained import CHILDREN_VIEW, children_size, running_children
from pytest_tfmem.extras import installed
from pytest_tfmem.files import write_text_atomic
from pytest_tfmem.frameworks.profiler import ProfilerCapture
from pytest_tfmem.trace import timeline as timeline_module
from pytest_tfmem.trace.draw import draw
from pytest_tfmem.trace.timeline import MemoryView, Timeline, TimelineSampler

OUTPUT = "output.txt"


def memory_views() -> list[MemoryView]:
    """Host RSS, the running processes this one started (their own sizes, read as the
    test's ``children`` view is), plus each framework's device views once its runtime is up
    (TensorFlow's allocators, JAX's and PyTorch's GPUs)."""
    already = running_children()  # running before the test (a wider fixture's pool): not its
    views = [timeline_module.host_view(), MemoryView(CHILDREN_VIEW, lambda: children_size(already))]
    views += [MemoryView(view.name, view.current) for view in frameworks.device_views()]
    return views


@dataclass
class Capture:
    """A profiler session and a timeline sampler running together over one run of a test."""

    directory: Path
    profiler: ProfilerCapture
    sampler: TimelineSampler
    timeline: Timeline | None = None


@contextmanager
def capturing(directory: Path) -> Iterator[Capture]:
    """Profile and sample the block into ``directory``; both stop when it ends, however it ends."""
    profiler = ProfilerCapture(frameworks.primary(), directory)
    capture = Capture(directory, profiler, TimelineSampler(memory_views()))
    capture.profiler.start()
    try:
        capture.sampler.start()
        yield capture
    finally:
        capture.timeline = capture.sampler.stop()
        capture.profiler.stop()


def tensorboard_command(directory: str) -> str:
    return f"tensorboard --logdir {shlex.quote(directory)}"


def missing_for_traces() -> list[str]:
    """The trace extra's modules a trace's scalars, PNG and viewer need that are not installed here."""
    return [module for module in ("tensorboard", "matplotlib") if not installed(module)]


@dataclass
class TraceFacts:
    """What the report needs to describe a traced run, besides the capture itself."""

    nodeid: str
    how: str  # "rerun": re-run once after the failure; "run": the test's own (verdict) run
    measurement: Measurement  # of the traced run
    verdict_peak: int | None  # of the untraced run, when the traced run was a re-run
    budget: int | None
    verdicts: list[str]
    error: str | None = None  # how a re-run ended, if it raised
    output: str = ""
    notes: list[str] = field(default_factory=list)


def write_trace(capture: Capture, facts: TraceFacts) -> dict[str, Any]:
    """Write scalars, PNG, output and ``summary.json`` into the capture's directory; the summary."""
    directory = capture.directory
    assert capture.timeline is not None
    starts = {reading.view: reading.start for reading in facts.measurement.views}
    # the children view is kept where a process ran
    timeline = capture.timeline.window(facts.measurement.duration_s, starts).without_idle(CHILDREN_VIEW)
    for view in timeline.views:
        starts.setdefault(view, timeline.values[view][0])
    drawn = draw(
        directory, timeline, starts,
        title=f"{facts.nodeid} ({'traced re-run' if facts.how == 'rerun' else 'traced run'})",
        budget=facts.budget, exact_peak=facts.measurement.peak, verdict_peak=facts.verdict_peak,
    )  # fmt: skip
    if facts.output:
        write_text_atomic(directory / OUTPUT, facts.output)
    summary: dict[str, Any] = {
        "nodeid": facts.nodeid,
        "traced": "re-run once after the failure" if facts.how == "rerun" else "the test's own run",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "verdict": {
            "peak_bytes": facts.verdict_peak if facts.how == "rerun" else facts.measurement.peak,
            "budget_bytes": facts.budget,
            "failed": facts.verdicts,
            "measured_while_tracing": facts.how == "run",
        },
        "traced_run": {**facts.measurement.to_dict(), "error": facts.error},
        "profiler": {
            "status": capture.profiler.status,
            "message": capture.profiler.message,
            "files": [str(path.relative_to(directory)) for path in capture.profiler.files],
        },
        "timeline": {
            "png": drawn.png,
            "scalars": drawn.tags,
            "interval_s": timeline.interval_s,
            "samples": len(timeline.times),
        },
        "output": OUTPUT if facts.output else None,
        "notes": [*facts.notes, *drawn.notes],
        "missing": drawn.missing,  # modules the drawing needed (the session's summary says it once)
        "tensorboard": tensorboard_command(str(directory)) if installed("tensorboard") else None,
    }
    write_text_atomic(directory / TRACE_SUMMARY, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary
