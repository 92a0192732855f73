"""A pytest plugin for the tests' inner sessions (``-p records_dump``): each test's tfmem record,
as its call and teardown reports carry it, written to ``tfmem-records.jsonl`` in the working
directory, one line a report, so that a test can read what an inner session measured in
another process. The JUnit XML carries only the figures a CI reader needs."""

from __future__ import annotations

import json

import pytest

from pytest_tfmem.core.record import record_from_report

PATH = "tfmem-records.jsonl"


@pytest.hookimpl(tryfirst=True)  # before tfmem takes the record off the report
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    record = record_from_report(report) if report.when in ("call", "teardown") else None
    if record is not None:
        with open(PATH, "a") as lines:
            lines.write(json.dumps({"when": report.when, "outcome": report.outcome, "record": record.to_dict()}) + "\n")
