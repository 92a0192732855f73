"""The pytest internals the plugin relies on (``core/pytest_internals.py``), each as relied on.

One inner pytest run: each inner test exercises one internal the way the plugin uses it, and
is named after it, so a pytest release that changes one fails here by name.
"""

from __future__ import annotations

import logging

import pytest

CONFTEST = """
import pytest

from pytest_tfmem.core import pytest_internals

SEEN = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        return (yield)
    finally:
        if item.name == "test_unittest_method":
            SEEN["unittest_error"] = pytest_internals.unittest_error(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if item.name != "test_xfail_marks_are_evaluated_for_a_report_made_outside_set_up":
        return None
    # as isolation does: set-up ran elsewhere, the report is made here
    pytest_internals.evaluate_xfail(item)
    call = pytest.CallInfo.from_call(lambda: int("not a number"), when="call")
    report = item.ihook.pytest_runtest_makereport(item=item, call=call)
    SEEN["xfail"] = (report.outcome, getattr(report, "wasxfail", None))
    return True
"""

TESTS = """
import logging
import os
import unittest

import pytest

from pytest_tfmem.core import pytest_internals
from conftest import SEEN

EVENTS = []


@pytest.fixture(scope="module")
def module_resource():
    EVENTS.append("set up")
    yield
    EVENTS.append("torn down")


@pytest.fixture(autouse=True)
def automatic():
    pass


class Case(unittest.TestCase):
    def test_unittest_method(self):
        raise KeyError("kept on the item")


def test_item__excinfo_holds_what_the_unittest_method_raised():
    error = SEEN["unittest_error"]
    assert isinstance(error, KeyError) and error.args == ("kept on the item",), error


def test_item__fixtureinfo_argnames_are_the_functions_own_arguments(tmp_path, request):
    assert pytest_internals.fixture_argnames(request.node) == ("tmp_path", "request")


def test_capture_manager_read_global_capture_reads_what_was_printed_since(request):
    pytest_internals.read_global_capture(request.config)
    print("printed")
    os.write(2, b"")
    assert pytest_internals.read_global_capture(request.config) == ("printed\\n", "")
    assert pytest_internals.read_global_capture(request.config) == ("", "")


def test_config__tmp_path_factory_is_the_fixtures(tmp_path_factory, request):
    assert pytest_internals.tmp_path_factory(request.config) is tmp_path_factory


def test_factory__given_basetemp_moves_the_base_directory(request, tmp_path_factory):
    target = tmp_path_factory.getbasetemp() / "moved"
    pytest_internals.move_basetemp(request.config, target)
    assert tmp_path_factory.getbasetemp() == target and target.is_dir()
    assert tmp_path_factory.mktemp("made").parent == target


def test_pytest_logging_handlers_are_told_apart():
    handlers = logging.root.handlers  # pytest's log capture is on during the test
    assert any(pytest_internals.is_pytest_logging_handler(h) for h in handlers), handlers
    assert not pytest_internals.is_pytest_logging_handler(logging.StreamHandler())


@pytest.mark.xfail(raises=ValueError, strict=True)
def test_xfail_marks_are_evaluated_for_a_report_made_outside_set_up():
    pass


def test_the_xfail_report_came_out_xfailed():
    assert SEEN["xfail"] == ("skipped", ""), SEEN["xfail"]


def test_session__setupstate_teardown_exact_finishes_what_no_next_test_needs(module_resource, request):
    assert EVENTS == ["set up"]
    pytest_internals.teardown_exact(request.node, None)
    assert EVENTS == ["set up", "torn down"]
"""


def test_every_internal_behaves_as_the_plugin_relies_on(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_internals=TESTS)
    result = pytester.runpytest_inprocess("-v", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:rerunfailures", "--tfmem-trace=off")
    # the unittest method fails (its error is what is read); the rest pass
    result.assert_outcomes(passed=8, failed=1)  # the xfail test is reported by its own check
    result.stdout.fnmatch_lines(["*::Case::test_unittest_method FAILED*"])


def test_the_internals_exist_where_they_are_read() -> None:
    """The names themselves, so that a rename says which one went."""
    from _pytest import logging as pytest_logging, skipping
    from _pytest.capture import CaptureManager
    from _pytest.runner import SetupState
    from _pytest.tmpdir import TempPathFactory
    from _pytest.unittest import TestCaseFunction

    assert isinstance(skipping.xfailed_key, pytest.StashKey) and callable(skipping.evaluate_xfail_marks)
    assert pytest_logging.LogCaptureHandler.__module__ == "_pytest.logging"
    assert issubclass(pytest_logging.LogCaptureHandler, logging.Handler)
    assert callable(CaptureManager.read_global_capture)
    assert callable(SetupState.teardown_exact)
    assert {"_given_basetemp", "_basetemp"} <= set(TempPathFactory.__dataclass_fields__)
    assert "_excinfo" in TestCaseFunction.__annotations__
    assert "_fixtureinfo" in pytest.Function.__init__.__code__.co_names
