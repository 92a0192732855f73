"""pytest-html's report, with tfmem's figures: the results table gets peak, budget and use
columns and a column for each framework view some test had (``TF CPU``, ``JAX gpu:0``, as the
terminal table), and each measured test's details a tfmem block (verdicts, views, notes, and the
report sections tfmem wrote, such as the trace path).

Everything comes from the ``TestRecord`` each report carries (the table's cells, from the flat
figures beside it), so it works under pytest-xdist (the controller writes the HTML report from
the workers' reports). Nothing is registered unless
pytest-html writes a report in this process (``--html=PATH``), and the columns are added only
where every test is measured (a tfmem option or ini value is set): a session that does not use
tfmem keeps pytest-html's table as it is, and a test measured for its marker alone has its block.
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

import pytest

from pytest_tfmem import frameworks
from pytest_tfmem.core import manager as core, processes
from pytest_tfmem.core.record import BUDGET_PROPERTY, PEAK_PROPERTY, TestRecord, record_from_report
from pytest_tfmem.core.summary import HeaviestTests, use_percent
from pytest_tfmem.core.verdict import view_label
from pytest_tfmem.units import format_size

COLUMNS = (("tfmem_peak", "Peak memory"), ("tfmem_budget", "Budget"), ("tfmem_use", "Use"))
NO_VALUES = ("-", "-", "-")  # a test not measured
# The results table's own columns end with pytest-html's links: ours go before them.
_BEFORE_LINKS = -1
_PEAK_CELL = f'class="col-{COLUMNS[0][0]}"'  # the framework views' columns follow the peak's
_PEAK_HEADER = f'class="{COLUMNS[0][0]}"'


def pytest_configure(config: pytest.Config) -> None:
    writes_html = config.getoption("htmlpath", None)  # pytest-html's --html; absent without pytest-html
    if writes_html and processes.role(config).writes_session_outputs:
        config.pluginmanager.register(HtmlReport(config), "tfmem-html")


class HtmlReport:
    """pytest-html's hooks: each is called by pytest-html alone, hence ``optionalhook``."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.columns = False  # decided with the table's header, at the session's start

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        self.columns = core.manager(self.config).measure_all
        if self.columns:
            header = [f'<th class="{name}">{escape(title)}</th>' for name, title in COLUMNS]
            cells[_BEFORE_LINKS:_BEFORE_LINKS] = header

    @pytest.hookimpl(optionalhook=True)
    def pytest_html_results_table_row(self, report: pytest.TestReport, cells: list[str]) -> None:
        if not self.columns:
            return
        # pytest-html makes a test's rows once its teardown is logged: the record is off its
        # reports by then (``core.record.unpublish``), and the flat figures read the same
        properties = dict(report.user_properties)
        peak, budget = properties.get(PEAK_PROPERTY), properties.get(BUDGET_PROPERTY)
        values = NO_VALUES
        if isinstance(peak, int):
            budget = budget if isinstance(budget, int) else None
            values = (format_size(peak), format_size(budget), use_percent(peak, budget))
        row = [f'<td class="col-{name}">{escape(value)}</td>' for (name, _), value in zip(COLUMNS, values)]
        cells[_BEFORE_LINKS:_BEFORE_LINKS] = row

    @pytest.hookimpl(tryfirst=True)  # before pytest-html's own (trylast) writes the file
    def pytest_sessionfinish(self) -> None:
        """A column for each framework view some test had, after the peak's. pytest-html fixes its
        header at the session's start, before any test ran: the columns go into the header and
        the rows it keeps once every record is in."""
        if not self.columns:
            return
        tfmem = core.manager(self.config)
        views = tfmem.reader(HeaviestTests).view_columns()
        table = results_table(self.config)
        if not views or table is None:
            return
        header, tests = table
        titles = [f'<th class="tfmem_view">{escape(frameworks.column_title(view) or view)}</th>' for view in views]
        _put_after_peak(header, _PEAK_HEADER, titles, replace=False)
        not_measured = view_cells(None, views)
        for rows in tests.values():
            for row in rows:
                _put_after_peak(row["resultsTableRow"], _PEAK_CELL, not_measured, replace=False)
        for record in tfmem.records:  # read back from disk one at a time (``core.record_store``)
            call = f'<td class="col-testId">{record.nodeid}</td>'  # its call's row (pytest-html's markup)
            for row in tests.get(record.nodeid, ()):
                if call in row["resultsTableRow"]:
                    _put_after_peak(row["resultsTableRow"], _PEAK_CELL, view_cells(record, views), replace=True)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Before pytest-html's own (``trylast``) reads the report: the tfmem block as an extra."""
        record = record_from_report(report) if report.when == "call" else None
        if record is None or record.measurement is None:
            return
        from pytest_html import extras  # importable: --html is pytest-html's option

        sections = [(title, text) for title, text in report.sections if title.startswith("tfmem ")]
        block = extras.html(details_html(record, sections))
        report.extras = [*getattr(report, "extras", []), block]  # type: ignore[attr-defined]  # pytest-html's


def results_table(config: pytest.Config) -> tuple[list[str], dict[str, list[dict[str, Any]]]] | None:
    """pytest-html 4's header cells and its rows by node id, each a dict whose ``resultsTableRow``
    holds the row's cells: its ``ReportData``, rendered when its ``pytest_sessionfinish`` writes
    the file. ``None`` where a pytest-html keeps them otherwise (its table keeps our three columns)."""
    from pytest_html.basereport import BaseReport  # importable: --html is pytest-html's option

    for plugin in config.pluginmanager.get_plugins():
        if isinstance(plugin, BaseReport):
            data = getattr(plugin, "_report", None)
            header, tests = getattr(data, "table_header", None), getattr(data, "data", {}).get("tests")
            if isinstance(header, list) and isinstance(tests, dict):
                return header, tests
    return None


def view_cells(record: TestRecord | None, views: list[str]) -> list[str]:
    """A row's cell for each framework view: the test's increase in it, as the terminal table
    writes it, or ``-`` (not measured, or no such view)."""
    measurement = record.measurement if record is not None else None
    readings = [measurement.view(view) if measurement is not None else None for view in views]
    return [
        f'<td class="col-{view_class(view)}">{format_size(reading.increase) if reading else "-"}</td>'
        for view, reading in zip(views, readings)
    ]


def view_class(view: str) -> str:
    """``tf:CPU:0`` -> ``tfmem_view_tf_CPU_0``: the class of its column's cells."""
    return "tfmem_view_" + re.sub(r"\W", "_", view)


def _put_after_peak(cells: list[str], peak: str, added: list[str], *, replace: bool) -> None:
    """Insert ``added`` after the peak's cell of ``cells`` (or, with ``replace``, put them in
    place of as many cells there); cells without ours are left as they are."""
    at = next((index + 1 for index, cell in enumerate(cells) if peak in cell), None)
    if at is not None:
        cells[at : at + len(added) if replace else at] = added


def table_values(record: TestRecord) -> tuple[str, str, str]:
    """Peak, budget and use, as the terminal table writes them."""
    peak = record.measurement.peak if record.measurement is not None else None
    return format_size(peak), format_size(record.budget), use_percent(peak, record.budget)


def details_html(record: TestRecord, sections: list[tuple[str, str]]) -> str:
    """The test's tfmem block: verdicts, a table of its views, its notes, tfmem's other sections."""
    assert record.measurement is not None
    peak, budget, use = table_values(record)
    lines = [
        '<div class="tfmem">',
        f"<p><b>tfmem</b>: peak {escape(peak)}, budget {escape(budget)}, use {escape(use)}</p>",
        "<ul>",
        *(f"<li>{escape(v.check)}: {'ok' if v.ok else 'FAILED'}: {escape(v.message)}</li>" for v in record.verdicts),
        "</ul>",
        "<table><tr><th>view</th><th>start</th><th>peak</th><th>end</th><th>increase</th></tr>",
    ]
    for view in record.measurement.views:
        figures = [view_label(view.view), *map(format_size, (view.start, view.peak, view.end, view.increase))]
        lines.append("<tr>" + "".join(f"<td>{escape(figure)}</td>" for figure in figures) + "</tr>")
    lines.append("</table>")
    notes = [*record.measurement.notes, *record.notes]
    lines += [f"<p>{escape(note)}</p>" for note in notes]
    lines += [f"<p><b>{escape(title)}</b></p><pre>{escape(text)}</pre>" for title, text in sections]
    lines.append("</div>")
    return "\n".join(lines)
