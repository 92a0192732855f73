"""Which process of a session this is, and the one session every process serves."""

from __future__ import annotations

import json

import pytest

# Each process of the session says what it is, once it is done.
CONFTEST = """
import json, os
from pytest_tfmem.core import processes

def pytest_sessionfinish(session):
    config = session.config
    shared = processes.session(config)
    facts = {"role": processes.role(config).value, "worker": processes.worker_id(config),
             "session": shared.id, "session_pid": shared.pid, "pid": os.getpid()}
    with open(os.path.join(str(config.rootpath), f"process-{os.getpid()}.json"), "w") as out:
        json.dump(facts, out)
"""

TESTS = """
import pytest

def test_plain():
    pass

@pytest.mark.tfmem(isolate=True)
def test_isolated():
    pass
"""


def _processes(pytester: pytest.Pytester) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(pytester.path.glob("process-*.json"))]


def test_without_xdist_the_main_process_runs_the_tests_and_an_isolated_one_serves_its_session(
    pytester: pytest.Pytester,
):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(TESTS)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)
    found = _processes(pytester)
    assert sorted(p["role"] for p in found) == ["child", "main"]
    main = next(p for p in found if p["role"] == "main")
    assert main["session_pid"] == main["pid"] and main["worker"] is None
    assert {p["session"] for p in found} == {main["session"]}  # the child serves the main's session


def test_under_xdist_the_controller_workers_and_isolated_tests_serve_one_session(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(TESTS)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2").assert_outcomes(passed=2)
    found = _processes(pytester)
    assert sorted(p["role"] for p in found) == ["child", "controller", "worker", "worker"]
    controller = next(p for p in found if p["role"] == "controller")
    assert sorted(p["worker"] for p in found if p["role"] == "worker") == ["gw0", "gw1"]
    assert {p["session"] for p in found} == {controller["session"]}
    assert {p["session_pid"] for p in found} == {controller["pid"]}
