"""Reports CI reads (JSON, JUnit XML, Markdown) and the same gates under pytest-xdist."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import forked_sessions
import pytest
from gates_helpers import (
    MB,
    REGRESSION_LINE,
    load,
    outcomes,
    run,
    suite_source,
    write_suite,
)

from pytest_tfmem.gates.baseline import load_baseline

SUITE = {"grow": 80, "steady": 60, "other": 40}
NODEIDS = {f"test_suite.py::test_{name}" for name in [*SUITE, "over_budget"]}
OVER_BUDGET = {"over_budget": "@pytest.mark.tfmem(budget='10MB')"}


@dataclass
class GateRun:
    folder: Path
    output: str
    returncode: int
    report: dict


def gate_run(folder: Path, *workers: str) -> GateRun:
    """Save a baseline, grow ``test_grow`` by half, compare at 10%: the whole gate, in fresh interpreters."""
    environment = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}

    def pytest_run(sizes: dict[str, int], *args: str) -> subprocess.CompletedProcess:
        (folder / "test_suite.py").write_text(suite_source(sizes, OVER_BUDGET))
        return forked_sessions.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *workers, "test_suite.py", *args],
            cwd=folder, env=environment, framework=False,
        )  # fmt: skip

    saved = pytest_run({**SUITE, "over_budget": 30}, "--tfmem-save-baseline=base.json")
    assert saved.returncode == pytest.ExitCode.TESTS_FAILED, saved.stdout  # over_budget fails
    done = pytest_run(
        {**SUITE, "grow": 120, "over_budget": 30},
        "--tfmem-baseline=base.json", "--tfmem-tolerance=10%", "--tfmem-report=report.json", "--junitxml=junit.xml",
    )  # fmt: skip
    return GateRun(folder, done.stdout, done.returncode, load(folder / "report.json"))


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return gate_run(tmp_path_factory.mktemp("serial"))


@pytest.fixture(scope="module")
def parallel(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return gate_run(tmp_path_factory.mktemp("xdist"), "-n", "2")


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_json_report_follows_the_documented_schema(serial):
    report = serial.report
    assert serial.returncode == report["exitstatus"] == pytest.ExitCode.TESTS_FAILED
    assert report["format"] == "pytest-tfmem-report" and report["version"] == 1
    assert report["baseline"] == {"path": str(serial.folder / "base.json"), "tolerance": "10%"}
    assert report["environment"]["python"] and "platform" in report["environment"]
    assert report["summary"] == {
        "tests": 4, "passed": 2, "failed": 2, "skipped": 0, "over_budget": 1,
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
    over_budget = tests["test_suite.py::test_over_budget"]
    assert over_budget["budget"] == 10 * MB
    assert over_budget["extra"]["baseline"]["status"] == "not in baseline"  # it failed when the baseline was saved


def test_junit_xml_has_each_tests_peak_properties(serial):
    peaks = {t["nodeid"].split("::")[1]: t["measurement"]["peak"] for t in serial.report["tests"]}
    cases = {case.get("name"): case for case in ET.parse(serial.folder / "junit.xml").getroot().iter("testcase")}
    assert set(cases) == set(peaks)
    for name, case in cases.items():
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert int(properties["tfmem_peak_bytes"]) == peaks[name]
        assert set(properties) <= {"tfmem_peak_bytes", "tfmem_budget_bytes", "tfmem_retained_bytes", "tfmem_verdict"}
    verdicts = {name: case.find("properties/property[@name='tfmem_verdict']").get("value") for name, case in cases.items()}
    assert verdicts == {"test_grow": "failed: baseline", "test_over_budget": "failed: budget", "test_steady": "ok",
                        "test_other": "ok"}
    assert int(cases["test_grow"].find("properties/property[@name='tfmem_peak_bytes']").get("value")) > 118 * MB
    budget = cases["test_over_budget"].find("properties/property[@name='tfmem_budget_bytes']")
    assert int(budget.get("value")) == 10 * MB


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_xdist_gives_one_report_with_every_test_and_the_same_verdicts(serial, parallel):
    assert "2 workers" in parallel.output
    assert outcomes(parallel.report) == outcomes(serial.report) == {
        "test_suite.py::test_grow": "failed",
        "test_suite.py::test_over_budget": "failed",
        "test_suite.py::test_steady": "passed",
        "test_suite.py::test_other": "passed",
    }
    assert parallel.report["summary"] == serial.report["summary"]
    for run_ in (serial, parallel):
        assert "FAILED test_suite.py::test_grow - tfmem: peak " in run_.output
        assert "FAILED test_suite.py::test_over_budget - tfmem: peak " in run_.output
        assert REGRESSION_LINE.search(run_.output)
    # the controller saved one baseline holding the passed tests of both workers
    saved = load_baseline(parallel.folder / "base.json")
    assert set(saved.tests) == {"test_suite.py::test_grow", "test_suite.py::test_steady", "test_suite.py::test_other"}
    cases = list(ET.parse(parallel.folder / "junit.xml").getroot().iter("testcase"))
    assert len(cases) == 4
    assert all(case.find("properties/property[@name='tfmem_peak_bytes']") is not None for case in cases)


def test_markdown_summary_goes_to_a_path_and_to_the_github_step_summary(pytester, monkeypatch):
    step_summary = pytester.path / "step-summary.md"
    step_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    write_suite(pytester, SUITE)
    run(pytester, "--tfmem-save-baseline=base.json", "--tfmem-github-summary").assert_outcomes(passed=3)
    write_suite(pytester, {**SUITE, "grow": 120})
    result = run(
        pytester,
        "--tfmem-baseline=base.json", "--tfmem-tolerance=10%", "--tfmem-markdown=summary.md", "--tfmem-github-summary",
    )  # fmt: skip
    result.assert_outcomes(passed=2, failed=1)
    markdown = (pytester.path / "summary.md").read_text()
    assert "3 tests measured: 0 over budget, 1 regression beyond tolerance" in markdown
    assert "| test | what | baseline | now | change | tolerance | status |" in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| test_suite.py::test_grow | peak"))
    assert row.endswith("| 10% | regression |")
    steps = step_summary.read_text()
    assert steps.startswith("earlier step\n")  # appended, never replaced
    assert steps.count("### pytest-tfmem") == 2 and steps.endswith(markdown)


def test_the_github_step_summary_is_written_only_when_asked(pytester, monkeypatch):
    step_summary = pytester.path / "step-summary.md"
    step_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    write_suite(pytester, {"a": 5})
    # Measured tests and a Markdown file, but no --tfmem-github-summary: the job's page is left alone.
    run(pytester, "--tfmem-budget=1GB", "--tfmem-markdown=summary.md").assert_outcomes(passed=1)
    assert (pytester.path / "summary.md").is_file()
    assert step_summary.read_text() == "earlier step\n"
    # The ini value asks for it too.
    pytester.makeini("[pytest]\ntfmem_github_summary = true\n")
    run(pytester).assert_outcomes(passed=1)
    assert step_summary.read_text().count("### pytest-tfmem") == 1


def test_asking_for_the_github_step_summary_outside_github_says_so(pytester, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    write_suite(pytester, {"a": 5})
    result = run(pytester, "--tfmem-github-summary")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*tfmem: $GITHUB_STEP_SUMMARY is not set: no summary appended to it"])


def test_report_is_written_atomically_and_nothing_is_written_without_options(pytester):
    write_suite(pytester, {"a": 5, "b": 5})
    run(pytester, "--tfmem-report=report.json").assert_outcomes(passed=2)
    write_suite(pytester, {"a": 5})
    run(pytester, "--tfmem-report=report.json").assert_outcomes(passed=1)  # a report of its own kind: replaced
    assert load(pytester.path / "report.json")["summary"]["tests"] == 1
    assert sorted(p.name for p in pytester.path.iterdir() if p.name.startswith(".report")) == []
    run(pytester).assert_outcomes(passed=1)
    assert not [p for p in pytester.path.iterdir() if p.suffix in (".md",) or "baseline" in p.name]


def test_measured_tests_are_counted_without_those_skipped(pytester: pytest.Pytester) -> None:
    """A test that skips in its body is measured (its call ran) and in the books, but no count of
    "measured tests" includes it: the report's ``summary`` and the account's line say it apart."""
    pytester.makepyfile(test_counts="""
        import numpy as np
        import pytest

        KEPT = []

        def test_keeps():
            KEPT.append(np.ones(60 * 2**20, dtype=np.uint8))

        def test_skips_in_its_body():
            pytest.skip("not on this machine")
    """)
    result = pytester.runpytest("-p", "no:randomly", "--tfmem-budget=1GB", "--tfmem-report=report.json")
    result.assert_outcomes(passed=1, skipped=1)
    summary = load(pytester.path / "report.json")["summary"]
    assert (summary["tests"], summary["skipped"], summary["passed"]) == (1, 1, 1)
    result.stdout.fnmatch_lines(["process * over 1 measured test (and 1 skipped): *"])
