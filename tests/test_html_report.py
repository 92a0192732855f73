"""pytest-html's report with tfmem's columns and sections, read back from a real HTML file."""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import forked_sessions
import pytest

from pytest_tfmem.units import format_size

pytest.importorskip("pytest_html")

TESTS = """
import numpy as np
import pytest

def test_small():
    block = np.ones(20 * 10**6 // 8)

@pytest.mark.tfmem(budget="30MB")
def test_big():
    block = np.ones(60 * 10**6 // 8)

def test_exempt():
    pass
"""

TENSORFLOW_TESTS = """
import tensorflow as tf

def test_tensorflow():
    block = tf.ones((1024, 1024))  # 4 MiB in TensorFlow's CPU allocator
"""


def report_tests(path: Path) -> dict[str, dict]:
    """pytest-html's data for each test (the JSON its page is drawn from), by node id."""
    blob = re.search(r'data-jsonblob="(.*?)"', path.read_text())
    assert blob is not None, "no data in the HTML report"
    return {nodeid: rows[0] for nodeid, rows in json.loads(html.unescape(blob.group(1)))["tests"].items()}


def cells(row: dict) -> dict[str, str]:
    """The results table's row, by column class: ``{"tfmem_peak": "57.1 MiB", ...}``."""
    return dict(re.findall(r'<td class="col-(\w+)">(.*?)</td>', "".join(row["resultsTableRow"])))


@pytest.fixture(scope="module")
def html_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One pytest run writing the HTML report, a JSON report to check it with, and a trace."""
    folder = tmp_path_factory.mktemp("html")
    (folder / "test_memory.py").write_text(TESTS)
    (folder / "test_tensorflow.py").write_text(TENSORFLOW_TESTS)
    done = forked_sessions.run(  # from a process with TensorFlow imported: test_tensorflow.py imports it
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--html=report.html", "--self-contained-html",
         "--tfmem-budget=1GB", "--tfmem-trace=on-failure", "--tfmem-report=report.json", "test_memory.py",
         "test_tensorflow.py"],
        cwd=folder, timeout=300,
    )  # fmt: skip
    assert (folder / "report.html").is_file(), done.stdout + done.stderr
    return folder, done.stdout


def test_the_results_table_gets_peak_a_column_per_framework_view_budget_and_use(html_run):
    folder, _ = html_run
    page = (folder / "report.html").read_text()
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", page)
    # TensorFlow's CPU view: one test had it, and the session's table shows it (the JSON report's columns)
    report = json.loads((folder / "report.json").read_text())
    assert "TF CPU" in report["columns"]
    assert headers[headers.index("Duration") + 1 : headers.index("Links")] == ["Peak memory", "TF CPU", "Budget", "Use"]
    tests = report_tests(folder / "report.html")
    figures = {t["nodeid"]: t for t in report["tests"]}
    for nodeid, row in tests.items():
        peak, budget = figures[nodeid]["measurement"]["peak"], figures[nodeid]["budget"]
        shown = cells(row)
        assert shown["tfmem_peak"] == format_size(peak)  # the JSON report's figure, as the terminal writes it
        assert shown["tfmem_budget"] == format_size(budget)
        assert shown["tfmem_use"] == f"{100 * peak / budget:.0f}%"
        views = {view["view"]: view for view in figures[nodeid]["measurement"]["views"]}
        tf_cpu = views.get("tf:CPU:0")
        assert shown["tfmem_view_tf_CPU_0"] == (format_size(max(0, tf_cpu["peak"] - tf_cpu["start"])) if tf_cpu else "-")
        assert len(row["resultsTableRow"]) == len(headers[headers.index("Result") :])  # a cell under each header
    assert cells(tests["test_tensorflow.py::test_tensorflow"])["tfmem_view_tf_CPU_0"] == "4.0 MiB"
    big = cells(tests["test_memory.py::test_big"])
    assert big["result"] == "Failed" and big["tfmem_budget"] == "28.6 MiB" and int(big["tfmem_use"][:-1]) > 190


def test_each_test_s_details_hold_its_tfmem_section(html_run):
    folder, _ = html_run
    tests = report_tests(folder / "report.html")
    blocks = {nodeid: [e["content"] for e in row["extras"] if e["format_type"] == "html"] for nodeid, row in tests.items()}
    assert all(len(found) == 1 for found in blocks.values()), blocks
    big = blocks["test_memory.py::test_big"][0]
    # 60 MB of ones (57.2 MiB), give or take the pages its process reuses
    assert re.search(r"<li>budget: FAILED: peak 5[67]\.\d MiB &gt; budget 30MB \(28\.6 MiB\) \(host RSS 5[67]\.", big)
    assert re.search(r"<tr><td>host RSS</td><td>[\d.]+ MiB</td><td>[\d.]+ MiB</td><td>[\d.]+ MiB</td><td>5[67]\.\d MiB</td></tr>", big)
    trace = re.search(r"trace directory: (\S+)", big)
    assert trace and (folder / trace.group(1) / "timeline.png").is_file()  # the trace the test left
    small = blocks["test_memory.py::test_small"][0]
    assert re.search(r"<li>budget: ok: peak 1[89]\.\d MiB", small) and "tfmem trace" not in small  # passing: not traced


def test_without_html_nothing_is_added(pytester: pytest.Pytester):
    pytester.makepyfile(test_memory=TESTS)
    for blocked in ([], ["-p", "no:html"]):  # pytest-html loaded but not asked for; not loaded at all
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB", *blocked)
        result.assert_outcomes(passed=2, failed=1)
        assert "Generated html report" not in result.stdout.str()
        assert not list(pytester.path.glob("*.html"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:html", "--html=x.html")
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # without pytest-html, --html is no option of ours either


def test_without_a_tfmem_option_the_table_keeps_its_columns_and_marked_tests_their_block(pytester: pytest.Pytester):
    pytester.makepyfile(test_memory=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--html=report.html")
    result.assert_outcomes(passed=2, failed=1)  # test_big's marker budget still applies
    page = (pytester.path / "report.html").read_text()
    assert "Peak memory" not in re.findall(r"<th[^>]*>([^<]*)</th>", page)
    tests = report_tests(pytester.path / "report.html")
    assert all(not name.startswith("tfmem") for row in tests.values() for name in cells(row))
    assert [len(row["extras"]) for _, row in sorted(tests.items())] == [1, 0, 0]  # test_big, exempt, small


def test_under_xdist_the_controller_writes_them_once(pytester: pytest.Pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile(test_memory=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--html=report.html", "--tfmem-budget=1GB")
    result.assert_outcomes(passed=2, failed=1)
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", (pytester.path / "report.html").read_text())
    assert headers[headers.index("Duration") + 1 : headers.index("Links")] == ["Peak memory", "Budget", "Use"]  # no framework's
    tests = report_tests(pytester.path / "report.html")
    assert set(tests) == {f"test_memory.py::test_{name}" for name in ("small", "big", "exempt")}
    assert cells(tests["test_memory.py::test_big"])["tfmem_budget"] == "28.6 MiB"
    for row in tests.values():  # the workers' reports carry no block of their own: one each, the controller's
        assert [e["format_type"] for e in row["extras"]] == ["html"]
