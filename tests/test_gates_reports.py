"""Reports CI reads (JSON, JUnit XML, Markdown) and the same gates under pytest-xdist."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from gates_helpers import MB, load, outcomes, run, write_suite

from pytest_tfmem.baseline import load_baseline

SUITE = {"grow": 80, "steady": 60, "other": 40}
NODEIDS = {f"test_suite.py::test_{name}" for name in [*SUITE, "over_budget"]}
OVER_BUDGET = {"over_budget": "@pytest.mark.tfmem(budget='10MB')"}


@pytest.fixture(autouse=True)
def no_step_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def gate_run(pytester: pytest.Pytester, *workers: str, junit: str = "junit.xml") -> tuple[pytest.RunResult, dict]:
    """Save a baseline, grow ``test_grow`` by half, compare at 10%: the whole gate, once."""
    write_suite(pytester, {**SUITE, "over_budget": 30}, OVER_BUDGET)
    run(pytester, *workers, "--tfmem-save-baseline=base.json", fresh_process=True).assert_outcomes(passed=3, failed=1)
    write_suite(pytester, {**SUITE, "grow": 120, "over_budget": 30}, OVER_BUDGET)
    result = run(
        pytester,
        *workers,
        "--tfmem-baseline=base.json",
        "--tfmem-tolerance=10%",
        "--tfmem-report=report.json",
        f"--junitxml={junit}",
        fresh_process=True,
    )
    return result, load(pytester.path / "report.json")


def test_json_report_follows_the_documented_schema(pytester):
    result, report = gate_run(pytester)
    result.assert_outcomes(passed=2, failed=2)
    assert report["format"] == "pytest-tfmem-report" and report["version"] == 1
    assert report["exitstatus"] == 1
    assert report["baseline"] == {"path": str(pytester.path / "base.json"), "tolerance": "10%"}
    assert report["environment"]["python"] and "platform" in report["environment"]
    assert report["summary"] == {
        "tests": 4, "passed": 2, "failed": 2, "over_budget": 1,
        "regressions": 1, "improvements": 0, "not_in_baseline": 1,
    }  # fmt: skip
    assert [t["nodeid"] for t in report["tests"]] == sorted(NODEIDS)
    tests = {t["nodeid"]: t for t in report["tests"]}
    grow = tests["test_suite.py::test_grow"]
    assert grow["outcome"] == "failed"
    assert 118 * MB < grow["measurement"]["peak"] < 124 * MB
    assert grow["extra"]["baseline"]["status"] == "regression"
    figures = grow["extra"]["baseline"]["quantities"]["peak"]
    assert figures["current"] == grow["measurement"]["peak"]
    assert 1.4 < figures["current"] / figures["baseline"] < 1.6
    assert [v["check"] for v in grow["verdicts"] if not v["ok"]] == ["baseline"]
    assert tests["test_suite.py::test_over_budget"]["budget"] == 10 * MB


def test_junit_xml_has_each_tests_peak_properties(pytester):
    _, report = gate_run(pytester)
    peaks = {t["nodeid"].split("::")[1]: t["measurement"]["peak"] for t in report["tests"]}
    cases = {case.get("name"): case for case in ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")}
    assert set(cases) == set(peaks)
    for name, case in cases.items():
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert int(properties["tfmem_peak_bytes"]) == peaks[name]
        assert int(properties["tfmem_host_bytes"]) == peaks[name]  # numpy only: the host view is the peak
    assert int(cases["test_grow"].find("properties/property[@name='tfmem_peak_bytes']").get("value")) > 118 * MB
    budget = cases["test_over_budget"].find("properties/property[@name='tfmem_budget_bytes']")
    assert int(budget.get("value")) == 10 * MB


def test_xdist_gives_one_report_with_every_test_and_the_same_verdicts(pytester):
    serial_result, serial = gate_run(pytester)
    parallel_result, parallel = gate_run(pytester, "-n", "2", junit="junit-xdist.xml")
    parallel_result.stdout.fnmatch_lines(["*2 workers*"])
    parallel_result.assert_outcomes(passed=2, failed=2)
    assert outcomes(parallel) == outcomes(serial) == {
        "test_suite.py::test_grow": "failed",
        "test_suite.py::test_over_budget": "failed",
        "test_suite.py::test_steady": "passed",
        "test_suite.py::test_other": "passed",
    }
    assert parallel["summary"] == serial["summary"]
    for result in (serial_result, parallel_result):  # the order of failures differs under xdist
        result.stdout.fnmatch_lines(["*test_grow - pytest_tfmem.errors.MemoryRegression*"])
        result.stdout.fnmatch_lines(["*test_over_budget - pytest_tfmem.errors.BudgetExceeded*"])
    # the controller saved a baseline holding the passed tests of both workers
    saved = load_baseline(pytester.path / "base.json")
    assert set(saved.tests) == {"test_suite.py::test_grow", "test_suite.py::test_steady", "test_suite.py::test_other"}
    cases = ET.parse(pytester.path / "junit-xdist.xml").getroot().iter("testcase")
    assert all(case.find("properties/property[@name='tfmem_peak_bytes']") is not None for case in cases)


def test_markdown_summary_goes_to_a_path_and_to_the_github_step_summary(pytester, monkeypatch):
    step_summary = pytester.path / "step-summary.md"
    step_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    write_suite(pytester, SUITE)
    run(pytester, "--tfmem-save-baseline=base.json").assert_outcomes(passed=3)
    write_suite(pytester, {**SUITE, "grow": 120})
    result = run(pytester, "--tfmem-baseline=base.json", "--tfmem-tolerance=10%", "--tfmem-markdown=summary.md")
    result.assert_outcomes(passed=2, failed=1)
    markdown = (pytester.path / "summary.md").read_text()
    assert "3 tests measured: 0 over budget, 1 regression beyond tolerance" in markdown
    assert "| test | what | baseline | now | change | tolerance | status |" in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| test_suite.py::test_grow | peak"))
    assert row.endswith("| 10% | regression |")
    steps = step_summary.read_text()
    assert steps.startswith("earlier step\n")  # appended, never replaced
    assert steps.count("### pytest-tfmem") == 2 and steps.endswith(markdown)


def test_report_is_written_atomically_and_nothing_is_written_without_options(pytester):
    write_suite(pytester, {"a": 5})
    (pytester.path / "report.json").write_text("old")
    run(pytester, "--tfmem-report=report.json").assert_outcomes(passed=1)
    assert load(pytester.path / "report.json")["summary"]["tests"] == 1
    assert sorted(p.name for p in pytester.path.iterdir() if p.name.startswith(".report")) == []
    run(pytester).assert_outcomes(passed=1)
    assert not [p for p in pytester.path.iterdir() if p.suffix in (".md",) or "baseline" in p.name]
