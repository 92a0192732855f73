"""``--tfmem-isolate=auto``: the tests the journal shows running when the last session died run
isolated in the next one. Here a test kills its own session with SIGKILL; the kernel's OOM
killer does it for real in ``test_isolate_oom.py``."""

from __future__ import annotations

import signal

import pytest
from conftest import dump_records, dumped_records

KILLS_ITS_PROCESS = """
import os
import signal
import unittest

def test_before():
    pass

class TestKills(unittest.TestCase):
    def test_kills_its_process(self):
        os.kill(os.getpid(), signal.SIGKILL)

def test_after():
    pass
"""


@pytest.mark.parametrize(
    "workers", [pytest.param([], id="one process"), pytest.param(["-n", "2"], id="xdist -n 2", marks=pytest.mark.slow)]
)
def test_auto_isolates_the_test_that_was_running_when_the_session_died(pytester: pytest.Pytester, workers):
    pytester.makepyfile(test_kills=KILLS_ITS_PROCESS)
    junit = pytester.path / "junit.xml"
    first = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-isolate=auto")
    assert first.ret == -signal.SIGKILL

    second = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--tfmem-isolate=auto", "--tfmem-budget=1GB", f"--junitxml={junit}", *dump_records(pytester.path), *workers
    )
    second.assert_outcomes(passed=2, failed=1)
    second.stdout.fnmatch_lines(
        [
            "*= tfmem: --tfmem-isolate=auto =*",
            "tfmem: the session started * (pid *) died; 1 test(s) to isolate (journal *results.jsonl)",
            "test_kills.py::TestKills::test_kills_its_process: isolated: running when the session started * "
            "(pid *) died*; this time: killed by SIGKILL",
        ]
    )
    records = dumped_records(pytester.path)
    assert "isolated" not in records["test_before"].extra
    assert "isolated" not in records["test_after"].extra
    assert records["test_kills_its_process"].extra["isolated"]["death"] == "killed by SIGKILL"


def test_auto_after_a_finished_session_isolates_nothing(pytester: pytest.Pytester):
    pytester.makepyfile("def test_a(): pass\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "tfmem_isolate=auto").assert_outcomes(passed=1)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "tfmem_isolate=auto")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["tfmem: the session started * (pid *) finished; 0 test(s) to isolate (journal *)"])
    result.stdout.no_fnmatch_line("*tfmem: isolated tests*")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tfmem-isolate=maybe"], "*argument --tfmem-isolate: ignored explicit argument 'maybe'*"),
        (["-o", "tfmem_isolate=sometimes"],
         "*ini tfmem_isolate value 'sometimes': expected true/false (also 1/0, yes/no, on/off); or auto"),
    ],
)
def test_bad_isolate_values_are_usage_errors(pytester: pytest.Pytester, args: list[str], message: str):
    pytester.makepyfile("def test_a(): pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.parametrize(
    ("args", "isolated"),
    [
        (["--tfmem-isolate", "test_a.py"], True),  # a switch: the path stays a path
        (["--tfmem-isolate=auto", "--no-tfmem-isolate"], False),  # the last one wins
        (["--no-tfmem-isolate", "--tfmem-isolate=auto"], False),  # auto: nothing to isolate yet
    ],
)
def test_the_isolate_switch_and_auto(pytester: pytest.Pytester, args: list[str], isolated: bool):
    pytester.makepyfile(test_a="def test_a(): pass\n", test_b="def test_b(): pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=1 if "test_a.py" in args else 2)
    assert ("tfmem: isolated tests" in result.stdout.str()) is isolated
