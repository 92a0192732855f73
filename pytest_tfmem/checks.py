"""Checks: pure functions from a policy and a measurement to a ``Verdict``."""

from __future__ import annotations

from dataclasses import dataclass

from .measure import Measurement
from .units import format_size


@dataclass(frozen=True)
class Verdict:
    """Outcome of one check; ``message`` is what the user reads."""

    check: str
    ok: bool
    message: str


def describe_views(measurement: Measurement) -> str:
    """``host RSS 598.0 MiB, TF CPU:0 allocator 540.0 MiB``: where the memory went."""
    parts = []
    for view in measurement.views:
        label = "host RSS" if view.view == "host" else f"TF {view.view[3:]} allocator"
        if view.view.startswith("nvml:"):  # NVML: this process's memory on a GPU
            label = f"GPU {view.view[5:]} (NVML)"
        parts.append(f"{label} {format_size(view.increase)}")
    return ", ".join(parts)


def check_budget(measurement: Measurement, budget: int | None) -> Verdict | None:
    """``peak 612.4 MiB > budget 512.0 MiB (host RSS ..., TF CPU:0 allocator ...)``."""
    if budget is None:
        return None
    peak = measurement.peak
    relation = ">" if peak > budget else "<="
    message = f"peak {format_size(peak)} {relation} budget {format_size(budget)} ({describe_views(measurement)})"
    return Verdict("budget", peak <= budget, message)
