"""Checks: pure functions from a policy and a measurement to a ``Verdict``."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pytest_tfmem import frameworks
from pytest_tfmem.core.measure import Measurement
from pytest_tfmem.core.retained import CHILDREN_VIEW, Retained
from pytest_tfmem.units import format_limit, format_size


@dataclass(frozen=True)
class Verdict:
    """Outcome of one check; ``message`` is what the user reads."""

    check: str
    ok: bool
    message: str


def view_label(view: str) -> str:
    """``host`` -> ``host RSS``, ``tf:CPU:0`` -> ``TF CPU:0 allocator``, ``nvml:1`` -> ``GPU 1 (NVML)``,
    ``children`` -> ``processes it started``, ``jax:gpu:0`` -> ``JAX gpu:0 device``."""
    if view == "host":
        return "host RSS"
    if view == CHILDREN_VIEW:  # the running processes it started (``probes.children``)
        return "processes it started"
    if view.startswith("nvml:"):  # NVML: this process's memory on a GPU
        return f"GPU {view[5:]} (NVML)"
    return frameworks.view_label(view) or view


def describe_views(measurement: Measurement, name_largest: bool = True) -> str:
    """``host RSS 598.0 MiB, TF CPU:0 allocator 540.0 MiB``: where the memory went; the processes
    the test started, with the largest named (``name_largest``): ``processes it started 400.0 MiB,
    the largest pid 4242 `python train.py```."""
    views = [f"{view_label(view.view)} {format_size(view.increase)}" for view in measurement.views]
    if measurement.children is not None:
        views.append(f"{measurement.children.counted()} {format_size(measurement.children_peak)}")
        if name_largest:
            largest = measurement.children.largest(1)[0]
            views[-1] += f", the largest pid {largest.pid} `{largest.command}` {format_size(largest.peak)}"
    return ", ".join(views)


def check_budget(measurement: Measurement, budget: int | None) -> Verdict | None:
    """``peak 612.4 MiB > budget 512.0 MiB (host RSS ..., TF CPU:0 allocator ...)``."""
    if budget is None:
        return None
    peak = measurement.peak
    relation = ">" if peak > budget else "<="
    message = f"peak {format_size(peak)} {relation} budget {format_limit(budget)} ({describe_views(measurement)})"
    return Verdict("budget", peak <= budget, message)


WHAT_USED = "what used it: "  # the line under a budget failure (``what_used_line``)


def mostly_processes(measurement: Measurement) -> bool:
    """At least half the test's peak is the processes it started (or used)."""
    return measurement.children_peak * 2 >= measurement.peak


def what_used(measurement: Measurement) -> str:
    """The kind of memory that made most of a test's peak, in words, by the figures the same
    message prints: the processes it started, tensors in a framework's host allocator, or host
    memory outside the frameworks' allocators. Host RSS counts the allocator's memory too: what
    lies outside is host RSS less the allocator's share, and the words never say "mostly" of a part
    the figures show is not the larger."""
    peak = measurement.peak
    if measurement.children is not None and mostly_processes(measurement):
        return (f"mostly the {measurement.children.named()} ({format_size(measurement.children_peak)} of "
                f"{format_size(peak)})")
    pooled = max((v for v in measurement.views if frameworks.is_host_view(v.view)), key=lambda v: v.increase,
                 default=None)
    tensors = pooled.increase if pooled is not None else 0
    outside = max(0, measurement.host - tensors)
    kinds = "NumPy arrays, Python objects, native libraries"
    if pooled is None or tensors == 0:
        return (f"mostly host memory outside the frameworks' allocators ({kinds}): host RSS "
                f"{format_size(measurement.host)} of {format_size(peak)}")
    label = view_label(pooled.view)
    if tensors >= outside:
        return f"mostly tensors: the {label} {format_size(tensors)} of {format_size(peak)}"
    return (f"mostly host memory outside the frameworks' allocators ({kinds}): {format_size(outside)} of "
            f"{format_size(peak)} (host RSS {format_size(measurement.host)}, less the {label}'s "
            f"{format_size(tensors)})")


def what_used_line(measurement: Measurement, largest_line: dict[str, object] | None) -> str:
    """The line under a budget failure: the kind of memory, and the line of the test that needed
    the most where the re-run's line tracer knows it (``--tfmem-explain``), else how to find it."""
    kind = what_used(measurement)
    if largest_line is None and mostly_processes(measurement):
        return (f"{WHAT_USED}{kind}; the code that used it ran there, where --tfmem-explain does not look: "
                "`tfmem run SCRIPT` names a script's line, `%%tfmem` a notebook cell's (docs/notebooks.md)")
    if largest_line is None:
        return f"{WHAT_USED}{kind}; for the line, run the test with --tfmem-explain"
    increase = largest_line.get("peak_increase_bytes")
    size = format_size(increase, signed=True) if isinstance(increase, int) else ""
    where = str(largest_line.get("file"))
    shown = os.path.relpath(where) if os.path.isabs(where) and where.startswith(os.getcwd() + os.sep) else where
    return (f"{WHAT_USED}{kind}; the line that needed the most: {shown}:"
            f"{largest_line.get('line')} `{largest_line.get('contents')}` {size}").rstrip()


# The checks on a test's peak: under their failure, what used the memory (``what_used_line``).
PEAK_CHECKS = frozenset({"budget", "baseline", "history"})


def what_kept_line(retained: Retained) -> str:
    """The line under a failure on what a test left behind, by the figures of its message: tensors
    still alive in TensorFlow's pool, processes still running, or host memory outside the pool,
    and where to see what holds it."""
    processes = retained.after.children - retained.before.children
    host = retained.host_bytes - processes
    parts = {"tensors still alive in TensorFlow's pool": retained.tf_bytes,
             "processes it started, still running": processes,
             "host memory outside TensorFlow's pool (Python objects, NumPy arrays, caches)": host}
    kind, size = max(parts.items(), key=lambda part: part[1])
    where = ("`what stayed` above names the objects that hold it" if retained.stayed else
             "--tfmem-stayed-threshold=SIZE names the objects that hold what a test keeps beyond SIZE")
    kept, whole = format_size(size, signed=True), format_size(retained.bytes, signed=True)
    return f"{WHAT_USED}mostly {kind}: {kept} of {whole}; {where}"
