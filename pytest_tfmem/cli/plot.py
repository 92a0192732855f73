"""PNG charts (matplotlib): each test's peak memory, with its baseline and budget marked; the
process's size after each test, with the top retainers marked."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pytest_tfmem.core.record import TestRecord, session_account
from pytest_tfmem.core.retained import HEAVIEST_KEPT, TEST
from pytest_tfmem.units import format_size

MIB = 2**20
_REGRESSED, _PASSED, _FAILED = "#d62728", "#1f77b4", "#ff7f0e"


def plot_peaks(
    records: Sequence[TestRecord],
    path: str | Path,
    *,
    baseline_peaks: Mapping[str, int] | None = None,
    regressed: set[str] = frozenset(),  # type: ignore[assignment]
    top: int = 30,
    title: str = "Peak memory per test",
) -> int:
    """Draw the ``top`` heaviest measured tests as horizontal bars; return how many were drawn.

    Bars are red for tests beyond tolerance of their baseline, orange for other failed
    tests; a black tick marks a test's baseline peak, a dashed grey tick its budget.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    baseline_peaks = baseline_peaks or {}
    measured = sorted(
        (r for r in records if r.measurement is not None), key=lambda r: r.measurement.peak, reverse=True  # type: ignore[union-attr]
    )[:top]
    measured.reverse()  # heaviest at the top of the chart
    figure = Figure(figsize=(10, 2 + 0.4 * max(len(measured), 1)), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions = range(len(measured))
    colours = [
        _REGRESSED if r.nodeid in regressed else (_FAILED if r.outcome == "failed" else _PASSED) for r in measured
    ]
    axes.barh(positions, [r.measurement.peak / MIB for r in measured], color=colours)  # type: ignore[union-attr]
    for position, record in zip(positions, measured):
        if record.nodeid in baseline_peaks:
            axes.plot([baseline_peaks[record.nodeid] / MIB] * 2, [position - 0.4, position + 0.4], color="black", lw=2)
        if record.budget is not None:
            axes.plot([record.budget / MIB] * 2, [position - 0.4, position + 0.4], color="grey", lw=2, ls="--")
    axes.set_yticks(list(positions), [_short(r.nodeid) for r in measured], fontsize=8)
    axes.set_xlabel("peak memory need (MiB)")
    axes.set_title(title)
    figure.legend(
        handles=[
            Patch(color=_PASSED, label="peak"),
            Patch(color=_REGRESSED, label="beyond tolerance of baseline"),
            Patch(color=_FAILED, label="failed"),
            Line2D([], [], color="black", lw=2, label="baseline"),
            Line2D([], [], color="grey", lw=2, ls="--", label="budget"),
        ],
        loc="outside lower center",
        ncols=5,
        fontsize=8,
    )
    figure.savefig(path, format="png")
    return len(measured)


def _short(nodeid: str, width: int = 60) -> str:
    return nodeid if len(nodeid) <= width else "..." + nodeid[-(width - 3):]


def plot_session(records: Iterable[TestRecord], path: str | Path, *, top: int = 5) -> int:
    """Draw each process's size after each test (one line per pytest-xdist worker), with the
    ``top`` retainers marked where they left their memory (at most ``HEAVIEST_KEPT``: the books keep
    no more tests); return how many tests were drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    records = list(records)
    account = session_account(records)
    retained = [(record.nodeid, record.retained) for record in records if record.retained is not None]
    figure = Figure(figsize=(10, 5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    heaviest = account.top_retainers(min(top, HEAVIEST_KEPT))
    marked = {(r.worker, r.name) for r in heaviest if r.kind == TEST}
    fixtures = {(r.worker, r.name) for r in heaviest if r.kind != TEST}
    drawn = 0
    for process in account.processes:
        tests = sorted((entry for entry in retained if entry[1].worker == process.worker), key=lambda e: e[1].seq)
        sizes = [process.start.total / MIB, *(figures.after.total / MIB for _, figures in tests)]
        label = process.worker or "process"
        axes.plot(range(len(sizes)), sizes, marker=".", label=f"{label}: RSS after each test")
        for index, (nodeid, figures) in enumerate(tests, start=1):
            names = [
                f"{b.name} {b.detail} {format_size(b.bytes, signed=True)}"
                for b in figures.bookings if (process.worker, b.name) in fixtures
            ]
            if (process.worker, nodeid) in marked:
                names.insert(0, f"{_short(nodeid, 40)} {format_size(figures.bytes, signed=True)}")
            if names:
                axes.annotate("\n".join(names), (index, figures.after.total / MIB), fontsize=7,
                              xytext=(4, 8), textcoords="offset points", arrowprops={"arrowstyle": "-"})
        drawn += len(tests)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("tests run (in order)")
    axes.set_ylabel("process RSS (MiB)")
    axes.set_title("Process size after each test")
    axes.legend(fontsize=8)
    figure.savefig(path, format="png")
    return drawn
