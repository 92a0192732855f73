"""Explaining a failure: memory by line, off by default, modes, named functions, bad input."""

from __future__ import annotations

import importlib.util
import json

import pytest

MB = 10**6

THREE_ALLOCATIONS = """
import numpy as np
import pytest

@pytest.mark.tfmem(budget="200MB", explain=True)
def test_kept():
    a = np.ones(100 * 10**6 // 8)  # 100 MB
    b = np.ones(300 * 10**6 // 8)  # 300 MB
    c = np.ones(50 * 10**6 // 8)  # 50 MB

@pytest.mark.tfmem(budget="200MB", explain=True)
def test_freed_at_once():
    a = np.ones(100 * 10**6 // 8).sum()  # 100 MB
    b = np.ones(300 * 10**6 // 8).sum()  # 300 MB
    c = np.ones(50 * 10**6 // 8).sum()  # 50 MB
"""


def _rows_by_size(explanation: dict) -> dict[int, dict]:
    """The rows of the test function's table, by the MB the line allocates (from its comment)."""
    rows = explanation["lines"][0]["rows"]
    return {int(row["contents"].split("#")[1].split()[0]): row for row in rows if "#" in row["contents"]}


def test_the_300MB_line_gets_the_largest_increase(run_subprocess_records, pytester: pytest.Pytester):
    pytester.makepyfile(test_three=THREE_ALLOCATIONS)
    result, records = run_subprocess_records("--tfmem-report=report.json")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*- memory by line (test_three.py::test_kept) -*",
        "re-run once after the failure, with the same fixture values, under a line tracer: peak *",
        "Line  Hits  * Peak+  * Net  * Peak  Line contents",
        "   7     1  +28?.? MiB  +28?.? MiB  *  b = np.ones(300 * 10**6 // 8)  # 300 MB",
        "largest increase: line 7 (+28?.? MiB): b = np.ones(300 * 10**6 // 8)  # 300 MB",
    ])
    for name, kept in (("test_kept", True), ("test_freed_at_once", False)):
        explanation = records[name].extra["explain"]
        assert explanation["how"] == "rerun"
        rows = _rows_by_size(explanation)
        assert explanation["largest"]["contents"] == rows[300]["contents"]
        for size, row in rows.items():
            assert abs(row["peak_increase_bytes"] - size * MB) <= 0.1 * size * MB, (name, row)
            assert row["hits"] == 1
            expected_net = size * MB if kept else 0
            assert abs(row["net_bytes"] - expected_net) <= 0.1 * size * MB, (name, row)
    # The test's level: all three kept ends at ~450 MB, freed at once never above ~300 MB.
    assert max(row["peak_bytes"] for row in records["test_kept"].extra["explain"]["lines"][0]["rows"]) > 405 * MB
    assert max(row["peak_bytes"] for row in records["test_freed_at_once"].extra["explain"]["lines"][0]["rows"]) < 330 * MB
    report = json.loads((pytester.path / "report.json").read_text())
    in_report = {test["nodeid"]: test["extra"].get("explain") for test in report["tests"]}
    assert in_report["test_three.py::test_kept"]["largest"]["line"] == 7


COUNTED = """
import numpy as np
import pytest
from pathlib import Path

def count_run(name):
    with open(Path(__file__).with_name(name + ".runs"), "a") as runs:
        runs.write("x")

@pytest.mark.tfmem(budget="100MB")
def test_passes():
    count_run("test_passes")
    np.ones(10 * 10**6 // 8)  # 10 MB

@pytest.mark.tfmem(budget="100MB")
def test_over_budget():
    count_run("test_over_budget")
    block = np.ones(200 * 10**6 // 8)  # 200 MB

@pytest.mark.tfmem(budget="100MB", explain_mode="from-start")
def test_over_budget_runs_once():
    count_run("test_over_budget_runs_once")
    block = np.ones(200 * 10**6 // 8)  # 200 MB
"""


def _runs(pytester: pytest.Pytester, name: str) -> int:
    path = pytester.path / f"{name}.runs"
    return len(path.read_text()) if path.exists() else 0


def test_off_by_default(run_subprocess_records, pytester: pytest.Pytester):
    pytester.makepyfile(test_counted=COUNTED)
    result, records = run_subprocess_records()
    result.assert_outcomes(passed=1, failed=2)
    assert "memory by line" not in result.stdout.str()
    assert all("explain" not in record.extra for record in records.values())
    assert {name: _runs(pytester, name) for name in records} == {  # a failure stands once a re-run reproduced it
        "test_passes": 1, "test_over_budget": 2, "test_over_budget_runs_once": 2,
    }


def test_on_passing_tests_run_once_and_untraced_failures_rerun_or_trace_from_start(
    run_subprocess_records, pytester: pytest.Pytester
):
    pytester.makepyfile(test_counted=COUNTED)
    pytester.makeconftest(
        """
import sys
import pytest

@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    # what traces the test's own run, seen from just around it
    tracer = getattr(sys.gettrace(), "__self__", None)
    pyfuncitem.user_properties.append(("tracer", type(tracer).__name__))
    return (yield)
"""
    )
    result, records = run_subprocess_records("--tfmem-explain")
    result.assert_outcomes(passed=1, failed=2)
    assert "explain" not in records["test_passes"].extra
    assert {name: _runs(pytester, name) for name in records} == {  # explained in the re-run that confirms
        "test_passes": 1, "test_over_budget": 2, "test_over_budget_runs_once": 2,
    }
    rerun = records["test_over_budget"].extra["explain"]
    from_start = records["test_over_budget_runs_once"].extra["explain"]
    assert rerun["how"] == "rerun" and from_start["how"] == "from-start"
    assert from_start["description"].startswith("the test's own run, traced from the start")
    for explanation in (rerun, from_start):
        assert abs(explanation["largest"]["peak_increase_bytes"] - 200 * MB) <= 20 * MB
        assert explanation["largest"]["contents"].startswith("block = np.ones(200")
    # the verdict of a test traced from the start is still the exact peak
    assert abs(records["test_over_budget_runs_once"].measurement.peak - 200 * MB) <= 20 * MB
    junit = (pytester.path / "junit.xml").read_text()
    assert junit.count('name="tracer" value="LineTracer"') == 1  # only the from-start test's own run


NAMED = """
import numpy as np
import pytest
import helpers

@pytest.mark.tfmem(budget="100MB", explain=["helpers.prepare", "helpers.Loader.load", "helpers.missing"])
def test_named():
    data = helpers.prepare()
    more = helpers.Loader().load()
"""

HELPERS = """
import numpy as np

def prepare():
    small = np.ones(10 * 10**6 // 8)
    large = np.ones(150 * 10**6 // 8)
    return small, large

class Loader:
    def load(self):
        return np.ones(30 * 10**6 // 8)
"""


def test_named_functions_are_explained_line_by_line(run_subprocess_records, pytester: pytest.Pytester):
    pytester.makepyfile(test_named=NAMED, helpers=HELPERS)
    result, records = run_subprocess_records()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*- memory by line (test_named.py::test_named) -*",
        "*  data = helpers.prepare()",
        "*- memory by line (helpers.prepare) -*",
        "*  large = np.ones(150 * 10**6 // 8)",
        "largest increase: line 5 (+14?.? MiB): large = np.ones(150 * 10**6 // 8)",
        "*- memory by line (helpers.Loader.load) -*",
        "note: not traced: helpers.missing: module 'helpers' has no 'missing'",
    ])
    explanation = records["test_named"].extra["explain"]
    by_function = {function["function"]: function for function in explanation["lines"]}
    assert list(by_function) == ["test_named.py::test_named", "helpers.prepare", "helpers.Loader.load"]
    call_line = next(r for r in by_function["test_named.py::test_named"]["rows"] if "prepare" in r["contents"])
    inner = {r["line"]: r for r in by_function["helpers.prepare"]["rows"]}
    # the calling line is charged with the whole call, each line inside with its part
    assert abs(call_line["peak_increase_bytes"] - 160 * MB) <= 16 * MB
    assert abs(inner[5]["peak_increase_bytes"] - 150 * MB) <= 15 * MB
    assert abs(inner[4]["peak_increase_bytes"] - 10 * MB) <= 2 * MB


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--tfmem-explain-mode=sideways"], "*--tfmem-explain-mode value 'sideways': expected one of rerun, from-start*"),
        (["--tfmem-explain-functions=mypkg.fit,2bad"], "*'2bad' is not a dotted function name*"),
        (["--tfmem-explain-top=0"], "*--tfmem-explain-top value '0': expected a whole number >= 1*"),
    ],
)
def test_bad_options_are_usage_errors(pytester: pytest.Pytester, arguments, message):
    pytester.makepyfile("def test_nothing(): pass")
    result = pytester.runpytest(*arguments)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("explain='yes'", "*tfmem marker argument explain 'yes': expected True, False or a list of dotted function names*"),
        ("explain=['fit_model']", "*'fit_model' is not a dotted function name*"),
        ("explain_mode='later'", "*tfmem marker argument explain_mode 'later': expected one of rerun, from-start*"),
    ],
)
def test_bad_marker_arguments_are_usage_errors(pytester: pytest.Pytester, marker, message):
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.tfmem({marker})\ndef test_nothing(): pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


JAX_OVER_BUDGET = """
import jax.numpy as jnp
import pytest

@pytest.mark.tfmem(budget="100MB", explain=True)
def test_jax_on_cpu():
    big = jnp.ones((300 * 10**6 // 4,), dtype=jnp.float32)  # 300 MB
    assert float(big[0]) == 1.0
"""

TOOLS_IMPORTED = """
import sys

def pytest_unconfigure(config):
    tools = ("xprof", "tensorboard", "matplotlib", "tensorflow")
    print("tools imported:", sorted(name for name in tools if name in sys.modules))
"""


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed")
def test_jax_on_cpu_says_it_has_no_op_table_and_imports_none_of_our_tools(run_subprocess_records,
                                                                          pytester: pytest.Pytester):
    """Explained and traced, a JAX test's process imports no trace reader (xprof), nor TensorBoard
    or matplotlib for the timeline (drawn in a process of its own), nor TensorFlow."""
    pytester.makepyfile(test_jax=JAX_OVER_BUDGET)
    pytester.makeconftest(TOOLS_IMPORTED)
    result, records = run_subprocess_records()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*big = jnp.ones(*",
        "memory timeline: TensorBoard scalars memory/host_rss_mib, memory/budget_mib; *timeline.png",
        "tools imported: []",
    ])
    explanation = records["test_jax_on_cpu"].extra["explain"]
    assert "no op table: JAX on CPU records no allocations in its trace (only its GPU allocator does)" in explanation["notes"]
    assert explanation["lines"], explanation
