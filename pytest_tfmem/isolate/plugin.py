"""Isolated runs: a test in a process of its own, watched, killed at ``kill_at``, reported here.

An isolated test runs in a fork of the session's template process (``launch.py``,
``template.py``), or in a fresh interpreter (``child.py``) where forking is not wanted or
not safe; either way with the session's own arguments, so plugins, fixtures, markers and
options are the same. Its reports come back serialised by pytest's own hooks
and are logged as this item's reports: the terminal, JUnit XML, pytest-xdist and tfmem's
own summary see an ordinary test. Meanwhile a ``Watchdog`` samples the child's process
tree and kills it at ``kill_at``. A child that dies before reporting (killed at the limit,
or by a signal tfmem did not send: SIGKILL from the OOM killer, SIGSEGV, SIGABRT) fails
that test with the signal, the readings and the memory available; the session goes on.
"""

from __future__ import annotations

import functools
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from pytest_tfmem import frameworks, platforms
from pytest_tfmem.core import features, processes, pytest_internals, settings
from pytest_tfmem.core.features import Summary
from pytest_tfmem.core.manager import ARGUMENTS, RECORD, manager
from pytest_tfmem.core.record import TestRecord, publish
from pytest_tfmem.core.subsession import output_excerpt
from pytest_tfmem.core.summary import render_table
from pytest_tfmem.core.verdict import Verdict
from pytest_tfmem.errors import MemoryLimitWarning, failure_for
from pytest_tfmem.isolate.auto import AUTO, tests_to_isolate
from pytest_tfmem.isolate.child import ChildSpec, read_events
from pytest_tfmem.isolate.launch import FORK, SPAWN, Launcher, parse_start
from pytest_tfmem.isolate.limit import (
    AUTO as LIMIT_AUTO,
    SESSION_LIMIT,
    STARTED_PROPERTY,
    LimitSummary,
    LimitWatch,
    auto_limit,
    limit_setting,
)
from pytest_tfmem.isolate.recycle import DelegatedTest, Replacements, remaining_targets
from pytest_tfmem.isolate.replacement import ReplacementSpec
from pytest_tfmem.isolate.results import (
    PROCESS_PEAK_PROPERTY,
    add_isolated_numbers,
    death_message,
    died_in_call,
    isolated_rows,
    isolated_section,
    ran_to_its_end,
    reissue_warnings,
    sampled_measurement,
)
from pytest_tfmem.isolate.template import fork_unsafe_reason
from pytest_tfmem.journal.format import results_path
from pytest_tfmem.probes import system
from pytest_tfmem.probes.watchdog import Watchdog, WatchResult
from pytest_tfmem.units import SIZE_FORMS, format_size

_AUTO_KEY = "tfmem_isolate_auto"
WATCH_INTERVAL_S = 0.02
OUTPUT_LINES = 30

ISOLATE = settings.Option(
    "isolate",
    "run each test in a process of its own, watched by tfmem (marker: isolate=True)",
    settings.parse_bool,
    False,
    flag=True,
)
KILL_AT = settings.Option(
    "kill_at",
    "kill an isolated test's process tree when its resident memory reaches this size; a test "
    f"with a kill_at runs isolated; {SIZE_FORMS}",
    settings.parse_optional_size,
)
ISOLATE_START = settings.Option(
    "isolate_start",
    f"how an isolated test's process starts: {FORK} (default on Linux; a fork of a template process "
    f"that has pytest, the plugins and TensorFlow loaded) or {SPAWN} (a fresh interpreter per test; "
    "the default where the platform does not fork: macOS, Windows, --tfmem-platform=portable)",
    parse_start,
    FORK,
)


class IsolationStartWarning(pytest.PytestWarning):
    """Isolated tests start as fresh interpreters although forking was asked for (and why)."""


@dataclass(frozen=True)
class IsolationPolicy:
    kill_at: int | None
    reason: str | None = None  # why --tfmem-isolate=auto isolates the test


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser, [ISOLATE, KILL_AT, ISOLATE_START, SESSION_LIMIT])
    # An option string of its own: "--tfmem-isolate" stays a switch that takes no value, so
    # "pytest --tfmem-isolate tests/" keeps "tests/" as a path.
    parser.getgroup("tfmem").addoption(
        f"{ISOLATE.cli}={AUTO}", action="store_const", const=AUTO, default=None, dest=ISOLATE.ini,
        help=f"isolate only the tests the results journal shows running when the last session died, "
        f"or killed in their isolated process [ini: {ISOLATE.ini} = {AUTO}]",
    )


def read_isolate(config: pytest.Config) -> bool | str:
    """``--tfmem-isolate`` / ini ``tfmem_isolate``: true, false or ``auto``."""
    given = config.getoption(ISOLATE.ini, default=None)
    if given == AUTO or (given is None and str(config.getini(ISOLATE.ini) or "").strip().lower() == AUTO):
        return AUTO
    try:
        return bool(settings.read_option(config, ISOLATE)[0])
    except pytest.UsageError as error:
        raise pytest.UsageError(f"{error}; or {AUTO}") from None


TFMEM_DECLARATIONS = features.Declarations(
    marker_keywords={"isolate": settings.parse_bool, "kill_at": settings.parse_optional_size}
)


def pytest_configure(config: pytest.Config) -> None:
    role = processes.role(config)
    if role is processes.Role.CHILD:
        return
    isolation = TfmemIsolation(config)
    config.pluginmanager.register(isolation, "tfmem-isolation")
    manager(config).add_summary(Summary.ISOLATE, isolation.write_summary)
    manager(config).add_reader(IsolatedRecords, IsolatedRecords)
    if role.writes_session_outputs:
        isolation.warn_about_global_limits()


def target_argument(item: pytest.Item) -> str:
    """The command-line argument that collects exactly this item, from any directory."""
    _, separator, name = item.nodeid.partition("::")
    return f"{item.path}{separator}{name}"


class TfmemIsolation:
    """Runs isolated tests in child processes; warns about limits; lists isolated tests."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        isolate = read_isolate(config)
        self.isolate = isolate is True
        self.auto = isolate == AUTO
        self._auto_reasons: dict[str, str] | None = None
        self.auto_note = ""
        self.kill_at = settings.read_option(config, KILL_AT)[0]
        self.start_method, self._start_given = settings.read_option(config, ISOLATE_START)
        if self._start_given and self.start_method == FORK and (missing := platforms.current().fork_missing()):
            raise pytest.UsageError(
                f"pytest-tfmem: {ISOLATE_START.cli}={FORK} is not available on {platforms.current().name}: "
                f"{missing}; use {ISOLATE_START.cli}={SPAWN} (the default there)"
            )
        self.launcher: Launcher | None = None
        self._fallback_told = False
        self._configured_unsafe: str | None = None  # why no template could fork (``pytest_sessionstart``)
        self.session_limit = limit_setting(config)
        self.limit_summary = LimitSummary(self.session_limit) if self.session_limit is not None else None
        self.watch: LimitWatch | None = None
        self.replacements = Replacements(self._launcher_and_dir, self._workdir, self._replacement_spec)
        if self.session_limit is not None and processes.role(config).runs_tests:
            self.watch = LimitWatch(self._limit_bytes(), 0, os.getpid(), processes.worker_id(config))
            config.pluginmanager.register(self.watch, "tfmem-session-limit")

    @functools.cached_property
    def limit(self) -> system.MemoryLimit:
        """The memory limit that applies (read at its first use: an inert session reads nothing)."""
        return system.applicable_memory_limit()

    def _limit_bytes(self) -> int | Callable[[int], int]:
        """The session limit in bytes, or (``auto``) how to make it from the level at the first test."""
        if self.session_limit != LIMIT_AUTO:
            assert isinstance(self.session_limit, int)
            return self.session_limit
        workers = int(getattr(self.config, "workerinput", {}).get("workercount", 1))
        return lambda start: auto_limit(start, self.limit, workers)

    # -- policy and warnings --------------------------------------------------------------

    def pytest_tfmem_measure_all(self) -> bool:
        """Isolated by an option, every test is measured, each in its own process; with
        ``auto``, every test is measured so that the journal follows each one."""
        return self.isolate or self.kill_at is not None or self.auto or self.session_limit is not None

    def policy_for(self, item: pytest.Item) -> IsolationPolicy | None:
        """How to isolate this test, or ``None`` to run it here (a ``kill_at`` implies isolation)."""
        arguments = item.stash.get(ARGUMENTS, {})
        kill_at = arguments.get("kill_at", self.kill_at)
        reason = self.auto_reasons().get(item.nodeid) if self.auto else None
        isolate = arguments.get("isolate", self.isolate or kill_at is not None or reason is not None)
        return IsolationPolicy(kill_at, reason) if isolate else None

    def auto_reasons(self) -> dict[str, str]:
        """``--tfmem-isolate=auto``: the tests to isolate and why, from the journal as the last
        session left it (read before this session's journal replaces it; xdist workers get
        the controller's reading)."""
        if self._auto_reasons is None:
            workerinput = getattr(self.config, "workerinput", None)
            if workerinput is not None and _AUTO_KEY in workerinput:
                self._auto_reasons, self.auto_note = workerinput[_AUTO_KEY]
            else:
                journal, _ = results_path(self.config)
                self._auto_reasons, self.auto_note = tests_to_isolate(journal)
        return self._auto_reasons

    @pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which starts the workers handed this reading
    def pytest_sessionstart(self) -> None:
        if self.auto:
            self.auto_reasons()
        # A runtime started while pytest configured (by a conftest.py file, a plugin) starts in a
        # template too, which configures as this session did: no template could fork, and starting
        # one would cost a fresh interpreter's imports for nothing.
        self._configured_unsafe = fork_unsafe_reason() if frameworks.started() else None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """pytest-xdist: workers isolate what the controller read in the journal."""
        if self.auto:
            node.workerinput[_AUTO_KEY] = (self.auto_reasons(), self.auto_note)

    def _above_limit(self, what: str, size: int | None) -> str | None:
        if size is None or size <= self.limit.bytes:
            return None
        return (
            f"pytest-tfmem: {what} {format_size(size)} is above the memory limit that applies, "
            f"{format_size(self.limit.bytes)} ({self.limit.source}): the kernel's OOM killer would act first"
        )

    def warn_about_global_limits(self) -> None:
        budget = settings.read_option(self.config, settings.BUDGET)[0]
        for what, size in (("--tfmem-budget", budget), ("--tfmem-kill-at", self.kill_at)):
            message = self._above_limit(what, size)
            if message:
                self.config.issue_config_time_warning(MemoryLimitWarning(message), stacklevel=2)

    def _warn_about_marker_limits(self, item: pytest.Item) -> None:
        """Warned when the test runs (so only tests that run, each once, with its own node id);
        not again in an isolated test's or a replacement's process, which relay warnings."""
        if processes.role(self.config) is processes.Role.CHILD:
            return
        arguments = item.stash.get(ARGUMENTS, {})
        for keyword in ("budget", "kill_at"):
            message = self._above_limit(f"tfmem marker argument {keyword}", arguments.get(keyword))
            if message:
                item.warn(MemoryLimitWarning(message))
        if arguments.get("isolate") is False and (arguments.get("kill_at") or self.kill_at):
            item.warn(MemoryLimitWarning("pytest-tfmem: isolate=False: kill_at is not enforced for this test"))

    # -- the isolated protocol -----------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)  # before pytest's own loop runs the first test
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        """Start the template before the first test, when a test will be isolated (or may run
        in a replacement process, with a session limit) and the template can be a fork of this
        process: no test has run here yet, so TensorFlow's runtime is started only if importing
        the tests started it, and no test has left anything in it. (A template that must be a
        fresh interpreter starts at the first isolated test: under pytest-xdist a worker may
        never get one, and such a template costs an import of TensorFlow.)"""
        option = self.config.option
        if (
            self.start_method != FORK
            or getattr(option, "collectonly", False)
            or getattr(option, "setuponly", False)
            or getattr(option, "setupplan", False)
            or (session.testsfailed and not option.continue_on_collection_errors)
        ):
            return
        will_isolate = self.watch is not None or any(self.policy_for(item) for item in session.items)
        if will_isolate and fork_unsafe_reason() is None:
            self._launcher().prepare(self._template_dir)

    @pytest.hookimpl(tryfirst=True)  # instead of pytest's own runner (first result wins)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        self._warn_about_marker_limits(item)
        policy = self.policy_for(item)
        delegate = policy is None and self.watch is not None and self.watch.crossing is not None
        if (policy is None and not delegate) or self.config.getoption("setuponly", False) or self.config.getoption(
            "setupplan", False
        ):
            return None
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        reports = self.run_isolated(item, policy) if policy is not None else self.run_delegated(item, nextitem)
        for report in reports:
            ihook.pytest_runtest_logreport(report=report)
        self._teardown_parent_fixtures(item, nextitem)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _teardown_parent_fixtures(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """Finish this process's fixtures the next test no longer needs, as pytest's own
        teardown phase would; an error there is reported as this test's teardown error."""
        if item.session.shouldfail or item.session.shouldstop:
            nextitem = None
        call = pytest.CallInfo.from_call(lambda: pytest_internals.teardown_exact(item, nextitem), when="teardown")
        if call.excinfo is not None:
            item.ihook.pytest_runtest_logreport(report=_report_made_here(item, call))

    def _launcher_and_dir(self) -> tuple[Launcher, Path]:
        return self._launcher(), self._template_dir

    def _launcher(self) -> Launcher:
        if self.launcher is None:
            self._template_dir = self._workdir("tfmem-template")
            # the default where the platform does not fork: spawned (the session header says why)
            default_spawn = not self._start_given and platforms.current().fork_missing() is not None
            self.launcher = Launcher(
                SPAWN if default_spawn else self.start_method,
                list(self.config.invocation_params.args),
                self.config.invocation_params.dir,
                processes.session(self.config).to_dict(),
                manager(self.config).template_pids,
            )
            if self._configured_unsafe is not None:
                self.launcher.spawn_instead(self._configured_unsafe)
        return self.launcher

    def _tell_fallback(self) -> None:
        """Once per process: isolated tests are spawned although forking was asked for."""
        assert self.launcher is not None
        if self.launcher.fallback is None or self._fallback_told:
            return
        self._fallback_told = True
        warnings.warn(
            IsolationStartWarning(
                f"pytest-tfmem: isolated tests start as fresh interpreters, not as forks of a template "
                f"process: {self.launcher.fallback}"
            ),
            stacklevel=1,
        )

    def pytest_report_header(self, config: pytest.Config) -> str | None:
        if self.start_method == SPAWN and self._start_given:
            return "tfmem: isolated tests start as fresh interpreters (tfmem_isolate_start = spawn)"
        return None

    def pytest_unconfigure(self) -> None:
        self.replacements.close()
        if self.launcher is not None:
            self.launcher.close()

    def _workdir(self, name: str = "tfmem-isolated") -> Path:
        factory = pytest_internals.tmp_path_factory(self.config)
        if factory is not None:
            return factory.mktemp(name, numbered=True)
        return Path(tempfile.mkdtemp(prefix=f"{name}-"))

    def run_isolated(self, item: pytest.Item, policy: IsolationPolicy) -> list[pytest.TestReport]:
        """Run the test in a child process; return its reports as this process's reports."""
        workdir = self._workdir()
        spec = ChildSpec(
            args=list(self.config.invocation_params.args),
            nodeid=item.nodeid,
            target=target_argument(item),
            events=str(workdir / "events.jsonl"),
            basetemp=str(workdir / "basetemp"),
            parent_pid=os.getpid(),
            session=processes.session(self.config).to_dict(),
        )
        process = self._launcher().start(spec, workdir, self._template_dir)
        self._tell_fallback()
        result = Watchdog(process, policy.kill_at, WATCH_INTERVAL_S).wait()
        return self._relayed_reports(item, policy, result, read_events(Path(spec.events)), workdir / "output.log")

    def run_delegated(self, item: pytest.Item, nextitem: pytest.Item | None) -> list[pytest.TestReport]:
        """Run the test in this process's replacement process; return its reports as this
        process's, the reports of an ordinary test."""
        items = item.session.items
        index = None if processes.role(self.config) is processes.Role.WORKER else items.index(item)
        test, started = self.replacements.submit(
            item.nodeid,
            nextitem.nodeid if nextitem is not None else None,
            item.session.testsfailed,
            lambda: remaining_targets(items, index),
        )
        self._tell_fallback()
        result = Watchdog(test, None, WATCH_INTERVAL_S).wait()
        self.replacements.finished(test)
        if test.replacement.ended and result.returncode == pytest.ExitCode.INTERRUPTED:
            raise KeyboardInterrupt  # the test was interrupted there: the session stops, as it would here
        reports = self._relayed_reports(
            item, IsolationPolicy(None), result, test.events, test.replacement.output, delegated=test
        )
        if started is not None and reports:
            reports[0].user_properties.append((STARTED_PROPERTY, started.to_json()))
        return reports

    def _replacement_spec(self, number: int, workdir: Path, targets: list[str]) -> ReplacementSpec:
        assert self.watch is not None and self.watch.limit is not None
        return ReplacementSpec(
            args=list(self.config.invocation_params.args),
            targets=targets,
            basetemp=str(workdir / "basetemp"),
            parent_pid=os.getpid(),
            session=processes.session(self.config).to_dict(),
            output=str(workdir / "output.log"),
            limit=self.watch.limit,
            number=number,
            worker=processes.worker_id(self.config),
        )

    def _relayed_reports(
        self,
        item: pytest.Item,
        policy: IsolationPolicy,
        result: WatchResult,
        events: list[dict[str, Any]],
        output_log: Path,
        delegated: DelegatedTest | None = None,
    ) -> list[pytest.TestReport]:
        """The reports another process sent for the test, as this process's; an isolated test's
        carry the isolated run's numbers. A test whose process died before reporting all its
        phases fails with the death's account."""
        reissue_warnings(events)
        reports = [
            self.config.hook.pytest_report_from_serializable(config=self.config, data=event["report"])
            for event in events
            if event["event"] == "report"
        ]
        for report in reports:
            if isinstance(report.longrepr, list):  # a skip's (path, line, reason), listified by JSON
                report.longrepr = tuple(report.longrepr)
        isolated = isolated_section(result, events, reports)
        if policy.reason is not None:
            isolated["reason"] = policy.reason
        if delegated is None:
            for report in reports:
                add_isolated_numbers(report, isolated)
        if not ran_to_its_end(reports, events):
            # A SIGKILLed process leaves no last words; a crash (SIGSEGV, abort) or an exit
            # before reporting usually does (Python's fault report, an error message).
            sigkilled = result.signal == "SIGKILL" or result.killed_at_limit
            excerpt = "" if sigkilled else output_excerpt(output_log, OUTPUT_LINES)
            reports += self._died_reports(item, policy, reports, events, result, isolated, excerpt, delegated)
        return reports

    def _died_reports(
        self,
        item: pytest.Item,
        policy: IsolationPolicy,
        reports: list[pytest.TestReport],
        events: list[dict[str, Any]],
        result: WatchResult,
        isolated: dict[str, Any],
        output: str,
        delegated: DelegatedTest | None,
    ) -> list[pytest.TestReport]:
        """A failure report for the phase the child died in, and an empty teardown after it."""
        phases = {report.when: report for report in reports}
        phase: Literal["setup", "call", "teardown"]
        if died_in_call(events):
            phase = "call"
        elif "setup" not in phases:
            phase = "setup"
        elif phases["setup"].passed and "call" not in phases:
            phase = "call"
        else:
            phase = "teardown"
        if delegated is None:
            check, message = death_message(policy.kill_at, events, result, self.limit)
        else:
            process = f"the replacement process running this test (pid {delegated.pid})"
            check, message = death_message(None, events, result, self.limit, process, ended=delegated.replacement.ended)
        record = TestRecord(
            item.nodeid,
            sampled_measurement(result, isolated["call_start_rss"], WATCH_INTERVAL_S),
            budget=manager(self.config).budget_for(item),
            verdicts=[Verdict(check, False, message)],
            extra={"isolated": isolated},
        )
        failure = failure_for(check, message)

        def raise_failure() -> None:
            raise failure

        _evaluate_xfail(item)
        item.stash[RECORD] = record  # the core adds its section to the call report
        publish(item, record)  # reports made from the item carry it
        item.user_properties.append((PROCESS_PEAK_PROPERTY, isolated["process_peak"]))
        report = _report_made_here(item, pytest.CallInfo.from_call(raise_failure, phase))
        report.duration = result.elapsed_s  # the child's whole run: the phase's own share is unknown
        if output:
            report.sections.append(("isolated process output", output))
        died = [report]
        if phase != "teardown":
            teardown = pytest.CallInfo.from_call(lambda: None, "teardown")
            died.append(item.ihook.pytest_runtest_makereport(item=item, call=teardown))
        return died

    # -- the summary of isolated tests ------------------------------------------------------

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.limit_summary is not None:
            self.limit_summary.read(report)

    def write_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        isolated_records = manager(self.config).reader(IsolatedRecords).records
        if self.auto:
            terminalreporter.write_sep("=", f"tfmem: {ISOLATE.cli}={AUTO}")
            terminalreporter.write_line(f"tfmem: {self.auto_note}")
            for record in isolated_records:
                reason = record.extra["isolated"].get("reason")
                if reason:
                    result = record.extra["isolated"].get("death") or record.outcome or ""
                    terminalreporter.write_line(f"{record.nodeid}: isolated: {reason}; this time: {result}")
        if self.limit_summary is not None and processes.role(self.config).writes_session_outputs:
            terminalreporter.write_sep("=", self.limit_summary.title())
            for line in self.limit_summary.lines():
                terminalreporter.write_line(line)
        if not isolated_records:
            return
        terminalreporter.write_sep("=", "tfmem: isolated tests (measured in the child; the child's own peak)")
        for line in render_table(isolated_rows(isolated_records)):
            terminalreporter.write_line(line)


class IsolatedRecords:
    """The records of the tests run isolated (one per test: pytest-rerunfailures' last attempt),
    gathered one record at a time (``TfmemManager.reader``)."""

    def __init__(self) -> None:
        self.records: list[TestRecord] = []

    def add(self, record: TestRecord) -> None:
        if "isolated" in record.extra:
            self.records.append(record)


def _report_made_here(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """The report of a phase of an isolated test made in this process, not in the test's own.

    Its set-up was reported in its own process. Plugins that keep a test's state from its
    set-up's ``pytest_runtest_makereport`` on (pytest-rerunfailures does, installed, with or
    without ``--reruns``) are shown one here first, so that the report of a later phase finds it.
    """
    if call.when != "setup":
        item.ihook.pytest_runtest_makereport(item=item, call=pytest.CallInfo.from_call(lambda: None, "setup"))
    return item.ihook.pytest_runtest_makereport(item=item, call=call)


def _evaluate_xfail(item: pytest.Item) -> None:
    """Let ``@pytest.mark.xfail(raises=KilledAtLimit)`` apply to a report made here, as it
    would have in the child (pytest evaluates xfail marks during set-up, which ran there)."""
    pytest_internals.evaluate_xfail(item)
