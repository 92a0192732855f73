"""Every use of a pytest internal, one small function each: what pytest offers no public API for.

A change in pytest then breaks here, and ``tests/test_pytest_internals.py`` says which one.
Code elsewhere in the package calls these functions and reaches no ``_private`` attribute or
``_pytest`` module itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from _pytest._code.code import ExceptionRepr


def unittest_error(item: pytest.Item) -> BaseException | None:
    """What a ``unittest.TestCase`` method raised. unittest catches it; pytest keeps it on the
    item (``TestCaseFunction._excinfo``) until the report is made."""
    excinfo = getattr(item, "_excinfo", None)
    return excinfo[0].value if excinfo else None


def fixture_argnames(item: pytest.Function) -> tuple[str, ...]:
    """The names the test function itself takes (not the autouse fixtures ``funcargs`` also
    holds): what calling its body again passes. pytest keeps them in ``_fixtureinfo``."""
    return tuple(item._fixtureinfo.argnames)


def read_global_capture(config: pytest.Config) -> tuple[str, str] | None:
    """What was printed since the last read (stdout, stderr), as pytest's capture manager reads
    it between phases; ``None`` when capturing is off or not started. The capture manager's
    methods are not public API."""
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        return None
    try:
        out, err = capture.read_global_capture()
    except (AssertionError, AttributeError):  # capturing not started (pytest internals differ)
        return None
    return out, err


def teardown_exact(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Tear down the fixtures ``nextitem`` no longer needs, as pytest's teardown phase does
    (``Session._setupstate``): for a test whose phases ran in another process."""
    item.session._setupstate.teardown_exact(nextitem)


def tmp_path_factory(config: pytest.Config) -> pytest.TempPathFactory | None:
    """The session's ``tmp_path_factory`` (``config._tmp_path_factory``, made at configure by
    pytest's tmpdir plugin), outside a fixture; ``None`` when that plugin is off."""
    return getattr(config, "_tmp_path_factory", None)


def move_basetemp(config: pytest.Config, basetemp: Path) -> None:
    """Make ``tmp_path`` and friends live below ``basetemp`` from now on, as if ``--basetemp``
    had been given: a fork of a configured session gets its own directory. The factory has no
    public setter; its next use creates the directory."""
    factory = tmp_path_factory(config)
    if factory is not None:
        factory._given_basetemp = basetemp
        factory._basetemp = None


def evaluate_xfail(item: pytest.Item) -> None:
    """Evaluate the item's ``xfail`` marks now, as pytest does during set-up: for a report made
    where set-up did not run (``_pytest.skipping``'s stash key and evaluator)."""
    from _pytest import skipping

    item.stash[skipping.xfailed_key] = skipping.evaluate_xfail_marks(item)


def is_pytest_logging_handler(handler: logging.Handler) -> bool:
    """One of pytest's own logging handlers (log capture, log file, live logging), which live
    in ``_pytest.logging``: a fork of the session leaves them behind."""
    return type(handler).__module__ == "_pytest.logging"


def release_fixture_values(item: pytest.Item) -> None:
    """Let go of the fixture values a test was given, as pytest does once its teardown hooks
    are over (``runtestprotocol`` sets ``item.funcargs = None``): a reading taken at the end of
    the teardown would otherwise still count a torn-down fixture's value as held."""
    funcargs = getattr(item, "funcargs", None)
    if isinstance(funcargs, dict):
        funcargs.clear()


def set_failure_message(
    report: pytest.TestReport, lines: list[str], help_line: str, leave_out: Callable[[str], bool] | None = None
) -> None:
    """The message of a failure raised with ``pytrace=False`` (tfmem's checks) as the report shows
    it: ``lines`` and then ``help_line`` in the failure's block (``ReprEntry.lines`` of its one
    entry), and in the short summary line, read from ``reprcrash.message``, the lines joined
    (less those ``leave_out`` is true of), without the exception's module path that pytest puts
    first (its figures then fit in the first 80 columns)."""
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    if crash is None:
        return
    short = [line for line in lines if leave_out is None or not leave_out(line)] or lines
    crash.message = "; ".join([short[0], *(line.removeprefix("tfmem: ") for line in short[1:])])
    traceback = getattr(longrepr, "reprtraceback", None)
    entries = getattr(traceback, "reprentries", [])
    if getattr(traceback, "style", None) == "value" and len(entries) == 1:
        entries[0].lines[:] = [*lines, help_line]


def shown_as_a_test_failure(item: pytest.Item, report: pytest.TestReport,
                            excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    """A failure raised with ``pytrace=False`` shown as pytest shows it on its own items (the
    message, no traceback), whatever the item's own ``repr_failure`` made of it: an item type that
    renders only its own failures (nbmake's notebooks: "NBMAKE INTERNAL ERROR" and a traceback
    through pluggy) shows tfmem's as a test's. ``Node._repr_failure_py`` is pytest's own rendering."""
    if not isinstance(report.longrepr, ExceptionRepr):
        report.longrepr = item._repr_failure_py(excinfo, style="value")


def unknown_ini_keys(config: pytest.Config) -> set[str]:
    """The ini file's keys (and ``-o NAME=VALUE`` overrides) that no plugin declared: what pytest
    itself only warns about (``Unknown config option``) from ``Config._get_unknown_ini_keys``."""
    return set(config._get_unknown_ini_keys())


def shown_at_the_end(config: pytest.Config) -> str:
    """The letters of the terminal's end-of-session summaries (``-r``: ``P`` passed tests' output,
    ``X`` xpassed ones', ``-rA`` expanded), as the terminal reads them: ``getreportopt``."""
    from _pytest.terminal import getreportopt

    return getreportopt(config)


def writes_junit_xml(config: pytest.Config) -> bool:
    """pytest's JUnit XML writer is on in this process (``--junitxml``; not on a pytest-xdist
    worker, where pytest leaves it off): from ``_pytest.junitxml.xml_key``."""
    from _pytest.junitxml import xml_key

    return config.stash.get(xml_key, None) is not None


def is_direct_parameter(fixturedef: pytest.FixtureDef[object]) -> bool:
    """The pseudo-fixture pytest makes for a ``parametrize`` argument (it hands the value over
    and runs no code of the test's): ``_pytest.python.get_direct_param_fixture_func``."""
    from _pytest.python import get_direct_param_fixture_func

    return fixturedef.func is get_direct_param_fixture_func
