"""TensorBoard traces of failing tests: options, marker keyword and the pytest hooks.

``--tfmem-trace=on-failure`` (the default once a framework is loaded) re-runs a failed
measured test once, in the same process, under TensorFlow's profiler and a memory timeline
sampler (see ``core.rerun``), and keeps the result as a TensorBoard log directory (see
``trace.capture``, ``trace.dirs``). Passing tests pay nothing: no profiler runs and nothing is
written for them. The verdict stays the untraced run's; the traced run's peak is reported
beside it. ``always`` traces every measured test's own run (the verdict then includes the
profiler's own memory, and says so); ``off`` disables tracing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_tfmem import frameworks
from pytest_tfmem.core import features, processes, settings
from pytest_tfmem.core.failsafe import warn_instead
from pytest_tfmem.core.features import CallStep, Step, Summary
from pytest_tfmem.core.handoffs import TraceHandoff, put_on
from pytest_tfmem.core.manager import ARGUMENTS, RECORD, manager
from pytest_tfmem.core.record import TestRecord, publish
from pytest_tfmem.core.rerun import Rerun, RerunResult, RerunUse
from pytest_tfmem.core.verdict import describe_views
from pytest_tfmem.extras import install_hint, installed
from pytest_tfmem.trace import dirs as tracedirs
from pytest_tfmem.trace.capture import (
    Capture,
    TraceFacts,
    capturing,
    missing_for_traces,
    tensorboard_command,
    write_trace,
)
from pytest_tfmem.units import format_size

ON_FAILURE, ALWAYS, OFF = "on-failure", "always", "off"
MODES = (ON_FAILURE, ALWAYS, OFF)
DEFAULT_ROOT = ".tfmem/traces"
SECTION = "tfmem trace"
RERUN_LABEL = "TensorBoard trace"  # what a re-run gives this feature, as the report names it
INCOMPLETE = "the trace of this test is incomplete"  # the warning when tracing fails
# The trace written for a test, on its item and in its record's ``extra["trace"]``: the
# ``core.handoffs.TraceHandoff`` fields (what features that analyse traces read: ``directory``,
# ``shown_directory``, ``traced``, ``profiler_files``), then ``tensorboard`` (the command),
# ``profiler`` (status), ``profiler_message``, ``traced_peak_bytes``, ``traced_views``, ``error``
# (how a re-run ended), ``timeline`` (``png``, ``scalars``...), ``notes``.
# ``TraceHandoff.add_to_summary`` adds a section to the directory's ``summary.json``.
TRACE = pytest.StashKey[dict]()


def parse_mode(value: object, what: str) -> str:
    text = str(value).strip().lower()
    if isinstance(value, str) and text in MODES:
        return text
    raise ValueError(f"invalid {what} {value!r}: expected one of {', '.join(MODES)}")


def parse_marker_mode(value: object, what: str) -> str:
    """The marker also takes ``True`` (``always``) and ``False`` (``off``)."""
    if isinstance(value, bool):
        return ALWAYS if value else OFF
    try:
        return parse_mode(value, what)
    except ValueError:
        raise ValueError(f"invalid {what} {value!r}: expected one of {', '.join(MODES)}, True or False") from None


TRACE_MODE = settings.Option(
    "trace",
    f"{ON_FAILURE}: re-run a failed measured test once under its framework's profiler and keep its "
    f"trace; {ALWAYS}: trace every measured test; {OFF}. Default {ON_FAILURE} once TensorFlow, JAX "
    "or PyTorch is loaded",
    parse_mode,
)
TRACE_DIR = settings.Option(
    "trace_dir",
    f"where traces go, one folder per session (default {DEFAULT_ROOT} under the rootdir)",
    settings.parse_path,
)
TRACE_KEEP = settings.Option(
    "trace_keep", "sessions of traces kept in the trace directory; older ones are deleted (default 5)",
    settings.parse_positive_int, 5,
)
TRACE_OPTIONS = [TRACE_MODE, TRACE_DIR, TRACE_KEEP]


@dataclass(frozen=True)
class TraceSettings:
    mode: str | None  # None: not set, meaning on-failure once a framework is loaded
    root: Path
    keep: int

    @classmethod
    def from_config(cls, config: pytest.Config) -> TraceSettings:
        mode, _ = settings.read_option(config, TRACE_MODE)
        root, _ = settings.read_option(config, TRACE_DIR)
        keep, _ = settings.read_option(config, TRACE_KEEP)
        return cls(mode, root or config.rootpath / DEFAULT_ROOT, keep)


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser, TRACE_OPTIONS)


TFMEM_DECLARATIONS = features.Declarations(marker_keywords={"trace": parse_marker_mode})


def pytest_configure(config: pytest.Config) -> None:
    trace = TracePlugin(config)
    config.pluginmanager.register(trace, "tfmem-trace")
    step = CallStep(Step.TRACE, trace.trace_own_run, profiles=trace.traces_own_run, sections=trace.report_sections)
    manager(config).add_step(step)
    manager(config).add_summary(Summary.TRACE, trace.write_summary)
    manager(config).add_reader(TracedTests, TracedTests)


class TracePlugin:
    """Decides which tests to trace, captures them, reports where the traces are."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.settings = TraceSettings.from_config(config)
        # Every process of the session (xdist workers, isolated tests' processes) writes into
        # one session directory, named after the session; only the main process rotates.
        shared = processes.session(config)
        self.session_name = tracedirs.session_name(shared.started, shared.pid)

    def mode_for(self, item: pytest.Item) -> str:
        arguments = item.stash.get(ARGUMENTS, {})
        mode = arguments.get("trace", self.settings.mode)
        if mode is None:
            return ON_FAILURE if frameworks.loaded() else OFF
        return mode

    def _new_directory(self, item: pytest.Item) -> Path | None:
        """A fresh directory for the item's trace, or ``None`` (with a warning) if none can be made."""
        details = {
            "rootdir": str(self.config.rootpath),
            "pid": os.getpid(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        try:
            session = tracedirs.prepare_session(self.settings.root, self.session_name, details)
            return tracedirs.create_unique_dir(session, tracedirs.readable_name(item.nodeid))
        except OSError as error:
            item.warn(pytest.PytestWarning(f"pytest-tfmem: no trace for this test: {error}"))
            return None

    def _shown(self, path: Path) -> str:
        return tracedirs.display_path(path, self.config.invocation_params.dir)

    def traces_own_run(self, item: pytest.Item) -> bool:
        """``always``: the profiler runs over a measured test's own run."""
        return manager(self.config).is_measured(item) and self.mode_for(item) == ALWAYS

    @contextmanager
    def trace_own_run(self, item: pytest.Item) -> Iterator[None]:
        """``always``: trace the test's own run, outside its measurement (``Step.TRACE``)."""
        directory = self._new_directory(item) if self.traces_own_run(item) else None
        if directory is None:
            yield
            return
        capture = None
        try:
            with capturing(directory) as capture:
                yield
        finally:
            if capture is not None:
                with warn_instead(item, INCOMPLETE):
                    self._finish(item, capture, None)

    def pytest_tfmem_rerun_wanted(self, item: pytest.Item, record: TestRecord) -> RerunUse | None:
        """``on-failure``: a test that failed a tfmem check is traced in its re-run (not one marked
        ``xfail``: an expected failure is not re-run; trace it with ``always``)."""
        if self.mode_for(item) == ON_FAILURE and item.get_closest_marker("xfail") is None:
            return RerunUse(Step.TRACE, RERUN_LABEL, lambda rerun: self._trace_rerun(item, rerun), profiles=True)
        return None

    @contextmanager
    def _trace_rerun(self, item: pytest.Item, rerun: Rerun) -> Iterator[None]:
        """The re-run under the profiler and the memory timeline."""
        directory = self._new_directory(item)
        if directory is None:
            yield
            return
        with capturing(directory) as capture:
            yield
        with warn_instead(item, INCOMPLETE):
            self._finish(item, capture, rerun.result, rerun.output)

    def _finish(self, item: pytest.Item, capture: Capture, rerun: RerunResult | None, output: str = "") -> None:
        """Write the trace, describe it on the item and its record (which travels to the controller)."""
        record = item.stash.get(RECORD, None)
        verdict_measurement = record.measurement if record is not None else None
        measurement = rerun.measurement if rerun is not None else verdict_measurement
        handoff = TraceHandoff(
            directory=str(capture.directory),
            shown_directory=self._shown(capture.directory),
            traced="rerun" if rerun is not None else "run",
            profiler_files=tuple(str(path.relative_to(capture.directory)) for path in capture.profiler.files),
        )
        info: dict[str, Any] = {
            **handoff.fields(),
            "tensorboard": tensorboard_command(handoff.shown_directory) if installed("tensorboard") else None,
            "profiler": capture.profiler.status,
            "profiler_message": capture.profiler.message,
            "traced_peak_bytes": measurement.peak if measurement is not None else None,
            "traced_views": describe_views(measurement) if measurement is not None else None,
            "error": rerun.error if rerun is not None else None,
            "timeline": {"png": None, "scalars": []},
            "notes": [],
        }
        if measurement is not None:
            facts = TraceFacts(
                nodeid=item.nodeid,
                how=handoff.traced,
                measurement=measurement,
                verdict_peak=verdict_measurement.peak if rerun is not None and verdict_measurement else None,
                budget=record.budget if record is not None else None,
                verdicts=[v.message for v in record.failed_verdicts] if record is not None else [],
                error=info["error"],
                output=output,
            )
            try:
                summary = write_trace(capture, facts)
                info["notes"], info["timeline"] = summary["notes"], summary["timeline"]
            except Exception as error:  # never let a trace hide the test's own result
                info["notes"] = [f"summary not written: {error!r}"]
        item.stash[TRACE] = info
        if record is not None:
            put_on(record, handoff, info)
            publish(item, record)

    def report_sections(self, item: pytest.Item, record: TestRecord) -> list[tuple[str, str]] | None:
        info = item.stash.get(TRACE, None)
        return [(SECTION, "\n".join(section_lines(info)))] if info is not None else None

    def pytest_sessionfinish(self) -> None:
        # A session that wrote no trace leaves the trace directory as it found it.
        if not processes.role(self.config).writes_session_outputs or self.settings.mode == OFF:
            return
        if not (self.settings.root / self.session_name).is_dir():
            return
        try:
            tracedirs.rotate(self.settings.root, self.settings.keep, current=self.session_name)
        except OSError:  # another session rotating at the same time; the next run tidies up
            pass

    def write_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        traced = manager(self.config).reader(TracedTests)
        if not traced.count:
            return
        session = self.settings.root / self.session_name
        terminalreporter.write_sep(
            "=", f"tfmem: {traced.count} TensorBoard trace(s), {len(traced.failing)} of failing tests"
        )
        for nodeid, trace in traced.failing:
            terminalreporter.write_line(f"{nodeid}  {self._shown(Path(trace.directory))}")
        missing = missing_for_traces()
        if missing:  # said once here, not under every trace
            terminalreporter.write_line(
                f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: the traces have no "
                f"memory scalars or timeline.png{', and no viewer' if 'tensorboard' in missing else ''}; "
                f"{install_hint('trace')}", yellow=True)
        if "tensorboard" not in missing:
            terminalreporter.write_line(f"open them: {tensorboard_command(self._shown(session))}")


class TracedTests:
    """The session's traces, gathered one record at a time (``TfmemManager.reader``): how many,
    and the failing tests' with where they are."""

    def __init__(self) -> None:
        self.count = 0
        self.failing: list[tuple[str, TraceHandoff]] = []

    def add(self, record: TestRecord) -> None:
        trace = TraceHandoff.of(record)
        if trace is None:
            return
        self.count += 1
        if record.outcome == "failed":
            self.failing.append((record.nodeid, trace))


def section_lines(info: dict[str, Any]) -> list[str]:
    """The report section: how the trace was made, its numbers, and the command to open it."""
    directory = Path(info["shown_directory"])
    if info["traced"] == "rerun":
        lines = [
            (
                "traced: the test was re-run once under the profiler and the memory timeline; "
                "the verdict above is the untraced run's"
            )
        ]
        ending = f"; it raised {_first_line(info['error'])}" if info["error"] else ""
        lines.append(f"traced re-run: peak {format_size(info['traced_peak_bytes'])} ({info['traced_views']}){ending}")
    else:
        lines = [
            (
                "traced: the test's own run, under the profiler and the memory timeline; "
                "its figures include the profiler's memory"
            )
        ]
    profile = f"profile: {info['profiler_message']}"
    if info["profiler_files"]:
        profile += f": {', '.join(info['profiler_files'])}"
    lines.append(profile)
    timeline = info["timeline"]
    if timeline["scalars"] or timeline["png"]:
        parts = [f"TensorBoard scalars {', '.join(timeline['scalars'])}"] if timeline["scalars"] else []
        parts += [str(directory / timeline["png"])] if timeline["png"] else []
        lines.append(f"memory timeline: {'; '.join(parts)}")
    lines += [f"note: {note}" for note in info["notes"]]
    lines.append(f"trace directory: {directory}")
    if info.get("tensorboard"):  # where TensorBoard is installed
        lines.append(f"open it: {info['tensorboard']}")
    return lines


def _first_line(text: str, limit: int = 200) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."
