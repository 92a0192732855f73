"""One test's memory record, and how it travels on the test report.

The record rides on ``report.user_properties`` as ``("tfmem", <JSON>)``, next to flat
numeric properties (``tfmem_peak_bytes`` ...) that JUnit XML files show. Reports reach the
controller under pytest-xdist unchanged, so the controller builds summaries and reports
from reports alone, without files or shared state. Once every plugin has logged a report, the
record is taken off it (``unpublish``): pytest keeps the reports to the session's end.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_tfmem.core.attempts import attempts_before
from pytest_tfmem.core.confirm import Confirmation, OneTimeCost
from pytest_tfmem.core.measure import Measurement
from pytest_tfmem.core.retained import Retained, SessionAccount
from pytest_tfmem.core.subtests import SubtestFigure, subtest_description
from pytest_tfmem.core.verdict import Verdict
from pytest_tfmem.errors import CHECK_BY_FAILURE

PROPERTY = "tfmem"
PEAK_PROPERTY = "tfmem_peak_bytes"  # flat figures, beside the record: JUnit XML shows them
BUDGET_PROPERTY = "tfmem_budget_bytes"
GPU_BUDGET_PROPERTY = "tfmem_gpu_budget_bytes"
RETAINED_PROPERTY = "tfmem_retained_bytes"
VERDICT_PROPERTY = "tfmem_verdict"  # in JUnit XML: ``ok``, or the checks it failed (``failed: budget``)


@dataclass
class TestRecord:
    """What tfmem knows about one test: measurement, budget, verdicts, feature sections."""

    __test__ = False  # not a pytest test class

    nodeid: str
    measurement: Measurement | None
    budget: int | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # sections added by features
    outcome: str | None = None  # filled in from the report
    notes: list[str] = field(default_factory=list)  # shown under the test's tfmem section
    gpu_budget: int | None = None  # the GPU budget the test was held to, where one applied
    subtests: list[SubtestFigure] = field(default_factory=list)  # in the order they ran
    reruns: int = 0  # pytest-rerunfailures: attempts before the one this record is of
    retained: Retained | None = None  # what it left behind, once its teardown is over
    # The class of the exception that ended the call phase, where one did (``ValueError``, or a
    # tfmem check's failure raised in the body: ``LeakDetected``).
    raised: str | None = None
    # The re-run that confirmed or overturned its first verdict (``core.confirm``), where one ran.
    confirmation: Confirmation | None = None
    # Why its figure, which departed from its recorded level, is kept unconfirmed (``core.confirm``:
    # the re-run was refused or raised); the history marks it and a baseline save keeps the old entry.
    unconfirmed: str = ""

    @property
    def gpu_need(self) -> int | None:
        """The figure a GPU budget is checked against: the largest GPU view's increase."""
        views = self.measurement.gpu_views() if self.measurement else ()
        return max(v.increase for v in views) if views else None

    @property
    def failed_verdicts(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.ok]

    @property
    def failed_checks(self) -> list[str]:
        """The tfmem checks it failed: its failed verdicts', and the one a failure raised in its body names."""
        checks = [verdict.check for verdict in self.failed_verdicts]
        if self.raised is not None and self.raised in CHECK_BY_FAILURE:
            checks.append(CHECK_BY_FAILURE[self.raised])
        return list(dict.fromkeys(checks))

    @property
    def measured_to_the_end(self) -> bool:
        """Its figures are of a whole run: it passed, or it failed only tfmem's checks (a run cut
        short by another exception, a skip or an interrupt says little about memory)."""
        if self.measurement is None or (self.raised is not None and self.raised not in CHECK_BY_FAILURE):
            return False
        return self.outcome == "passed" or (self.outcome == "failed" and bool(self.failed_checks))

    def to_dict(self) -> dict[str, Any]:
        retained: dict[str, Any] = {}
        if self.retained is not None:
            retained = {
                "retained_bytes": self.retained.bytes,
                "retained_host_bytes": self.retained.host_bytes,
                "retained_tf_bytes": self.retained.tf_bytes,
                "retained": self.retained.to_dict(),
            }
        return {
            "nodeid": self.nodeid,
            "outcome": self.outcome,
            "measurement": self.measurement.to_dict() if self.measurement else None,
            "budget": self.budget,
            "verdicts": [vars(v) for v in self.verdicts],
            "extra": self.extra,
            "notes": self.notes,
            "gpu_budget": self.gpu_budget,
            "subtests": [subtest.to_dict() for subtest in self.subtests],
            "reruns": self.reruns,
            "raised": self.raised,
            "confirmation": self.confirmation.to_dict() if self.confirmation is not None else None,
            "unconfirmed": self.unconfirmed,
            **retained,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TestRecord:
        measurement = data.get("measurement")
        return cls(
            nodeid=data["nodeid"],
            measurement=Measurement.from_dict(measurement) if measurement else None,
            budget=data.get("budget"),
            verdicts=[Verdict(**v) for v in data.get("verdicts", [])],
            extra=data.get("extra", {}),
            outcome=data.get("outcome"),
            notes=list(data.get("notes", [])),
            gpu_budget=data.get("gpu_budget"),
            subtests=[SubtestFigure.from_dict(subtest) for subtest in data.get("subtests", [])],
            reruns=data.get("reruns", 0),
            retained=Retained.from_dict(data["retained"]) if data.get("retained") else None,
            raised=data.get("raised"),
            confirmation=Confirmation.from_dict(data["confirmation"]) if data.get("confirmation") else None,
            unconfirmed=str(data.get("unconfirmed") or ""),
        )

    def user_properties(self) -> list[tuple[str, object]]:
        properties: list[tuple[str, object]] = [(PROPERTY, json.dumps(self.to_dict(), sort_keys=True))]
        if self.measurement is not None:
            properties.append((PEAK_PROPERTY, self.measurement.peak))
            properties += [(_view_property(view.view), view.increase) for view in self.measurement.views]
        if self.budget is not None:  # a plain int: pytest-xdist sends only the types it knows (not a ``units.Size``)
            properties.append((BUDGET_PROPERTY, int(self.budget)))
        if self.gpu_budget is not None:
            properties.append((GPU_BUDGET_PROPERTY, int(self.gpu_budget)))
        if self.retained is not None:
            properties.append((RETAINED_PROPERTY, self.retained.bytes))
        return properties


# The records this process published last, by the JSON they went out as. A report read back in
# the process that made it (its call and teardown reports, by the manager, the journal and
# pytest-html) gives a copy of its record without decoding that JSON again; a report from another
# process (a pytest-xdist worker's, an isolated test's child's) is decoded.
_RECENTLY_PUBLISHED = 8
_published: dict[str, TestRecord] = {}


def _copy(record: TestRecord) -> TestRecord:
    """A record whose lists and sections can change without changing ``record`` (what else it
    holds is immutable: the measurement, verdicts, retained figures)."""
    return dataclasses.replace(
        record, verdicts=list(record.verdicts), extra=dict(record.extra), notes=list(record.notes),
        subtests=list(record.subtests),
    )


def publish(holder: pytest.Item | pytest.TestReport, record: TestRecord) -> None:
    """Put the record on ``holder``'s properties: an item's (the reports made from it carry
    them) or a report's. The one way to update a record after the fact: change it, publish it
    again, and its earlier properties are replaced where they stand."""
    fresh = dict(record.user_properties())
    _published[str(fresh[PROPERTY])] = _copy(record)  # as it is now: a later change is published again
    while len(_published) > _RECENTLY_PUBLISHED:
        del _published[next(iter(_published))]
    properties = []
    for kept in holder.user_properties:
        name, value = kept
        if name in fresh and fresh[name] != value:
            properties.append((name, fresh.pop(name)))
        else:  # an unchanged property keeps its tuple: pytest keeps every report's to the end
            fresh.pop(name, None)
            properties.append(kept)
    holder.user_properties[:] = [*properties, *fresh.items()]


def unpublish(holder: pytest.Item | pytest.TestReport) -> None:
    """Take the record off ``holder`` once every plugin has read it (the call and teardown
    reports, the item after its teardown report): pytest keeps every report and item to the
    session's end, and the record is kept on disk (``core.record_store``). The flat figures stay."""
    if isinstance(holder, pytest.TestReport):  # logged: the item holds no more than its last report
        _slimmed.pop(id(holder), None)
        for name, value in holder.user_properties:
            if name == PROPERTY and isinstance(value, str):
                _published.pop(value, None)
    holder.user_properties[:] = [kept for kept in holder.user_properties if kept[0] != PROPERTY]


def published_record(holder: pytest.Item | pytest.TestReport) -> TestRecord | None:
    """The record ``publish`` put on ``holder`` (or that ``slim_for_junit`` took off it), or ``None``."""
    for name, value in holder.user_properties:
        if name == PROPERTY and isinstance(value, str):
            known = _published.get(value)
            return _copy(known) if known is not None else TestRecord.from_dict(json.loads(value))
    slimmed = _slimmed.get(id(holder))
    return _copy(slimmed[1]) if slimmed is not None and slimmed[0] is holder else None


# Reports whose properties ``slim_for_junit`` cut, with their records, until ``unpublish``: by id,
# with the report to tell a reused id apart.
_slimmed: dict[int, tuple[pytest.TestReport, TestRecord]] = {}


def slim_for_junit(report: pytest.TestReport) -> None:
    """Leave on a teardown report, which pytest's JUnit XML writer reads, only the figures a CI
    reader needs (the flat peak, budgets, retained and isolated figures: the record and each view's
    figure go) and the verdict, well under 300 bytes a test; the whole record stays readable in
    this process (``published_record``) until the report is logged."""
    record = published_record(report)
    if record is None:
        return
    _slimmed[id(report)] = (report, record)
    failed = record.failed_checks
    verdict = f"failed: {', '.join(failed)}" if failed else "ok"
    views = {_view_property(view.view) for view in record.measurement.views} if record.measurement else set()
    for name, value in report.user_properties:
        if name == PROPERTY and isinstance(value, str):  # held here now, no longer by its JSON
            _published.pop(value, None)
    kept = [(name, value) for name, value in report.user_properties if name != PROPERTY and name not in views]
    report.user_properties[:] = [*kept, (VERDICT_PROPERTY, verdict)]


def _view_property(view: str) -> str:
    """``tfmem_tf_CPU_0_bytes``: a view's flat figure (one string a session)."""
    return sys.intern(f"tfmem_{view.replace(':', '_')}_bytes")


def record_from_report(report: pytest.TestReport) -> TestRecord | None:
    """The record a report carries, with the report's outcome and how many attempts came
    before it (pytest-rerunfailures), or ``None``. A subtest's report carries none: its figure
    is in its test's record (and it may carry an earlier attempt's record, made from the item)."""
    record = published_record(report) if subtest_description(report) is None else None
    if record is not None:
        record.outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
        record.reruns = attempts_before(report)
    return record


class RetainedFigures:
    """The session's books (``SessionAccount``), fed one record at a time (``TfmemManager.reader``)."""

    def __init__(self) -> None:
        self.books = SessionAccount()

    def add(self, record: TestRecord) -> None:
        if record.retained is not None:
            self.books.add(record.nodeid, record.retained, skipped=record.outcome == "skipped")
        if record.confirmation is not None:
            worker = record.retained.worker if record.retained is not None else None
            self.books.one_time.add(OneTimeCost(record.nodeid, worker, record.confirmation))

    def account(self) -> SessionAccount:
        return self.books


def session_account(records: Iterable[TestRecord]) -> SessionAccount:
    """The session's books, from the records that carry a retained figure."""
    figures = RetainedFigures()
    for record in records:
        figures.add(record)
    return figures.account()
