"""Installed but not asked for, the plugin is inert: the session is the same as without it.

No tfmem option, ini value, marker or fixture in use: no environment variable changes, no
file is written (no ``.tfmem/``, nothing appended to ``$GITHUB_STEP_SUMMARY``), nothing is
printed. Checked in fresh interpreters, where environment changes can be seen.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import PLAIN_RUN_OPTIONS

GROWTH_VARIABLE = "TF_FORCE_GPU_ALLOW_GROWTH"  # TensorFlow's, one of the variables a GPU option sets


CONFTEST = """
import json
import os

START = dict(os.environ)  # read before any plugin's pytest_configure

def pytest_addoption(parser):
    parser.addoption("--dump-env", help="write os.environ at start and at session finish to this JSON file")

def pytest_sessionfinish(session):
    with open(session.config.getoption("--dump-env"), "w") as dump:
        json.dump({"start": START, "end": dict(os.environ)}, dump, sort_keys=True)
"""

PLAIN_TESTS = """
import os
import unittest

import pytest

def test_plain():
    assert sum(range(10)) == 45

@pytest.mark.parametrize("n", [1, 2])
def test_parametrized(n, tmp_path):
    (tmp_path / "file").write_text("x" * n)

def test_prints_and_fails_expectedly():
    print("some output")

@pytest.mark.xfail(strict=True)
def test_expected_failure():
    assert False

class TestCaseStyle(unittest.TestCase):
    def test_one(self):
        self.assertEqual(os.path.join("a", "b"), "a/b")

    def test_two(self):
        self.assertTrue(True)
"""

TF_TESTS = """
import pytest

def test_tensorflow():
    tf = pytest.importorskip("tensorflow")
    assert float(tf.reduce_sum(tf.ones((4, 4)))) == 16.0
"""

# Timings differ from run to run: "in 1.23s (0:00:01)"; so does the width of the "=" around them.
_DURATION = re.compile(r"\d+(\.\d+)?s\b|\(\d+:\d\d:\d\d\)")


def comparable(lines: list[str]) -> list[str]:
    """Output lines with durations blanked, less pytest's list of the plugins it loaded."""
    return [_DURATION.sub("<time>", line).strip("= ") for line in lines if not line.startswith("plugins: ")]


def changed(environments: dict[str, dict[str, str]]) -> set[str]:
    start, end = environments["start"], environments["end"]
    return {name for name in start.keys() | end.keys() if start.get(name) != end.get(name)}


def files_under(folder: Path) -> set[str]:
    """Paths under ``folder``, each run's own names (its ``--basetemp``, its dump) made alike."""
    own_names = re.compile(r"^runpytest-\d+|^env-\w+\.json$")
    return {own_names.sub("<run>", str(path.relative_to(folder))) for path in folder.rglob("*")}


def test_an_inert_session_is_the_same_as_one_without_the_plugin(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    step_summary = pytester.path / "step-summary.md"
    step_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    monkeypatch.delenv(GROWTH_VARIABLE, raising=False)
    monkeypatch.setenv("PYTEST_ADDOPTS", PLAIN_RUN_OPTIONS)  # no tfmem ini value either
    # Inherited or not depending on what ran before in this process: each run makes its own.
    monkeypatch.delenv("MEMRAY_RESULT_PATH", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_plain=PLAIN_TESTS, test_tf=TF_TESTS)

    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:tfmem", "--dump-env=env-plain.json")
    plain.assert_outcomes(passed=7, xfailed=1)
    after_plain = files_under(pytester.path)
    inert = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--dump-env=env-inert.json")
    inert.assert_outcomes(passed=7, xfailed=1)
    after_inert = files_under(pytester.path)

    assert any(line.startswith("plugins: ") and "tfmem" in line for line in inert.outlines)  # it was loaded
    assert comparable(inert.outlines) == comparable(plain.outlines)
    assert comparable(inert.errlines) == comparable(plain.errlines)
    assert "tfmem" not in inert.stdout.str().replace("tfmem-", "") + inert.stderr.str()
    with_plugin = json.loads((pytester.path / "env-inert.json").read_text())
    without_plugin = json.loads((pytester.path / "env-plain.json").read_text())
    # What other plugins set per session (pytest-memray: a fresh MEMRAY_RESULT_PATH) differs in
    # value between the runs; the plugin changes nothing more and nothing else.
    others = changed(without_plugin)
    assert changed(with_plugin) == others
    assert {k: v for k, v in with_plugin["end"].items() if k not in others} == {
        k: v for k, v in without_plugin["end"].items() if k not in others
    }
    assert GROWTH_VARIABLE not in with_plugin["end"]
    assert not (pytester.path / ".tfmem").exists()
    assert step_summary.read_text() == "earlier step\n"
    # The session with the plugin wrote what the one without it wrote: its basetemp, its dump.
    assert after_inert == after_plain
