"""The terminal summary's table of the heaviest tests, and a test's own ``tfmem`` section."""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from pytest_tfmem import frameworks
from pytest_tfmem.core.first_imports import section_lines
from pytest_tfmem.core.measure import Measurement
from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.platforms import EXACT, EXACT_IF_RAISED
from pytest_tfmem.probes.children import INTERVAL_S, ChildFigure, ChildrenReading
from pytest_tfmem.units import format_size


def use_percent(need: int | None, budget: int | None) -> str:
    """``42%``: how much of its budget a test needed; ``-`` without a budget."""
    if budget is None or need is None or budget == 0:
        return "-"
    return f"{100 * need / budget:.0f}%"


# What the result column says of a test that failed a check, the first of its checks in this order.
_FAILED_CHECK_RESULTS = {
    "kill_at": "killed at kill_at",
    "signal": "killed by a signal",
    "died": "its process died",
    "budget": "over budget",
    "gpu_budget": "over GPU budget",
    "max_retained": "over max_retained",
    "baseline": "over its baseline",
    "retained_baseline": "retained over its baseline",
    "history": "over its history",
    "leak": "leaking",
    "oom": "device out of memory",
}


def result_word(record: TestRecord, death: str | None = None) -> str:
    """The result column of every tfmem table: what failed (``over budget``; ``death``, how an
    isolated test's process ended, where it was killed), said the same way whether the test failed
    or was expected to (``xfailed (over budget)``), else its outcome."""
    failed = {v.check for v in record.failed_verdicts}
    said = death or next((label for check, label in _FAILED_CHECK_RESULTS.items() if check in failed), None)
    if record.outcome == "xfailed":
        result = f"xfailed ({said})" if said else "xfailed"
    elif said is not None:
        result = said
    else:  # a failed check of a conftest's own, before its report says "failed"
        result = record.outcome or ("failed" if failed else "")
    if record.reruns:  # pytest-rerunfailures: the figures are the last attempt's
        result += f" (rerun {record.reruns} time{'s' if record.reruns > 1 else ''})"
    return result


def _nvml(measurement: Measurement) -> str:
    """This process's largest GPU memory increase as NVML read it (see ``gpu.py``)."""
    return format_size(max((v.increase for v in measurement.views if v.view.startswith("nvml:")), default=None))


def _retained(record: TestRecord) -> str:
    """What the test left behind after its teardown (``-`` where not known, as before it)."""
    return _signed(None if record.retained is None else record.retained.bytes)


def _signed(size: int | None) -> str:
    return "-" if size is None else format_size(size, signed=True)


class HeaviestTests:
    """The table of the heaviest tests, gathered one record at a time (``add``): the ``top``
    heaviest measured tests, and what the columns need to know of all of them. A session's
    table is built without holding every record (``core.record_store``)."""

    def __init__(self, top: int) -> None:
        self.top = top
        self._heaviest: list[tuple[int, int, TestRecord]] = []  # a heap: (peak, -arrival, record)
        self._arrivals = 0
        self._nvml = self._gpu_budget = self._retained = self._subtest_retained = self._children = False
        self._views: set[str] = set()  # the frameworks' views some test has: a column each
        self._nvml_interval: float | None = None  # the longest NVML reading interval

    def add(self, record: TestRecord) -> None:
        measurement = record.measurement
        if measurement is None:
            return
        self._nvml |= any(v.view.startswith("nvml:") for v in measurement.views)
        self._gpu_budget |= record.gpu_budget is not None
        self._retained |= record.retained is not None
        self._subtest_retained |= any(subtest.retained is not None for subtest in record.subtests)
        self._children |= measurement.children is not None
        self._views.update(v.view for v in measurement.views if frameworks.owner(v.view) is not None)
        if measurement.nvml_interval_s is not None:
            self._nvml_interval = max(self._nvml_interval or 0.0, measurement.nvml_interval_s)
        self._arrivals += 1
        entry = (measurement.peak, -self._arrivals, record)  # of equal peaks, the earlier ranks first
        if len(self._heaviest) < self.top:
            heapq.heappush(self._heaviest, entry)
        elif self.top and entry[:2] > self._heaviest[0][:2]:
            heapq.heapreplace(self._heaviest, entry)

    def view_columns(self) -> list[str]:
        """The framework views some test has (``tf:CPU:0``, ``jax:gpu:0``), in the columns' order."""
        return sorted(self._views, key=frameworks.column_order)

    def _nvml_header(self) -> str:
        """``NVML GPU (every 50 ms)``: NVML keeps no peak, so its column says how it was read."""
        if self._nvml_interval is None:
            return "NVML GPU"
        interval = self._nvml_interval
        return f"NVML GPU (every {interval * 1000:g} ms)" if interval else "NVML GPU (start/end)"

    def rows(self, *, subtests: bool = False) -> list[list[str]]:
        """Header plus one row per heaviest test: test, peak, host, a column for each framework
        view some test has (``TF CPU``, ``JAX gpu:0``, ``torch cuda:0``), budget, use, result;
        the processes', NVML's and the GPU budget's columns where they apply. With ``subtests``,
        each test's subtests follow its row, heaviest first, their use and result against the
        test's budget."""
        heaviest = [record for _, _, record in sorted(self._heaviest, key=lambda entry: entry[:2], reverse=True)]
        with_retained = self._retained or (subtests and self._subtest_retained)
        views = self.view_columns()
        # what the host view counts (RSS, phys_footprint, working set): one platform a session
        counts = heaviest[0].measurement.counts if heaviest and heaviest[0].measurement else "RSS"
        titles = [frameworks.column_title(view) or view for view in views]
        header = ["test", "peak", f"host {counts}", *titles, *(["children"] if self._children else []),
                  *([self._nvml_header()] if self._nvml else []), "budget", "use",
                  *(["GPU budget", "GPU use"] if self._gpu_budget else []), *(["retained"] if with_retained else [])]
        rows = [[*header, "result"]]
        for record in heaviest:
            assert record.measurement is not None
            gpu_budget_cells = [format_size(record.gpu_budget), use_percent(record.gpu_need, record.gpu_budget)]
            rows.append(
                _figure_cells(record.nodeid, record.measurement, views, self._nvml, self._children)
                + [format_size(record.budget), use_percent(record.measurement.peak, record.budget)]
                + (gpu_budget_cells if self._gpu_budget else [])
                + ([_retained(record)] if with_retained else [])
                + [result_word(record)]
            )
            if subtests:
                rows += _subtest_rows(record, views, self._nvml, self._gpu_budget, with_retained, self._children)
        return rows


def summary_rows(records: Iterable[TestRecord], top: int, *, subtests: bool = False) -> list[list[str]]:
    """The table of the ``top`` heaviest of ``records`` (``HeaviestTests.rows``)."""
    heaviest = HeaviestTests(top)
    for record in records:
        heaviest.add(record)
    return heaviest.rows(subtests=subtests)


def _figure_cells(name: str, m: Measurement, views: list[str], with_nvml: bool, with_children: bool) -> list[str]:
    """The name, peak, host, each of ``views`` (``-`` where the test has not that view),
    children and NVML cells of a row."""
    readings = [m.view(view) for view in views]
    return [
        name,
        format_size(m.peak),
        format_size(m.host),
        *(format_size(reading.increase) if reading is not None else "-" for reading in readings),
        *([format_size(m.children_peak) if m.children is not None else "-"] if with_children else []),
        *([_nvml(m)] if with_nvml else []),
    ]


def _subtest_rows(
    record: TestRecord, views: list[str], with_nvml: bool, with_gpu_budget: bool, with_retained: bool,
    with_children: bool,
) -> list[list[str]]:
    """A row per subtest of the test, heaviest first: ``  [message] (i=2)`` and its figures."""
    rows = []
    for subtest in sorted(record.subtests, key=lambda s: s.measurement.peak, reverse=True):
        peak = subtest.measurement.peak
        over = record.budget is not None and peak > record.budget
        rows.append(
            _figure_cells(f"  {subtest.description}", subtest.measurement, views, with_nvml, with_children)
            + ["", use_percent(peak, record.budget)]
            + (["", ""] if with_gpu_budget else [])
            + ([_signed(subtest.retained)] if with_retained else [])
            + [f"subtest {subtest.outcome}{', over budget' if over else ''}"]
        )
    return rows


def render_table(rows: list[list[str]]) -> list[str]:
    """Align columns: the first left-aligned, the rest right-aligned."""
    first, *widths = [max(map(len, column)) for column in zip(*rows)]
    return [
        "  ".join([row[0].ljust(first), *map(str.rjust, row[1:], widths)]).rstrip()
        for row in rows
    ]


def section_text(record: TestRecord) -> str:
    """A measured test's ``tfmem`` report section: its row (and its subtests'), the first imports
    left out of its figures, the notes."""
    if record.measurement is None:  # its process died before any figure came back: what tfmem knows
        return "\n".join([*(verdict.message for verdict in record.verdicts), *record.notes])
    rows = render_table(summary_rows([record], 1, subtests=True))
    imports = section_lines(record.measurement.first_imports)
    started = children_lines(record.measurement.children)
    basis = basis_line(record.measurement)
    return "\n".join([*rows, basis, *started, *imports, *record.measurement.notes, *record.notes])


def basis_line(measurement: Measurement) -> str:
    """How the test's host figure was obtained and what it counts (``platforms``)."""
    if measurement.method == EXACT:
        how = "exact: the platform's mark, reset for this test"
    elif measurement.method == EXACT_IF_RAISED:
        how = "exact: the test raised the process's lifetime mark"
    else:
        how = "sampled every millisecond: no mark this test could use"
    return f"host {measurement.counts}: {how}"


# How many of the processes a test started its section names (the largest, and every one that died).
SECTION_CHILDREN = 5


def children_lines(children: ChildrenReading | None) -> list[str]:
    """The processes a test started, for its section: their combined figure and how it was
    obtained, the largest by name, and every one that was killed."""
    if children is None:
        return []
    count = len(children.processes)
    named = children.largest(SECTION_CHILDREN)
    named += [figure for figure in children.processes if figure.died and figure not in named]
    lines = [
        f"{children.named()}: {count}, together {format_size(children.combined)} ({combined_basis(children)})"
        + (f"; the {SECTION_CHILDREN} largest:" if count > len(named) else ":")
    ]
    return lines + [f"  {describe_child(figure)}" for figure in named]


def combined_basis(children: ChildrenReading) -> str:
    """How the processes' combined figure was obtained, in words."""
    if children.combined_basis == "marks summed":
        return (
            "exact marks of processes that ran at once, added: an upper bound; their sizes read every "
            f"{children.interval_s * 1000:g} ms added up to {format_size(children.sampled_sum)} at most: a lower bound"
        )
    if children.combined_basis == "sampled together":
        return f"their sizes read every {children.interval_s * 1000:g} ms, added up at most"
    marks = "high-water mark" if all(figure.exact for figure in children.processes) else "peak as read"
    if len(children.processes) == 1:
        return f"its {marks}"
    return f"the largest {marks}: they ran one at a time"


def describe_child(figure: ChildFigure) -> str:
    """``pid 4242 `python -c ...`: peak 300.0 MiB, exited with 0``; a killed process's last size."""
    how = "running when the test ended" if figure.running else (figure.ended or "ended (reaped elsewhere)")
    basis = "" if figure.exact else " (as last read)"
    last = f", last read at {format_size(figure.last_rss)}" if figure.died else ""
    booked = ""
    if figure.booked:  # what the process booked apart itself: its figure leaves it out
        said = ", ".join(f"{what} {format_size(size)}" for what, size in figure.booked_as)
        booked = f"; booked apart, not counted: {said}"
    if figure.running_before:
        return (f"pid {figure.pid} `{figure.command}`: running before the test, grew {format_size(figure.peak)} "
                f"while it ran (as read every {INTERVAL_S * 1000:g} ms){last}, {how}{booked}")
    return f"pid {figure.pid} `{figure.command}`: peak {format_size(figure.peak)}{basis}{last}, {how}{booked}"
