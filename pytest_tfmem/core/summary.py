"""The terminal summary: a table of the heaviest tests."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_tfmem.core.measure import Measurement
from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.units import format_size


def _use(record: TestRecord) -> str:
    if record.budget is None or record.measurement is None or record.budget == 0:
        return "-"
    return f"{100 * record.measurement.peak / record.budget:.0f}%"


def _nvml(measurement: Measurement) -> str:
    """This process's largest GPU memory increase as NVML read it (see ``gpu.py``)."""
    return format_size(max((v.increase for v in measurement.views if v.view.startswith("nvml:")), default=None))


def summary_rows(records: Sequence[TestRecord], top: int) -> list[list[str]]:
    """Header plus one row per heaviest test: test, peak, host, TF (CPU), GPU, budget, use, result."""
    measured = [r for r in records if r.measurement is not None]
    measured.sort(key=lambda r: r.measurement.peak, reverse=True)  # type: ignore[union-attr]
    with_nvml = any(v.view.startswith("nvml:") for r in measured for v in r.measurement.views)  # type: ignore[union-attr]
    nvml_column = ["NVML GPU"] if with_nvml else []
    rows = [["test", "peak", "host RSS", "TF CPU", "TF GPU", *nvml_column, "budget", "use", "result"]]
    for record in measured[:top]:
        m = record.measurement
        assert m is not None
        has_tf = any(v.view.startswith("tf:CPU") for v in m.views)
        rows.append(
            [
                record.nodeid,
                format_size(m.peak),
                format_size(m.host),
                format_size(m.tf_host) if has_tf else "-",
                format_size(m.gpu),
                *([_nvml(m)] if with_nvml else []),
                format_size(record.budget),
                _use(record),
                "over budget" if any(v.check == "budget" for v in record.failed_verdicts) else (record.outcome or ""),
            ]
        )
    return rows


def render_table(rows: list[list[str]]) -> list[str]:
    """Align columns: the first left-aligned, the rest right-aligned."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
    return lines
