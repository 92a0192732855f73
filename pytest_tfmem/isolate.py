"""Isolated runs: a test in a fresh interpreter, watched, killed at ``kill_at``, reported here.

An isolated test runs in a new Python process (spawned, never forked: TensorFlow is not
fork-safe) started with the session's own arguments (``child.py``), so plugins, fixtures,
markers and options are the same. Its reports come back serialised by pytest's own hooks
and are logged as this item's reports: the terminal, JUnit XML, pytest-xdist and tfmem's
own summary see an ordinary test. Meanwhile a ``Watchdog`` samples the child's process
tree and kills it at ``kill_at``. A child that dies before reporting (killed at the limit,
or by a signal tfmem did not send: SIGKILL from the OOM killer, SIGSEGV, SIGABRT) fails
that test with the signal, the readings and the memory available; the session goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import plugin, settings
from .checks import Verdict
from .child import IN_CHILD, ChildSpec, read_events
from .errors import FAILURE_BY_CHECK, TfmemFailure
from .measure import Measurement, ViewReading
from .probes import system
from .records import PROPERTY, TestRecord, record_from_report
from .report import render_table
from .units import SIZE_FORMS, format_size
from .watchdog import WatchResult, Watchdog, describe_signal, downsample

PLUGIN_NAME = "tfmem-isolation"
WATCH_INTERVAL_S = 0.02
OUTPUT_LINES = 30

ISOLATE = settings.Option(
    "isolate",
    "run each test in a fresh Python process, watched by tfmem (marker: isolate=True)",
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
settings.MARKER_KEYWORDS["isolate"] = settings.parse_bool
settings.MARKER_KEYWORDS["kill_at"] = settings.parse_optional_size


class IsolatedTestDied(TfmemFailure):
    """The isolated test's process ended before it could report the test."""


class KilledAtLimit(IsolatedTestDied):
    """tfmem's watchdog killed the isolated test at its ``kill_at`` limit."""


class KilledBySignal(IsolatedTestDied):
    """The isolated test's process died of a signal tfmem did not send (OOM killer, crash)."""


FAILURE_BY_CHECK.update({"kill_at": KilledAtLimit, "signal": KilledBySignal, "died": IsolatedTestDied})


class MemoryLimitWarning(pytest.PytestWarning):
    """A budget or ``kill_at`` above the memory limit that applies: the OOM killer comes first."""


@dataclass(frozen=True)
class IsolationPolicy:
    kill_at: int | None


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser, [ISOLATE, KILL_AT])


def pytest_configure(config: pytest.Config) -> None:
    if IN_CHILD in config.stash:
        return
    isolation = TfmemIsolation(config)
    config.pluginmanager.register(isolation, PLUGIN_NAME)
    if not hasattr(config, "workerinput"):
        isolation.warn_about_global_limits()


def target_argument(item: pytest.Item) -> str:
    """The command-line argument that collects exactly this item, from any directory."""
    _, separator, name = item.nodeid.partition("::")
    return f"{item.path}{separator}{name}"


class TfmemIsolation:
    """Runs isolated tests in child processes; warns about limits; lists isolated tests."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.isolate = settings.read_option(config, ISOLATE)[0]
        self.kill_at = settings.read_option(config, KILL_AT)[0]
        self.limit = system.applicable_memory_limit()
        self.isolated_records: list[TestRecord] = []

    # -- policy and warnings --------------------------------------------------------------

    def policy_for(self, item: pytest.Item) -> IsolationPolicy | None:
        """How to isolate this test, or ``None`` to run it here (a ``kill_at`` implies isolation)."""
        arguments = item.stash.get(plugin.ARGUMENTS, {})
        kill_at = arguments["kill_at"] if "kill_at" in arguments else self.kill_at
        isolate = arguments["isolate"] if "isolate" in arguments else (self.isolate or kill_at is not None)
        return IsolationPolicy(kill_at) if isolate else None

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

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            arguments = item.stash.get(plugin.ARGUMENTS, {})
            for keyword in ("budget", "kill_at"):
                message = self._above_limit(f"tfmem marker argument {keyword}", arguments.get(keyword))
                if message:
                    item.warn(MemoryLimitWarning(message))
            if arguments.get("isolate") is False and (arguments.get("kill_at") or self.kill_at):
                item.warn(MemoryLimitWarning("pytest-tfmem: isolate=False: kill_at is not enforced for this test"))

    # -- the isolated protocol -----------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        policy = self.policy_for(item)
        if policy is None or self.config.getoption("setuponly", False) or self.config.getoption("setupplan", False):
            return None
        ihook = item.ihook
        ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        for report in self.run_isolated(item, policy):
            ihook.pytest_runtest_logreport(report=report)
        self._teardown_parent_fixtures(item, nextitem)
        ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _teardown_parent_fixtures(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        """Finish this process's fixtures the next test no longer needs, as pytest's own
        teardown phase would; an error there is reported as this test's teardown error."""
        if item.session.shouldfail or item.session.shouldstop:
            nextitem = None
        call = pytest.CallInfo.from_call(
            lambda: item.session._setupstate.teardown_exact(nextitem), when="teardown"
        )
        if call.excinfo is not None:
            item.ihook.pytest_runtest_logreport(report=item.ihook.pytest_runtest_makereport(item=item, call=call))

    def _workdir(self) -> Path:
        factory = getattr(self.config, "_tmp_path_factory", None)
        if factory is not None:
            return factory.mktemp("tfmem-isolated", numbered=True)
        return Path(tempfile.mkdtemp(prefix="tfmem-isolated-"))

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
        )
        spec.write(workdir / "spec.json")
        with open(workdir / "output.log", "wb") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", "pytest_tfmem.child", str(workdir / "spec.json")],
                cwd=self.config.invocation_params.dir,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
            result = Watchdog(process, policy.kill_at, WATCH_INTERVAL_S).wait()
        events = read_events(Path(spec.events))
        _reissue_warnings(events)
        reports = [
            self.config.hook.pytest_report_from_serializable(config=self.config, data=event["report"])
            for event in events
            if event["event"] == "report"
        ]
        isolated = _isolated_section(result, events, reports)
        for report in reports:
            _add_isolated_numbers(report, isolated)
        if not _complete(reports):
            output = _output_excerpt(workdir / "output.log", OUTPUT_LINES)
            reports += self._died_reports(item, policy, reports, events, result, isolated, output)
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
    ) -> list[pytest.TestReport]:
        """A failure report for the phase the child died in, and an empty teardown after it."""
        phases = {report.when: report for report in reports}
        if "setup" not in phases:
            phase = "setup"
        elif phases["setup"].passed and "call" not in phases:
            phase = "call"
        else:
            phase = "teardown"
        check, message = self._death_message(policy, events, result)
        record = TestRecord(
            item.nodeid,
            _sampled_measurement(result, isolated["call_start_rss"]),
            budget=plugin.manager(self.config).budget_for(item),
            verdicts=[Verdict(check, False, message)],
            extra={"isolated": isolated},
        )
        failure = FAILURE_BY_CHECK[check](message)

        def raise_failure() -> None:
            raise failure

        _evaluate_xfail(item)
        item.stash[plugin.RECORD] = record  # the core adds its section to the call report
        item.user_properties.extend(record.user_properties())  # reports made from the item carry it
        item.user_properties.append(("tfmem_isolated_process_peak_bytes", isolated["process_peak"]))
        report = item.ihook.pytest_runtest_makereport(item=item, call=pytest.CallInfo.from_call(raise_failure, phase))
        report.duration = result.elapsed_s  # the child's whole run: the phase's own share is unknown
        if output:
            report.sections.append(("isolated process output", output))
        died = [report]
        if phase != "teardown":
            died.append(
                item.ihook.pytest_runtest_makereport(item=item, call=pytest.CallInfo.from_call(lambda: None, "teardown"))
            )
        return died

    def _death_message(
        self, policy: IsolationPolicy, events: list[dict[str, Any]], result: WatchResult
    ) -> tuple[str, str]:
        available = (
            f"available memory {format_size(result.available_at_end)} of {format_size(self.limit.bytes)} "
            f"({self.limit.source})"
        )
        readings = "\n".join(result.summary_lines())
        if result.killed_at_limit:
            assert policy.kill_at is not None
            head = (
                f"tfmem: killed at kill_at {format_size(policy.kill_at)}: the isolated test's process tree "
                f"reached {format_size(result.last_rss)} after {result.elapsed_s:.2f} s"
            )
            return "kill_at", f"{head}\n{readings}\n{available}"
        if result.signal is not None:
            return "signal", f"tfmem: the isolated test's process was {describe_signal(result)}\n{readings}\n{available}"
        problems = [event["text"] for event in events if event["event"] == "collect_error"]
        if any(event["event"] == "not_collected" for event in events):
            problems.append("the isolated process did not collect this test")
        detail = "\n".join(problems)
        head = f"tfmem: the isolated test's process exited with code {result.returncode} before reporting the test"
        return "died", "\n".join(part for part in (head, detail, readings) if part)

    # -- the summary of isolated tests ------------------------------------------------------

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        record = record_from_report(report)
        if record is not None and "isolated" in record.extra:
            self.isolated_records.append(record)

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.isolated_records:
            return
        terminalreporter.write_sep("=", "tfmem: isolated tests (measured in the child; the child's own peak)")
        for line in render_table(isolated_rows(self.isolated_records)):
            terminalreporter.write_line(line)


def isolated_rows(records: list[TestRecord]) -> list[list[str]]:
    """test, in-process method's peak, the child's peak increase, its absolute peak, wall time, result."""
    rows = [["test", "peak (views)", "process peak increase", "process peak", "child wall", "result"]]
    for record in records:
        isolated = record.extra["isolated"]
        rows.append(
            [
                record.nodeid,
                format_size(record.measurement.peak) if record.measurement else "-",
                format_size(isolated.get("process_peak_increase")),
                format_size(isolated["process_peak"]),
                f"{isolated['wall_s']:.2f} s",
                isolated.get("death") or record.outcome or "",
            ]
        )
    return rows


def _complete(reports: list[pytest.TestReport]) -> bool:
    return any(report.when == "teardown" for report in reports)


def _isolated_section(
    result: WatchResult, events: list[dict[str, Any]], reports: list[pytest.TestReport]
) -> dict[str, Any]:
    """The numbers of an isolated run that go into the record's ``extra["isolated"]``.

    ``process_peak`` is the child's peak RSS over the test body, exact: the kernel's
    high-water mark (reset when the body starts) read when the body ends, folded with the
    record's own host peak, which survives resets by nested ``tfmem.measure()`` windows.
    For a child that died in the body it is the kernel's figure for the dead child
    (``wait4``) or the watchdog's sampled figure for its tree, whichever is higher.
    """
    call = next((event for event in events if event["event"] == "call"), None)
    call_end = next((event for event in events if event["event"] == "call_end"), None)
    call_start_rss = call["rss"] if call else None
    host_peak = 0
    for report in reports:
        record = record_from_report(report) if report.when == "call" else None
        host_view = record.measurement.view("host") if record and record.measurement else None
        if host_view is not None:
            host_peak = host_view.peak
            call_start_rss = host_view.start  # exact, taken after freed memory was released
    if call_end is not None:
        process_peak = max(call_end["peak_rss"], host_peak)
    else:
        process_peak = max(result.process_maxrss, result.peak_rss)
    death = None
    if result.killed_at_limit:
        death = "killed at kill_at"
    elif result.signal is not None:
        death = f"killed by {result.signal.name}"
    return {
        "process_peak": process_peak,
        "call_start_rss": call_start_rss,
        "process_peak_increase": None if call_start_rss is None else max(0, process_peak - call_start_rss),
        "tree_peak_sampled": result.peak_rss,
        "tree_last_sampled": result.last_rss,
        "wall_s": round(result.elapsed_s, 3),
        "kill_at": result.kill_at,
        "returncode": result.returncode,
        "death": death,
        "timeline": [[round(t, 3), rss] for t, rss in downsample(result.timeline, 200)],
    }


def _add_isolated_numbers(report: pytest.TestReport, isolated: dict[str, Any]) -> None:
    """Add the isolated run's numbers to the record the child attached to a report (the
    call and teardown reports carry it), and a section to the call report."""
    properties: list[tuple[str, object]] = []
    for name, value in report.user_properties:
        if name == PROPERTY and isinstance(value, str):
            data = json.loads(value)
            data["extra"]["isolated"] = isolated
            value = json.dumps(data, sort_keys=True)
        properties.append((name, value))
        if name == PROPERTY:
            properties.append(("tfmem_isolated_process_peak_bytes", isolated["process_peak"]))
    report.user_properties = properties
    if report.when != "call":
        return
    increase = format_size(isolated["process_peak_increase"])
    report.sections.append(
        (
            "tfmem isolated",
            f"child process peak RSS {format_size(isolated['process_peak'])} "
            f"({increase} above its level when the test body started); child wall time {isolated['wall_s']:.2f} s",
        )
    )


def _sampled_measurement(result: WatchResult, call_start_rss: int | None) -> Measurement | None:
    """What the watchdog saw of a test that died: sampled, so not exact."""
    if call_start_rss is None or not result.timeline:
        return None
    peak = max(result.peak_rss, result.process_maxrss)
    view = ViewReading("host", call_start_rss, max(peak, call_start_rss), result.last_rss)
    note = f"the test died: its process tree was sampled every {WATCH_INTERVAL_S * 1000:.0f} ms by the watchdog"
    return Measurement((view,), result.elapsed_s, exact=False, notes=(note,))


def _evaluate_xfail(item: pytest.Item) -> None:
    """Let ``@pytest.mark.xfail(raises=KilledAtLimit)`` apply to a report made here, as it
    would have in the child (pytest evaluates xfail marks during set-up, which ran there)."""
    from _pytest import skipping  # no public API for this

    item.stash[skipping.xfailed_key] = skipping.evaluate_xfail_marks(item)


def _reissue_warnings(events: list[dict[str, Any]]) -> None:
    """Warnings the child recorded for the test, issued again here so the summary shows them."""
    for event in events:
        if event["event"] != "warning":
            continue
        category = _warning_category(event["category"])
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn_explicit(event["message"], category, event["filename"], event["lineno"])


def _warning_category(qualified_name: str) -> type[Warning]:
    module_name, _, name = qualified_name.rpartition(".")
    module = sys.modules.get(module_name)
    category = getattr(module, name, None)
    return category if isinstance(category, type) and issubclass(category, Warning) else UserWarning


def _output_excerpt(path: Path, lines: int) -> str:
    """The child's last output lines; from a crash, the start of Python's fault report
    (``Fatal Python error``: the failing thread's innermost frames come first)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    fatal = next((i for i, line in enumerate(text) if "Fatal Python error" in line), None)
    if fatal is None:
        return "\n".join(text[-lines:])
    text[fatal] = text[fatal][text[fatal].index("Fatal Python error") :]
    return "\n".join(text[fatal : fatal + lines])
