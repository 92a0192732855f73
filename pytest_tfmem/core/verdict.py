"""Checks: pure functions from a policy and a measurement to a ``Verdict``."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_tfmem import frameworks
from pytest_tfmem.core.measure import Measurement
from pytest_tfmem.core.retained import CHILDREN_VIEW
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


def describe_views(measurement: Measurement) -> str:
    """``host RSS 598.0 MiB, TF CPU:0 allocator 540.0 MiB``: where the memory went; the processes
    the test started, with the largest named: ``processes it started 400.0 MiB, the largest pid
    4242 `python train.py```."""
    views = [f"{view_label(view.view)} {format_size(view.increase)}" for view in measurement.views]
    if measurement.children is not None:
        largest = measurement.children.largest(1)[0]
        count = len(measurement.children.processes)
        views.append(
            f"{count} process{'es' if count > 1 else ''} it started {format_size(measurement.children_peak)}, "
            f"the largest pid {largest.pid} `{largest.command}` {format_size(largest.peak)}"
        )
    return ", ".join(views)


def check_budget(measurement: Measurement, budget: int | None) -> Verdict | None:
    """``peak 612.4 MiB > budget 512.0 MiB (host RSS ..., TF CPU:0 allocator ...)``."""
    if budget is None:
        return None
    peak = measurement.peak
    relation = ">" if peak > budget else "<="
    message = f"peak {format_size(peak)} {relation} budget {format_limit(budget)} ({describe_views(measurement)})"
    return Verdict("budget", peak <= budget, message)
