"""Baselines with tolerance, through real pytest runs: save, grow, compare, fail as that test."""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys

import pytest
from gates_helpers import REGRESSION_LINE, load, run, write_suite

SUITE = {"grow": 80, "steady": 60, "other": 40}


@pytest.fixture
def baseline(pytester: pytest.Pytester):
    """A baseline saved from ``SUITE``; returns its path."""
    write_suite(pytester, SUITE)
    result = run(pytester, "--tfmem-save-baseline=tfmem-baseline.json")
    result.assert_outcomes(passed=3)
    path = pytester.path / "tfmem-baseline.json"
    assert set(load(path)["tests"]) == {f"test_suite.py::test_{name}" for name in SUITE}
    return path


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_test_grown_by_half_fails_with_the_numbers_and_the_others_pass(pytester, baseline):
    write_suite(pytester, {**SUITE, "grow": 120})
    result = run(pytester, f"--tfmem-baseline={baseline.name}", "--tfmem-tolerance=10%")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_suite.py::test_grow - tfmem: peak * vs baseline *"])
    match = REGRESSION_LINE.search(result.stdout.str())
    assert match, result.stdout.str()
    now, before = float(match["now"]), float(match["before"])
    saved_peak = load(baseline)["tests"]["test_suite.py::test_grow"]["peak"]
    assert before == pytest.approx(saved_peak / 2**20, abs=0.05)  # the baseline's own number
    assert 1.4 < now / before < 1.6  # 120 MB against 80 MB
    assert float(match["change"]) == pytest.approx(100 * (now / before - 1), abs=0.2)
    assert match["tolerance"] == "10%"
    result.stdout.fnmatch_lines(["*1 regression beyond tolerance*", "test_suite.py::test_grow *peak*regression"])


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_growth_within_tolerance_passes(pytester, baseline):
    write_suite(pytester, {**SUITE, "grow": 84})  # +5%
    result = run(pytester, f"--tfmem-baseline={baseline.name}", "--tfmem-tolerance=10%")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["3 tests measured: 0 over budget, 0 regressions beyond tolerance, *"])


def test_test_missing_from_the_baseline_passes_with_a_note(pytester, baseline):
    write_suite(pytester, {**SUITE, "new": 50})
    result = run(pytester, f"--tfmem-baseline={baseline.name}", "--tfmem-tolerance=10%")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        ["*1 not in the baseline*", "not in the baseline (not compared, they pass): test_suite.py::test_new"]
    )


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_improvement_beyond_tolerance_passes_and_is_reported(pytester, baseline):
    write_suite(pytester, {**SUITE, "grow": 40})
    result = run(pytester, f"--tfmem-baseline={baseline.name}", "--tfmem-tolerance=10%")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*1 improvement beyond tolerance*",
            "test_suite.py::test_grow *peak*-*improvement",
            f"*refresh it with --tfmem-save-baseline=*{baseline.name}",
        ]
    )


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_size_part_of_the_tolerance_keeps_tiny_tests_from_failing_on_noise(pytester):
    write_suite(pytester, {"tiny": 1, "big": 80})
    run(pytester, "--tfmem-save-baseline=b.json").assert_outcomes(passed=2)
    write_suite(pytester, {"tiny": 3, "big": 80})  # +2 MB is +200% of a 1 MB test
    run(pytester, "--tfmem-baseline=b.json", "--tfmem-tolerance=10%").assert_outcomes(passed=1, failed=1)
    result = run(pytester, "--tfmem-baseline=b.json", "--tfmem-tolerance=10%+16MB")
    result.assert_outcomes(passed=2)


def test_marker_tolerance_overrides_the_option(pytester, baseline):
    write_suite(pytester, {**SUITE, "grow": 120}, {"grow": "@pytest.mark.tfmem(tolerance='60%')"})
    result = run(pytester, f"--tfmem-baseline={baseline.name}", "--tfmem-tolerance=10%")
    result.assert_outcomes(passed=3)
    write_suite(pytester, {**SUITE, "steady": 70}, {"steady": "@pytest.mark.tfmem(tolerance='5%')"})
    result = run(pytester, f"--tfmem-baseline={baseline.name}", "--tfmem-tolerance=50%")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*tfmem: peak * vs baseline * (+1?.?% > 5%)"])


def test_bad_marker_tolerance_is_a_usage_error(pytester):
    write_suite(pytester, {"a": 1}, {"a": "@pytest.mark.tfmem(tolerance='10')"})
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_a*invalid tfmem marker argument tolerance '10': expected a percentage*"])


def test_regression_is_a_memory_regression_failure(pytester, baseline):
    write_suite(
        pytester,
        {**SUITE, "grow": 120},
        {"grow": "@pytest.mark.xfail(strict=True, raises=__import__('pytest_tfmem').MemoryRegression)"},
    )
    result = run(pytester, f"--tfmem-baseline={baseline.name}", "--tfmem-tolerance=10%")
    result.assert_outcomes(passed=2, xfailed=1)


def test_baseline_from_another_environment_warns_saying_what_differs(pytester, baseline):
    data = load(baseline)
    data["environment"]["python"] = "2.7"
    baseline.write_text(json.dumps(data))
    result = run(pytester, f"--tfmem-baseline={baseline.name}")
    result.assert_outcomes(passed=3)
    here = ".".join(platform.python_version_tuple()[:2])
    result.stdout.fnmatch_lines(
        [f"tfmem: warning: the baseline was recorded in a different environment: python 2.7 in the baseline, {here} here"]
    )
    assert "different environment" not in run(pytester, "--tfmem-save-baseline=fresh.json").stdout.str()


def test_saving_merges_keeps_tests_not_run_and_prune_drops_them(pytester, baseline):
    before = load(baseline)["tests"]
    write_suite(pytester, {"grow": 100, "added": 20})
    run(pytester, f"--tfmem-save-baseline={baseline.name}").assert_outcomes(passed=2)
    merged = load(baseline)["tests"]
    assert set(merged) == set(before) | {"test_suite.py::test_added"}
    assert merged["test_suite.py::test_steady"] == before["test_suite.py::test_steady"]  # not run: kept as is
    assert merged["test_suite.py::test_grow"]["peak"] > 1.15 * before["test_suite.py::test_grow"]["peak"]  # updated
    run(pytester, f"--tfmem-save-baseline={baseline.name}", "--tfmem-baseline-prune").assert_outcomes(passed=2)
    assert set(load(baseline)["tests"]) == {"test_suite.py::test_grow", "test_suite.py::test_added"}


def test_a_failing_test_keeps_its_old_entry(pytester, baseline):
    before = load(baseline)["tests"]["test_suite.py::test_grow"]
    pytester.makepyfile(
        test_suite="import numpy as np\ndef test_grow():\n    block = np.ones(10**6)\n    assert False\n"
    )
    run(pytester, f"--tfmem-save-baseline={baseline.name}").assert_outcomes(failed=1)
    assert load(baseline)["tests"]["test_suite.py::test_grow"] == before


def test_interrupted_run_leaves_the_baseline_byte_for_byte(pytester, baseline):
    original = baseline.read_bytes()
    pytester.makepyfile(
        test_suite="import numpy as np\n"
        "def test_first():\n    np.ones(10**6)\n"
        "def test_interrupt():\n    raise KeyboardInterrupt\n"
    )
    result = run(pytester, f"--tfmem-save-baseline={baseline.name}", fresh_process=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["tfmem: baseline not saved: the run was interrupted; *tfmem-baseline.json is unchanged"])
    assert baseline.read_bytes() == original


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"format": "pytest-tfmem-baseline", "version": 1, "tests": {', "not valid JSON (line 1, column *"),
        (b"", "the file is empty*"),
        (b"  \n", "the file is empty*"),
        (b'{"format": "pytest-tfmem-baseline", "version": 99, "tests": {}}', "baseline format version 99 is not supported*"),
        (b'{"format": "something-else", "version": 1, "tests": {}}', "not a pytest-tfmem baseline*"),
        (b'{"format": "pytest-tfmem-baseline", "version": 1, "tests": {"t": {"peak": "big"}}}', "test 't': \"peak\" must be*"),
        (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not a text file*"),
    ],
    ids=["corrupt", "empty", "blank", "wrong-version", "not-a-baseline", "bad-entry", "binary"],
)
def test_bad_baseline_is_a_clear_error_and_stays_byte_for_byte(pytester, content, problem):
    write_suite(pytester, {"a": 5})
    path = pytester.path / "tfmem-baseline.json"
    path.write_bytes(content)
    # compared with and saved into at once: the strongest temptation to rewrite it
    result = run(pytester, f"--tfmem-baseline={path.name}", f"--tfmem-save-baseline={path.name}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-tfmem: baseline file '*tfmem-baseline.json': {problem}"])
    assert "Traceback" not in result.stderr.str()
    assert path.read_bytes() == content
    assert sorted(p.name for p in pytester.path.iterdir() if "tfmem-baseline" in p.name) == ["tfmem-baseline.json"]


@pytest.mark.parametrize("option", ["--tfmem-baseline", "--tfmem-save-baseline"])
def test_each_baseline_option_alone_refuses_a_corrupt_file(pytester, option):
    write_suite(pytester, {"a": 5})
    path = pytester.path / "b.json"
    path.write_bytes(b'{"format": "pytest-tfmem-baseline", "version": 1, "tests": {"t": {"peak": 1}')
    original = path.read_bytes()
    result = run(pytester, f"{option}=b.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-tfmem: baseline file '*b.json': not valid JSON (line 1, column *"])
    if option == "--tfmem-save-baseline":
        result.stderr.fnmatch_lines(["*merges into an existing file: fix or remove it; it was left unchanged)"])
    assert path.read_bytes() == original


def test_unreadable_and_missing_baselines_are_clear_errors(pytester):
    write_suite(pytester, {"a": 5})
    (pytester.path / "folder.json").mkdir()
    result = run(pytester, "--tfmem-baseline=folder.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-tfmem: baseline file '*folder.json': cannot be read (Is a directory)"])
    result = run(pytester, "--tfmem-baseline=absent.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: pytest-tfmem: baseline file '*absent.json': no such file (create one with --tfmem-save-baseline=PATH)"]
    )


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_ini_values_work_like_the_options(pytester, baseline):
    pytester.makeini(f"[pytest]\ntfmem_baseline = {baseline.name}\ntfmem_tolerance = 10%\n")
    write_suite(pytester, {**SUITE, "grow": 120})
    run(pytester).assert_outcomes(passed=2, failed=1)


def test_pytest_help_shows_the_gate_options(pytester):
    result = pytester.runpytest("--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*--tfmem-tolerance=VALUE*", "*('10%'), a size with a unit*"])
    for option in ("--tfmem-baseline=", "--tfmem-save-baseline=", "--tfmem-baseline-prune", "--tfmem-report="):
        result.stdout.fnmatch_lines([f"*{option}*"])


KEEPS = """
import os

import numpy as np

KEPT = []

def test_keeps():
    KEPT.append(np.ones(int(os.environ["KEEP_MB"]) * 10**6 // 8))

def test_steady():
    assert sum(range(10)) == 45
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_test_whose_peak_and_retained_both_regress_fails_once_naming_both(pytester, monkeypatch, workers):
    pytester.makepyfile(test_keeps=KEEPS)
    monkeypatch.setenv("KEEP_MB", "20")
    run(pytester, "--tfmem-save-baseline=base.json", fresh_process=True).assert_outcomes(passed=2)
    assert load(pytester.path / "base.json")["tests"]["test_keeps.py::test_keeps"]["retained"] > 19 * 2**20
    monkeypatch.setenv("KEEP_MB", "80")
    result = run(pytester, "--tfmem-baseline=base.json", "--tfmem-report=report.json", "--junitxml=junit.xml",
                 *workers, fresh_process=True)
    result.assert_outcomes(passed=1, failed=1)  # no teardown error beside the failure
    summary = next(line for line in result.outlines if line.startswith("FAILED test_keeps.py::test_keeps"))
    assert summary[:80].startswith("FAILED test_keeps.py::test_keeps - tfmem: peak 7")  # the figures, at once
    block = result.stdout.str().split("_ test_keeps _")[1]
    assert re.search(r"tfmem: peak 7\d\.\d MiB vs baseline 1\d\.\d MiB \(.*> 10%\+16MB\)\n", block)
    assert re.search(r"tfmem: retained 7\d\.\d MiB vs baseline 1\d\.\d MiB \(.*> 10%\+16MB\)\n", block)
    result.stdout.fnmatch_lines([
        "2 tests measured: 0 over budget, 1 regression beyond tolerance, *",
        "test_keeps.py::test_keeps *peak; retained *regression",
    ])
    compared = result.stdout.str().split("tfmem: baseline ")[1].split("JSON report written")[0]
    assert compared.count("test_keeps.py::test_keeps ") == 1  # one row, both figures
    report = load(pytester.path / "report.json")
    assert report["summary"]["regressions"] == 1 and report["summary"]["failed"] == 1
    keeps = next(test for test in report["tests"] if test["nodeid"] == "test_keeps.py::test_keeps")
    quantities = keeps["extra"]["baseline"]["quantities"]
    assert {name: figures["status"] for name, figures in quantities.items()} == {"peak": "regression", "retained": "regression"}
    junit = (pytester.path / "junit.xml").read_text()
    assert junit.count("<failure") == 1 and "<error" not in junit
    command = subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", "compare", "base.json", "report.json"],
                             cwd=pytester.path, capture_output=True, text=True)
    assert command.stdout.splitlines()[-1] == (
        "1 regression(s), 0 improvement(s) beyond tolerance, 1 within tolerance, 0 not in the baseline"  # tests, not figures
    )
