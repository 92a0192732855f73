"""TensorFlow memory at the allocator's peak, by op: read from a profiler trace's memory profile.

TensorFlow's profiler records every allocation and deallocation of each allocator (with
``host_tracer_level`` >= 2). xprof's ``memory_profile`` tool turns a trace into, per allocator,
the allocations still alive at the moment the allocator held the most memory
(``memoryProfilePerAllocator.<name>.activeAllocations``, pointing into
``memoryProfileSnapshots`` or ``specialAllocations``). Each names the TF op that allocated it
(inside a ``tf.function`` the op carries its layer scope, e.g. ``sequential/dense/BiasAdd``),
its shape, dtype and bytes. Grouped by op, shape and dtype, the largest first, they say which
layer held the memory at the peak.

``unused preallocated device memory`` is xprof's name for bytes in use at the peak that no
allocation in the trace accounts for (allocated before the trace began, or preallocated).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_tfmem.extras import install_hint
from pytest_tfmem.units import format_size

UNATTRIBUTED = "unused preallocated device memory"
NO_OP_NAME = "(no op name)"
MIB = 2**20


class TraceUnreadable(Exception):
    """The trace has no memory profile xprof can read; the message says why."""


@dataclass(frozen=True)
class OpMemory:
    """Allocations alive at the peak that share an op, shape and dtype."""

    op: str
    shape: str
    dtype: str
    count: int
    bytes: int

    @property
    def layer(self) -> str:
        """The op's name scope (``sequential/dense`` of ``sequential/dense/BiasAdd``), or ``""``."""
        return self.op.rpartition("/")[0]

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "layer": self.layer, "shape": self.shape, "dtype": self.dtype,
                "count": self.count, "bytes": self.bytes}


@dataclass(frozen=True)
class AllocatorPeak:
    """One allocator at its peak: bytes in use, when, and what held them (largest first)."""

    allocator: str
    peak_bytes: int
    peak_time_s: float  # since the trace began
    rows: list[OpMemory]
    groups: int  # groups alive at the peak, of which ``rows`` are the largest

    def to_dict(self) -> dict[str, Any]:
        return {"allocator": self.allocator, "peak_bytes": self.peak_bytes, "peak_time_s": self.peak_time_s,
                "groups": self.groups, "rows": [row.to_dict() for row in self.rows]}


def memory_profile(xplane_files: Sequence[Path]) -> dict[str, Any]:
    """xprof's ``memory_profile`` tool data of a trace, as a dict.

    Raises ``TraceUnreadable`` when xprof is missing or returns nothing for the files.
    """
    try:
        from xprof.convert import raw_to_tool_data
    except ImportError as error:
        raise TraceUnreadable(f"xprof is not installed ({error}); {install_hint('trace')}") from None
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(path) for path in xplane_files], "memory_profile", {})
    if not data:
        raise TraceUnreadable(f"xprof found no memory profile in {', '.join(map(str, xplane_files))}")
    return json.loads(data)


def _allocations_at_peak(allocator: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    """(allocation metadata, occurrences) of each allocation alive at the allocator's peak."""
    snapshots = allocator.get("memoryProfileSnapshots", [])
    specials = allocator.get("specialAllocations", [])
    alive = []
    for active in allocator.get("activeAllocations", []):
        snapshot, special = int(active.get("snapshotIndex", -1)), int(active.get("specialIndex", -1))
        if 0 <= snapshot < len(snapshots):
            metadata = snapshots[snapshot].get("activityMetadata", {})
        elif 0 <= special < len(specials):
            metadata = specials[special]
        else:
            continue
        alive.append((metadata, int(active.get("numOccurrences", 1))))
    return alive


def peak_allocations(profile: dict[str, Any], top: int) -> list[AllocatorPeak]:
    """Per allocator that allocated anything, the ``top`` largest groups alive at its peak; largest allocator first."""
    peaks = []
    for name, allocator in profile.get("memoryProfilePerAllocator", {}).items():
        summary = allocator.get("profileSummary", {})
        peak_bytes = int(summary.get("peakStats", {}).get("peakBytesInUse", 0))
        groups: dict[tuple[str, str, str], list[int]] = {}
        for metadata, occurrences in _allocations_at_peak(allocator):
            shape, dtype = metadata.get("tensorShape", ""), metadata.get("dataType", "")
            key = (
                metadata.get("tfOpName") or NO_OP_NAME,
                "" if shape == "unknown" else shape,
                "" if dtype == "INVALID" else dtype,
            )
            totals = groups.setdefault(key, [0, 0])
            totals[0] += occurrences
            totals[1] += occurrences * int(metadata.get("allocationBytes", 0))
        if peak_bytes == 0 and not groups:
            continue
        rows = sorted((OpMemory(op, shape, dtype, count, size) for (op, shape, dtype), (count, size) in groups.items()),
                      key=lambda row: (-row.bytes, row.op))
        time_s = int(summary.get("peakStatsTimePs", 0)) / 1e12
        peaks.append(AllocatorPeak(name, peak_bytes, time_s, rows[:top], len(rows)))
    return sorted(peaks, key=lambda peak: -peak.peak_bytes)


def render_ops(peak: AllocatorPeak) -> list[str]:
    """``op  shape  dtype  count  MiB`` for one allocator, with a heading line."""
    heading = (
        f"allocator {peak.allocator}: {format_size(peak.peak_bytes)} in use at its peak, "
        f"{peak.peak_time_s:.2f} s into the trace"
    )
    lines = [heading]
    table = [["op", "shape", "dtype", "count", "MiB"]]
    table += [
        [row.op, row.shape or "-", row.dtype or "-", str(row.count), f"{row.bytes / MIB:.1f}"] for row in peak.rows
    ]
    widths = [max(len(cells[i]) for cells in table) for i in range(5)]
    for cells in table:
        left = [cell.ljust(width) for cell, width in zip(cells[:3], widths[:3])]
        right = [cell.rjust(width) for cell, width in zip(cells[3:], widths[3:])]
        lines.append("  ".join(left + right).rstrip())
    if peak.groups > len(peak.rows):
        lines.append(f"({peak.groups - len(peak.rows)} smaller groups not shown)")
    if any(row.op == UNATTRIBUTED for row in peak.rows):
        lines.append(f"'{UNATTRIBUTED}': bytes in use at the peak that no allocation in the trace accounts for "
                     "(allocated before the trace began, or preallocated)")
    return lines
