"""Session reports CI reads: the JSON report (``--tfmem-report``) and the Markdown summary.

The JSON report is a contract; its schema (documented in the README) is::

    {
      "format": "pytest-tfmem-report",
      "version": 1,
      "created": "2026-01-31T12:00:00+00:00",
      "pytest_tfmem": "0.1.0",
      "exitstatus": 1,
      "environment": {"python": "3.11", "tensorflow": "2.21.0", ...},
      "baseline": {"path": "tfmem-baseline.json", "tolerance": "10%+16MB"} or null,
      "summary": {"tests": 3, "passed": 2, "failed": 1, "skipped": 0, "over_budget": 0,
                  "regressions": 1, "improvements": 0, "not_in_baseline": 1},
      "tests": [<TestRecord.to_dict()>, ...],   # sorted by node id
      "session": <SessionAccount.to_dict()> or null   # what the tests left behind (docs/ci.md)
    }
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.core.retained import SessionAccount
from pytest_tfmem.files import FileFormatError, Output, VersionedJson, first_line
from pytest_tfmem.gates.compare import (
    IMPROVEMENT,
    NEW,
    REGRESSION,
    RETAINED,
    Comparison,
    by_test,
    comparisons_from_record,
    overall_status,
)
from pytest_tfmem.units import format_size


class ReportError(FileFormatError):
    """A report file that cannot be used; the message names the file and the problem."""

    what = "report"


FORMAT = VersionedJson(
    "pytest-tfmem-report", 1, how_to_make="write one with pytest --tfmem-report=PATH", error=ReportError
)
MARKDOWN_TITLE = "### pytest-tfmem: memory per test"
MARKDOWN = Output("Markdown summary", first_line(lambda line: line == MARKDOWN_TITLE))


@dataclass
class SessionReport:
    """Every measured test of one session, and what they were compared with."""

    tests: list[TestRecord]  # those read from a file (``load_report``); one written streams them
    environment: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, str] | None = None
    exitstatus: int | None = None
    created: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    version: str | None = None

    def head(self, summary: dict[str, int], account: SessionAccount, columns: list[str]) -> dict[str, Any]:
        """The file's contents but its tests: ``summary`` (``SummaryCounts``) and ``account``
        are of every test; ``columns`` the session table's (``HeaviestTests``: a column for each
        framework view some test has)."""
        return {
            "columns": columns,
            "created": self.created,
            "pytest_tfmem": self.version,
            "exitstatus": self.exitstatus,
            "environment": self.environment,
            "baseline": self.baseline,
            "summary": summary,
            "session": account.to_dict(),
        }


def baseline_status(record: TestRecord) -> str | None:
    """The test's comparison with the baseline (``compare.REGRESSION`` ...), ``None`` if not compared."""
    comparisons = comparisons_from_record(record)
    return overall_status(comparisons) if comparisons else None


class SummaryCounts:
    """The report's ``summary``, counted one record at a time (a reader of ``TfmemManager``)."""

    def __init__(self) -> None:
        self.counts = dict.fromkeys(
            ("tests", "passed", "failed", "skipped", "over_budget", "regressions", "improvements", "not_in_baseline"),
            0,
        )

    def add(self, record: TestRecord) -> None:
        """``tests`` counts the measured tests that were not skipped, as every "measured tests" does."""
        status = baseline_status(record)
        for key, counted in (
            ("tests", record.outcome != "skipped"),
            ("skipped", record.outcome == "skipped"),
            ("passed", record.outcome == "passed"),
            ("failed", record.outcome == "failed"),
            ("over_budget", any(v.check == "budget" for v in record.failed_verdicts)),
            ("regressions", status == REGRESSION),
            ("improvements", status == IMPROVEMENT),
            ("not_in_baseline", status == NEW),
        ):
            self.counts[key] += counted


def summary_counts(records: Iterable[TestRecord]) -> dict[str, int]:
    counts = SummaryCounts()
    for record in records:
        counts.add(record)
    return counts.counts


def write_report(
    report: SessionReport, path: str | Path, by_nodeid: Iterable[TestRecord], summary: dict[str, int],
    account: SessionAccount, columns: list[str],
) -> None:
    """The report, its tests ``by_nodeid`` (in node-id order) each encoded and written as it is
    read (``core.record_store``): the session's records are never in memory at once.
    ``summary``, ``account`` and ``columns`` are of the same tests (``SessionReport.head``);
    ``report.tests`` is not read."""
    head = report.head(summary, account, columns)
    FORMAT.write_streamed(path, head, "tests", (record.to_dict() for record in by_nodeid))


def load_report(path: str | Path) -> SessionReport:
    """Read and validate a JSON report; raises ``ReportError`` naming the file and the problem."""
    data = FORMAT.read(path)
    assert data is not None  # a missing report is an error
    tests = data.get("tests")
    if not isinstance(tests, list):
        raise ReportError(path, '"tests" must be a list of test records')
    records = []
    for index, test in enumerate(tests):
        try:
            records.append(TestRecord.from_dict(test))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            why = f"{type(error).__name__}: {error}"
            raise ReportError(path, f"test #{index + 1} is not a valid test record ({why})") from None
    recorded = data.get("environment")
    environment: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    return SessionReport(
        tests=records,
        environment=environment,
        baseline=data.get("baseline"),
        exitstatus=data.get("exitstatus"),
        created=data.get("created", ""),
        version=data.get("pytest_tfmem"),
    )


# Tables shared by the terminal, the ``tfmem`` command and Markdown.


def comparison_rows(comparisons: Sequence[Comparison]) -> list[list[str]]:
    """Header plus one row per test, in the order its comparisons come: its quantities (``peak;
    retained``), each one's baseline, figure now and change, the tolerance, the test's status."""
    rows = [["test", "what", "baseline", "now", "change", "tolerance", "status"]]
    for nodeid, compared in by_test(comparisons).items():
        own = sorted(compared, key=lambda c: (c.quantity != "peak", c.quantity == RETAINED, c.quantity))
        changes = [_change(c) for c in own]
        rows.append([
            nodeid, "; ".join(c.label for c in own), "; ".join(format_size(c.baseline) for c in own),
            "; ".join(format_size(c.current) for c in own), "; ".join(changes), str(own[0].tolerance),
            overall_status(own),
        ])
    return rows


def _change(comparison: Comparison) -> str:
    """``+172.0 MiB (+26.9%)``; ``-`` without a baseline figure."""
    if comparison.change is None:
        return "-"
    percent = comparison.change_percent
    return format_size(comparison.change, signed=True) + ("" if percent is None else f" ({percent:+.1f}%)")


def statuses_by_test(comparisons: Sequence[Comparison]) -> list[str]:
    """Each test's status, once per test however many of its quantities were compared."""
    return [overall_status(own) for own in by_test(comparisons).values()]


def sort_comparisons(comparisons: Sequence[Comparison]) -> list[Comparison]:
    """Regressions first (largest growth first), then improvements, new tests, the rest."""
    order = {REGRESSION: 0, IMPROVEMENT: 1, NEW: 2}
    return sorted(comparisons, key=lambda c: (order.get(c.status, 3), -(c.change or 0), c.nodeid))


def markdown_table(rows: list[list[str]]) -> list[str]:
    """A GitHub-flavoured Markdown table; the first column left-aligned, the rest right-aligned."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    header, *body = rows
    lines = ["| " + " | ".join(cell(c) for c in header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in body]
    return lines


def counts_sentence(counts: dict[str, int], *, compared: bool) -> str:
    """``3 tests measured: 1 over budget, 1 regression, 0 improvements, 1 not in the baseline``."""
    parts = [f"{counts['over_budget']} over budget"]
    if compared:
        parts += [
            f"{counts['regressions']} regression{'s' if counts['regressions'] != 1 else ''} beyond tolerance",
            f"{counts['improvements']} improvement{'s' if counts['improvements'] != 1 else ''} beyond tolerance",
            f"{counts['not_in_baseline']} not in the baseline",
        ]
    return f"{counts['tests']} test{'s' if counts['tests'] != 1 else ''} measured: " + ", ".join(parts)


def comparison_markdown(comparisons: Sequence[Comparison], *, title: str, notes: Sequence[str] = ()) -> str:
    """Markdown for a PR comment: a status line, notes, the tests that moved beyond tolerance."""
    statuses = statuses_by_test(comparisons)
    moved = sort_comparisons([c for c in comparisons if c.status in (REGRESSION, IMPROVEMENT)])
    lines = [f"### {title}", ""]
    lines.append(
        f"{statuses.count(REGRESSION)} regression(s), {statuses.count(IMPROVEMENT)} improvement(s) beyond "
        f"tolerance, {statuses.count(NEW)} not in the baseline, out of {len(statuses)} compared test(s)."
    )
    lines += [""] + [f"> {note}" for note in notes] + ([""] if notes else [])
    if moved:
        lines += markdown_table(comparison_rows(moved))
    return "\n".join(lines).rstrip() + "\n"


class Comparisons:
    """What the session's comparisons with a baseline come to, gathered one record at a time (a
    reader of ``TfmemManager``): whether any test was compared, the comparisons beyond tolerance
    (regressions, improvements), the tests not in the baseline, and which of ``baseline_tests``
    were measured (what ``not_run_note`` needs: no node id is kept without a baseline)."""

    def __init__(self, baseline_tests: Collection[str] = ()) -> None:
        self.compared = False
        self._moved: list[Comparison] = []
        self.new: set[str] = set()
        self._baseline_tests = baseline_tests
        self.measured: set[str] = set()

    def add(self, record: TestRecord) -> None:
        if record.measurement is not None and record.nodeid in self._baseline_tests:
            self.measured.add(record.nodeid)
        for comparison in comparisons_from_record(record):
            self.compared = True
            if comparison.status in (REGRESSION, IMPROVEMENT):
                self._moved.append(comparison)
            elif comparison.status == NEW:
                self.new.add(comparison.nodeid)

    @property
    def moved(self) -> list[Comparison]:
        """The comparisons beyond tolerance, sorted (``sort_comparisons``)."""
        return sort_comparisons(self._moved)


def session_markdown(
    counts: dict[str, int], comparisons: Comparisons, heaviest: list[list[str]], *, top: int,
    notes: Sequence[str] = (), history: Sequence[str] = (),
) -> str:
    """The step summary of a pytest session: counts (``SummaryCounts``), moved tests, the tests
    that moved in the memory history (``history``: its lines), the heaviest tests (``heaviest``:
    the table's rows, ``HeaviestTests.rows`` of the ``top``)."""
    moved = comparisons.moved
    lines = [MARKDOWN_TITLE, "", counts_sentence(counts, compared=comparisons.compared) + ".", ""]
    lines += [f"> {note}" for note in notes] + ([""] if notes else [])
    if moved:
        lines += ["Beyond tolerance of the baseline:", "", *markdown_table(comparison_rows(moved)), ""]
    lines += history
    if counts["tests"]:
        lines += [f"Heaviest {min(top, counts['tests'])}:", "", *markdown_table(heaviest)]
    return "\n".join(lines).rstrip() + "\n"
