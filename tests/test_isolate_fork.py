"""Isolated tests start as forks of one template process per session, or as fresh interpreters.

Real pytest sessions in fresh interpreters; each isolated test looks at its own parent process.
"""

from __future__ import annotations

import json

import psutil
import pytest

WHO_RUNS_ME = """
import json
import os
import unittest

import psutil
import pytest


def _note(name):
    parent = psutil.Process(os.getppid())
    with open("processes.jsonl", "a") as notes:
        notes.write(json.dumps({
            "test": name, "pid": os.getpid(), "parent": parent.pid, "parent_cmdline": parent.cmdline(),
            "grandparent": parent.ppid(),
            "setting": os.environ.get("SET_BY_CONFTEST"),
        }) + "\\n")


@pytest.mark.tfmem(isolate=True)
def test_function():
    _note("function")


@pytest.mark.tfmem(isolate=True)
class TestCaseMethods(unittest.TestCase):
    def test_method(self):
        _note("method")

    def test_another_method(self):
        _note("another method")
"""

CONFTEST = """
import os

os.environ["SET_BY_CONFTEST"] = "yes"


def pytest_sessionstart(session):
    try:  # the session's pid: its isolated tests' processes run this hook again, later
        with open("session.json", "x") as note:
            note.write(str(os.getpid()))
    except FileExistsError:
        pass
"""


def _notes(pytester: pytest.Pytester) -> list[dict]:
    return [json.loads(line) for line in (pytester.path / "processes.jsonl").read_text().splitlines()]


@pytest.mark.linux  # forks of the template
def test_isolated_tests_run_in_forks_of_one_template(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_who=WHO_RUNS_ME)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.no_fnmatch_line("*IsolationStartWarning*")
    notes = _notes(pytester)
    session = int((pytester.path / "session.json").read_text())
    assert {note["test"] for note in notes} == {"function", "method", "another method"}
    templates = {note["parent"] for note in notes}
    assert len(templates) == 1  # one template serves the session
    assert templates != {session}
    # No test ran TensorFlow here: the template is a fork of the session, not a fresh interpreter.
    assert {note["grandparent"] for note in notes} == {session}
    assert "pytest_tfmem.isolate.template" not in notes[0]["parent_cmdline"]
    assert len({note["pid"] for note in notes}) == 3  # a fresh fork for each test
    assert {note["setting"] for note in notes} == {"yes"}  # as the conftest.py file left it
    assert not psutil.pid_exists(templates.pop())  # the template ended with the session


@pytest.mark.parametrize(
    "how", [pytest.param(["--tfmem-isolate-start=spawn"], id="command line"),
            pytest.param(["-o", "tfmem_isolate_start=spawn"], id="ini")]
)
def test_spawn_starts_a_fresh_interpreter_per_test(pytester: pytest.Pytester, how: list[str]):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_who=WHO_RUNS_ME)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "function", *how)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["tfmem: isolated tests start as fresh interpreters (tfmem_isolate_start = spawn)"])
    (note,) = _notes(pytester)
    assert note["parent"] == int((pytester.path / "session.json").read_text())  # spawned by the session


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tfmem-isolate-start=thread"], "*--tfmem-isolate-start value 'thread': expected one of fork, spawn*"),
        (["-o", "tfmem_isolate_start=vfork"], "*ini tfmem_isolate_start value 'vfork': expected one of fork, spawn*"),
    ],
)
def test_a_bad_start_method_is_a_usage_error(pytester: pytest.Pytester, args: list[str], message: str):
    pytester.makepyfile("def test_a(): pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.linux  # forks of the template
@pytest.mark.slow  # TensorFlow starts in the session, in the template and in each child
@pytest.mark.forked_sessions  # the session's import of TensorFlow, paid before it; its runtime starts in it
def test_a_runtime_started_while_pytest_configured_spawns_isolated_tests_without_a_template(pytester: pytest.Pytester):
    pytester.makeconftest(
        """
        import tensorflow as tf

        RUNTIME_STARTED_BY_CONFTEST = float(tf.reduce_sum(tf.ones((2, 2))))
        """
    )
    pytester.makepyfile(
        """
        import os
        import psutil
        import pytest

        @pytest.mark.tfmem(isolate=True)
        @pytest.mark.parametrize("run", range(2))
        def test_isolated(run):
            assert "pytest_tfmem.isolate.template" not in psutil.Process(os.getppid()).cmdline()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, warnings=1)  # said once, not once per test
    result.stdout.fnmatch_lines(
        [
            "*IsolationStartWarning: pytest-tfmem: isolated tests start as fresh interpreters, not as forks of a "
            "template process: TensorFlow's runtime was started while pytest configured*",
        ]
    )
    # no template was started to find it out: it would have configured as the session did
    assert list(pytester.path.rglob("tfmem-template*")) and not list(pytester.path.rglob("template.log"))


@pytest.mark.linux  # forks of the template
def test_a_template_that_fails_to_start_falls_back_to_spawn_and_shows_its_output(pytester: pytest.Pytester):
    pytester.makeconftest(
        """
        def pytest_sessionstart(session):
            plugins = session.config.pluginmanager.get_plugins()
            if any(type(plugin).__name__ == "TemplateRun" for plugin in plugins):  # only in the template
                raise RuntimeError("this conftest.py file refuses the template")
        """
    )
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.tfmem(isolate=True)
        @pytest.mark.parametrize("run", range(2))
        def test_isolated(run):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*IsolationStartWarning: pytest-tfmem: isolated tests start as fresh interpreters, not as forks of a "
            "template process: the template's pytest run ended with exit code 3 before collection; the end of its "
            "output (*template.log):",
            "*RuntimeError: this conftest.py file refuses the template*",
        ]
    )


@pytest.mark.linux  # forks of the template
@pytest.mark.slow  # TensorFlow starts in the session, in the template and in each test's fork
@pytest.mark.forked_sessions  # the session's import of TensorFlow, paid before it; its runtime starts in it
def test_tests_that_start_tensorflow_on_import_get_a_template_of_a_fresh_interpreter(pytester: pytest.Pytester):
    """Collecting this module starts TensorFlow's runtime in the session, so forking the session
    is not safe; a fresh interpreter imports TensorFlow without starting it and is forked."""
    pytester.makepyfile(
        test_who=WHO_RUNS_ME.replace("import pytest\n", "import pytest\nimport tensorflow as tf\n\nONES = tf.ones((2, 2))\n", 1)
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.no_fnmatch_line("*IsolationStartWarning*")
    notes = _notes(pytester)
    assert len({note["parent"] for note in notes}) == 1 and len({note["pid"] for note in notes}) == 3
    assert "pytest_tfmem.isolate.template" in notes[0]["parent_cmdline"]
