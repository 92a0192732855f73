"""What tfmem keeps per test: records on disk once complete, nothing of them on pytest's reports
and items, a short journal line for a test within every limit, the table from a bounded heap."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree

import pytest

from pytest_tfmem.core.measure import Measurement, ViewReading
from pytest_tfmem.core.record import PROPERTY, TestRecord, publish, published_record
from pytest_tfmem.core.record_store import RecordStore
from pytest_tfmem.core.summary import summary_rows
from pytest_tfmem.core.verdict import Verdict

pytestmark = pytest.mark.any_os


def record(nodeid: str, peak: int = 1000, outcome: str = "passed", reruns: int = 0) -> TestRecord:
    measurement = Measurement(views=(ViewReading("host", 0, peak, 0),), duration_s=0.01, method="exact")
    made = TestRecord(nodeid, measurement, reruns=reruns)
    made.outcome = outcome
    return made


def test_a_record_stays_in_memory_until_its_teardown_then_is_read_back_from_disk():
    store = RecordStore()
    first, second = record("t::a", 10), record("t::b", 20)
    store.add(first)
    store.add(second)
    assert store.open_record("t::a") is first and len(store) == 2
    store.close("t::a")
    assert store.open_record("t::a") is None
    read = list(store)
    # the written one first (read back: an equal, new object), then the one still open
    assert [r.nodeid for r in read] == ["t::a", "t::b"] and read[0] is not first and read[1] is second
    assert read[0].to_dict() == first.to_dict()
    store.close("t::b")
    assert [r.to_dict() for r in store] == [first.to_dict(), second.to_dict()]  # each pass reads the file again
    # a record written while a pass reads the file lands after the others, and the pass goes on where it was
    passing = iter(store)
    assert next(passing).nodeid == "t::a"
    store.add(record("t::c", 30))
    store.close("t::c")
    assert [r.nodeid for r in passing] == ["t::b"]  # the pass reads what was written when it began
    assert [r.nodeid for r in store] == ["t::a", "t::b", "t::c"]
    store.remove()


def test_a_later_attempt_replaces_those_it_counts_and_a_retried_one():
    store = RecordStore()
    for attempt, outcome in enumerate(["rerun", "rerun"]):
        store.add(record("t::flaky", 100 * (attempt + 1), outcome=outcome, reruns=attempt))
        store.close("t::flaky")
    store.add(record("t::other"))
    store.close("t::other")
    last = record("t::flaky", 300, reruns=2)
    store.add(last)
    store.close("t::flaky")
    assert [(r.nodeid, r.reruns, r.measurement.peak) for r in store] == [("t::other", 0, 1000), ("t::flaky", 2, 300)]
    assert len(store) == 2
    # a second record of a test that no attempt counts and that was not retried is kept beside it
    store.add(record("t::other", 5))
    assert [r.nodeid for r in store].count("t::other") == 2 and len(store) == 3
    # in node-id order, read from disk one at a time: the order sorted() gives what __iter__ yields
    store.add(record("t::a", 7))  # still awaiting its teardown report
    expected = [(r.nodeid, r.measurement.peak) for r in sorted(store, key=lambda r: r.nodeid)]
    assert [(r.nodeid, r.measurement.peak) for r in store.by_nodeid()] == expected
    assert expected == [("t::a", 7), ("t::flaky", 300), ("t::other", 1000), ("t::other", 5)], expected
    store.remove()


def test_a_record_read_back_in_the_process_that_published_it_is_the_decoded_one_and_its_own_copy():
    holder = pytest.TestReport("t::a", ("t.py", 0, "a"), {}, "passed", None, "call", [], user_properties=[])
    published = record("t::a", 10)
    published.notes.append("first")
    publish(holder, published)
    published.notes.append("added after")  # not published: not what the report carries
    decoded = TestRecord.from_dict(json.loads(dict(holder.user_properties)[PROPERTY]))
    read = published_record(holder)
    assert read is not None and read == decoded and read.notes == ["first"]
    read.notes.append("a reader's own")
    again = published_record(holder)
    assert again == decoded and again is not read  # each reader gets a copy to change
    published.verdicts.append(Verdict("budget", False, "over"))
    publish(holder, published)  # published again: the report carries the new record
    assert published_record(holder) == published and len(holder.user_properties) == 3  # record, peak, host


def test_the_table_keeps_the_heaviest_in_order_and_ties_in_arrival_order():
    records = [record(f"t::{name}", peak) for name, peak in [("a", 5), ("b", 9), ("c", 5), ("d", 1), ("e", 9)]]
    names = [row[0] for row in summary_rows(iter(records), 3)[1:]]
    assert names == ["t::b", "t::e", "t::a"]
    assert [row[0] for row in summary_rows(records, 10)[1:]] == ["t::b", "t::e", "t::a", "t::c", "t::d"]
    assert summary_rows(records, 0) == summary_rows([], 0)[:1]  # the header alone


TESTS = """
import pytest

@pytest.mark.parametrize("index", range(60))
def test_passes(index):
    pass

def test_over():
    blob = bytearray(48 * 2**20)
    blob[::4096] = b"x" * len(blob[::4096])
"""

# What the session holds once its tests are over, before the summaries read the records back.
HELD = """
import gc, json, pytest
from pytest_tfmem.core.record import TestRecord

@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    reports = [r for kept in reporter.stats.values() for r in kept if hasattr(r, "user_properties")]
    on_reports = sum(name == "tfmem" for r in reports for name, _ in r.user_properties)
    on_items = sum(name == "tfmem" for item in session.items for name, _ in item.user_properties)
    alive = sum(isinstance(o, TestRecord) for o in gc.get_objects())
    flat = sum(name == "tfmem_peak_bytes" for r in reports for name, _ in r.user_properties)
    sections = {outcome: sum(title == "tfmem" for r in reports if r.outcome == outcome for title, _ in r.sections)
                for outcome in ("passed", "failed")}
    with open("held.json", "w") as held:
        json.dump([len(reports), on_reports, on_items, alive, flat, sections], held)
"""


@pytest.mark.parametrize("shown", ["-rP", "-rA"])
def test_a_passed_tests_section_stays_where_the_terminal_shows_passes(pytester, shown):
    pytester.makeconftest(HELD)
    pytester.makepyfile(test_many=TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfmem-budget=30MB", "--tfmem-trace=off", shown)
    result.assert_outcomes(passed=60, failed=1)
    assert json.loads((pytester.path / "held.json").read_text())[-1] == {"passed": 60, "failed": 1}
    result.stdout.fnmatch_lines(["*= PASSES =*", "*_ test_passes[[]0[]] _*", "*- tfmem -*", "test *",
                                 "test_many.py::test_passes[[]0[]] * 0%", "host RSS: exact: *"])


def test_a_session_keeps_no_record_in_memory_and_none_on_pytests_reports_yet_its_outputs_have_them(pytester):
    pytester.makeconftest(HELD)
    pytester.makepyfile(test_many=TESTS)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfmem-budget=30MB", "--tfmem-trace=off",
                                f"--junitxml={junit}", "--tfmem-report=report.json")
    result.assert_outcomes(passed=60, failed=1)
    held = json.loads((pytester.path / "held.json").read_text())
    reports, on_reports, on_items, alive, flat, sections = held
    assert reports == 3 * 61 and on_reports == 0 and on_items == 0
    # a passed test's tfmem section is taken off once logged (JUnit XML read it), as -rP is not
    # given; the failed one keeps it for the failure's summary
    assert sections == {"passed": 0, "failed": 1}
    result.stdout.fnmatch_lines(["*_ test_over _*", "*- tfmem -*", "test *", "test_many.py::test_over *over budget"])
    # Every record is on disk once its test is over; writing the JSON report made the one pass
    # over them that feeds the summaries, and the table's reader keeps its ten heaviest (of 61).
    assert alive == 10, alive
    assert flat == 2 * 61  # the flat figures stay on the call and teardown reports
    # JUnit XML got the figures a CI reader needs as each test was logged (well under 300 bytes a
    # test), and the JSON report read the whole records back from disk
    properties = {
        case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
        for case in ElementTree.parse(junit).iter("testcase")
    }
    for case in ElementTree.parse(junit).iter("testcase"):
        written = ElementTree.tostring(case.find("properties"), encoding="unicode")
        assert len(written.encode()) <= 300, written
    text = (pytester.path / "report.json").read_text()
    # written a test at a time, yet the bytes json.dumps gives the whole, its tests in node-id order
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    nodeids = [test["nodeid"] for test in json.loads(text)["tests"]]
    assert nodeids == sorted(nodeids) and json.loads(text)["summary"]["tests"] == 61
    # the table's columns: no framework was loaded, so no framework's column
    assert json.loads(text)["columns"] == ["test", "peak", "host RSS", "budget", "use", "retained", "result"]
    report = {test["nodeid"].split("::")[-1]: test for test in json.loads(text)["tests"]}
    assert len(properties) == len(report) == 61
    for name, test in report.items():
        assert PROPERTY not in properties[name] and "tfmem_host_bytes" not in properties[name]
        assert int(properties[name]["tfmem_peak_bytes"]) == test["measurement"]["peak"], name
        assert int(properties[name]["tfmem_retained_bytes"]) == test["retained_bytes"], name
        assert int(properties[name]["tfmem_budget_bytes"]) == test["budget"] == 30 * 10**6
        assert properties[name]["tfmem_verdict"] == ("failed: budget" if name == "test_over" else "ok"), name
    # the table, read back from disk: the heaviest first
    result.stdout.fnmatch_lines(["*peak memory need per test (heaviest first)*", "test  *", "test_many.py::test_over *over budget"])


def test_the_journal_gives_a_test_within_every_limit_a_short_line_and_a_failure_its_record(pytester):
    pytester.makepyfile(TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfmem-budget=30MB", "--tfmem-trace=off")
    result.assert_outcomes(passed=60, failed=1)
    lines = (pytester.path / ".tfmem" / "results.jsonl").read_text().splitlines()
    finished = {entry["nodeid"].split("::")[-1]: entry for entry in map(json.loads, lines) if entry["event"] == "finish"}
    short = finished["test_passes[7]"]
    assert set(short) == {"session", "time", "event", "worker", "nodeid", "outcome", "duration_s", "sampled_peak",
                          "peak"} and short["peak"] >= 0
    over = finished["test_over"]
    assert over["record"]["measurement"]["peak"] >= 40 * 2**20 and over["message"].startswith("tfmem: peak")
    passing = [len(line) for line in lines if '"passed"' in line]
    assert max(passing) < 400, max(passing)
    # tfmem last still tells both
    last = pytester.run(sys.executable, "-m", "pytest_tfmem.cli.main", "last")  # this interpreter's, not PATH's
    last.stdout.fnmatch_lines(["*passed*test_passes?59?  peak *", "*failed*test_over  peak 4?.? MiB*tfmem: peak*"])
