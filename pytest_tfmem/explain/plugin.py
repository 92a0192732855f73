"""Explain a failure: the memory of each line of the test, and the TensorFlow ops alive at the peak.

``--tfmem-explain`` (ini ``tfmem_explain``, marker ``tfmem(explain=True)``) explains each test
that fails a tfmem check (a budget, a baseline). Two ways, and the report says which was used:

- ``rerun`` (the default): right after the failure the test's body runs once more, in the same
  process, with the same fixture values (see ``rerun``), under the line tracer
  (``explain_lines``) and, when TensorFlow is loaded and the trace feature has not already
  profiled the test, TensorFlow's profiler (``explain_tf``). Passing tests pay nothing.
- ``from-start``: the line tracer (and the profiler) run during the test's own run, for a test
  whose body must not run twice (with ``tfmem(rerun=False)``, which also keeps the re-run that
  confirms a verdict from running it). Every explained test then pays the tracer's time, and
  its verdict includes the profiler's memory.

The explanation goes into two report sections, the test's record (``extra["explain"]``, so
the JSON report) and, when the test has a TensorBoard trace, its ``summary.json``.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import Any

import pytest

from pytest_tfmem import frameworks
from pytest_tfmem.core import features, settings
from pytest_tfmem.core.failsafe import warn_instead
from pytest_tfmem.core.features import CallStep, Step
from pytest_tfmem.core.handoffs import PROFILER_IN_USE, TraceHandoff
from pytest_tfmem.core.manager import ARGUMENTS, RECORD, manager
from pytest_tfmem.core.record import TestRecord, publish
from pytest_tfmem.core.rerun import Rerun, RerunUse
from pytest_tfmem.explain.lines import (
    FunctionLines,
    LineTracer,
    function_code,
    line_trackers,
    render_lines,
    resolve_function,
)
from pytest_tfmem.explain.tf_ops import AllocatorPeak, TraceUnreadable, memory_profile, peak_allocations, render_ops
from pytest_tfmem.frameworks.profiler import ProfilerCapture
from pytest_tfmem.units import format_size

RERUN, FROM_START = "rerun", "from-start"
MODES = (RERUN, FROM_START)
RERUN_LABEL = "memory-by-line table"  # what a re-run gives this feature, as the report names it
SECTION_KEY = "explain"  # in ``TestRecord.extra`` and the trace's ``summary.json``
TF_SECTION = "memory at the peak by TensorFlow op"
UNEXPLAINED = "could not explain this failure"  # the warning when explaining fails
LEGEND = [
    "Peak+: the largest increase while the line ran; Net: what the line kept;",
    "Peak: the highest level while it ran, above where tracing began (host RSS or a framework's host",
    "pool such as TensorFlow's CPU allocator, the larger)",
]
_DOTTED_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
# A test's report sections, and its own run when traced from the start, on its item.
SECTIONS = pytest.StashKey[list[tuple[str, str]]]()  # (title, text) of the report sections
OWN_RUN = pytest.StashKey["TracedRun"]()


def parse_mode(value: object, what: str) -> str:
    text = str(value).strip().lower()
    if isinstance(value, str) and text in MODES:
        return text
    raise ValueError(f"invalid {what} {value!r}: expected one of {', '.join(MODES)}")


def _function_names(names: list[object], value: object, what: str) -> tuple[str, ...]:
    for name in names:
        if not isinstance(name, str) or not _DOTTED_NAME.match(name):
            raise ValueError(
                f"invalid {what} {value!r}: {name!r} is not a dotted function name; expected names like "
                "'mypkg.train.fit_model' (module path, then the function or Class.method)"
            )
    return tuple(dict.fromkeys(names))  # type: ignore[arg-type]


def parse_function_names(value: object, what: str) -> tuple[str, ...]:
    """Option form: names separated by commas or spaces."""
    return _function_names([name for name in re.split(r"[,\s]+", str(value).strip()) if name], value, what)


def parse_marker_explain(value: object, what: str) -> tuple[bool, tuple[str, ...]]:
    """Marker form: ``True``, ``False``, or a list of dotted names (which turns explaining on)."""
    if isinstance(value, bool):
        return value, ()
    if isinstance(value, (list, tuple)) and value:
        return True, _function_names(list(value), value, what)
    raise ValueError(
        f"invalid {what} {value!r}: expected True, False or a list of dotted function names "
        "like ['mypkg.train.fit_model']"
    )


EXPLAIN = settings.Option(
    "explain",
    "explain a test that fails a tfmem check: memory by line of the test and the TensorFlow ops "
    "alive at the peak (marker: explain=True)",
    settings.parse_bool,
    False,
    flag=True,
)
EXPLAIN_MODE = settings.Option(
    "explain_mode",
    f"{RERUN}: re-run a failed test's body once under the line tracer (default; passing tests pay "
    f"nothing); {FROM_START}: trace the test's own run (every explained test pays the tracer's time)",
    parse_mode,
    RERUN,
)
EXPLAIN_FUNCTIONS = settings.Option(
    "explain_functions",
    "more functions to explain by line, as dotted names separated by commas, e.g. mypkg.train.fit_model",
    parse_function_names,
    (),
)
EXPLAIN_TOP = settings.Option(
    "explain_top", "rows per allocator in the TensorFlow op table (default 10)", settings.parse_positive_int, 10
)
EXPLAIN_OPTIONS = [EXPLAIN, EXPLAIN_MODE, EXPLAIN_FUNCTIONS, EXPLAIN_TOP]


@dataclass(frozen=True)
class ExplainSettings:
    enabled: bool
    mode: str
    functions: tuple[str, ...]
    top: int

    @classmethod
    def from_config(cls, config: pytest.Config) -> ExplainSettings:
        values = [settings.read_option(config, option)[0] for option in EXPLAIN_OPTIONS]
        return cls(*values)


@dataclass(frozen=True)
class ExplainRequest:
    """How one test is explained: mode, the functions traced besides the test, table rows."""

    mode: str
    functions: tuple[str, ...]
    top: int


@dataclass
class TracedRun:
    """The line tracer and (optionally) the profiler over one run of a test."""

    how: str  # RERUN or FROM_START
    tracer: LineTracer
    profiler: ProfilerCapture | None
    notes: list[str] = field(default_factory=list)
    peak: int | None = None  # of a re-run
    error: str | None = None  # how a re-run ended, if it raised


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser, EXPLAIN_OPTIONS)


TFMEM_DECLARATIONS = features.Declarations(
    marker_keywords={"explain": parse_marker_explain, "explain_mode": parse_mode}
)


def pytest_configure(config: pytest.Config) -> None:
    explain = ExplainPlugin(config)
    config.pluginmanager.register(explain, "tfmem-explain")
    manager(config).add_step(CallStep(Step.EXPLAIN, explain.explain_own_run, sections=explain.report_sections))


def traced_functions(item: pytest.Function, names: tuple[str, ...]) -> tuple[dict[CodeType, str], list[str]]:
    """Code objects to trace (the test, then the named functions) with the names shown; notes on names not found."""
    functions = {function_code(item.obj, item.nodeid): item.nodeid}
    notes = []
    for name in names:
        try:
            functions.setdefault(resolve_function(name), name)
        except LookupError as error:
            notes.append(f"not traced: {error}")
    return functions, notes


class ExplainPlugin:
    """Runs the tracers for tests that ask for an explanation and reports what they found."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.settings = ExplainSettings.from_config(config)

    def request_for(self, item: pytest.Item) -> ExplainRequest | None:
        """The explanation the test asks for (options, then its marker), or ``None``."""
        if not isinstance(item, pytest.Function) or not manager(self.config).is_measured(item):
            return None
        arguments = item.stash.get(ARGUMENTS, {})
        enabled, names = arguments.get("explain", (self.settings.enabled, ()))
        if not enabled:
            return None
        mode = arguments.get("explain_mode", self.settings.mode)
        return ExplainRequest(mode, tuple(dict.fromkeys(self.settings.functions + names)), self.settings.top)

    def _start(self, item: pytest.Function, request: ExplainRequest, how: str, profile: bool) -> TracedRun:
        functions, notes = traced_functions(item, request.functions)
        framework = frameworks.primary()
        profiler = None
        if profile and framework is not None and not framework.no_memory_profile():
            profiler = ProfilerCapture(framework, Path(tempfile.mkdtemp(prefix="tfmem-explain-")))
            profiler.start()
        run = TracedRun(how, LineTracer(functions, line_trackers()), profiler, notes)
        run.tracer.start()
        return run

    def _stop(self, run: TracedRun) -> None:
        run.tracer.stop()
        if run.tracer.replaced_tracer:
            run.notes.append("another tracer (a debugger or coverage) was paused while the line tracer ran")
        if run.profiler is not None:
            run.profiler.stop()

    @contextmanager
    def explain_own_run(self, item: pytest.Item) -> Iterator[None]:
        """``from-start``: trace the test's own run (the profiler too, unless the trace feature does)."""
        request = self.request_for(item)
        run = None
        if request is not None and request.mode == FROM_START:
            assert isinstance(item, pytest.Function)
            with warn_instead(item, "cannot trace this test"):  # the test runs anyway, untraced
                run = self._start(item, request, FROM_START, profile=PROFILER_IN_USE not in item.stash)
        if run is None:
            yield
            return
        try:
            yield
        finally:
            self._stop(run)
            item.stash[OWN_RUN] = run

    def pytest_tfmem_rerun_wanted(self, item: pytest.Item, record: TestRecord) -> RerunUse | None:
        request = self.request_for(item)
        if request is None or request.mode != RERUN:
            return None
        return RerunUse(Step.EXPLAIN, RERUN_LABEL, lambda rerun: self._explain_rerun(item, request, rerun))

    @contextmanager
    def _explain_rerun(self, item: pytest.Item, request: ExplainRequest, rerun: Rerun) -> Iterator[None]:
        """``rerun``: the line tracer (and the profiler, unless the trace feature profiles) over
        the re-run; the explanation once it ended (and the trace, read here, is written)."""
        assert isinstance(item, pytest.Function)
        run = self._start(item, request, RERUN, profile=PROFILER_IN_USE not in item.stash)
        try:
            yield
        finally:
            self._stop(run)
        if rerun.result is not None:
            run.peak, run.error = rerun.result.measurement.peak, rerun.result.error
        record = item.stash[RECORD]
        try:
            with warn_instead(item, UNEXPLAINED):
                self.explain(item, request, record, run)
        finally:
            _remove_capture(run.profiler)

    def explain(self, item: pytest.Item, request: ExplainRequest, record: TestRecord, run: TracedRun) -> None:
        """Read the failed test's traced run (its TF trace too) and publish the explanation."""
        trace = TraceHandoff.of(record)  # what the trace feature left, if it traced the test
        framework = run.profiler.framework if run.profiler is not None else frameworks.primary()
        trace_files = [Path(trace.directory) / name for name in trace.profiler_files] if trace else []
        if trace and trace_files:
            source = "the test's TensorBoard trace (" + (
                "its re-run by the trace feature)" if trace.traced == "rerun" else "its own run)")
            profile_files = trace_files
        else:
            profiler_name = framework.name if framework is not None else "TensorFlow"
            run_name = "the re-run" if run.how == RERUN else "the test's own run"
            source = f"{profiler_name}'s profiler during {run_name}"
            profile_files = list(run.profiler.files) if run.profiler is not None else []
            if run.profiler is not None and not profile_files:
                run.notes.append(run.profiler.message)
        no_profile = framework.no_memory_profile() if framework is not None else ""
        if no_profile:
            run.notes.append(f"no op table: {no_profile}")
            allocators = []
        else:
            allocators = _tensorflow_peaks(profile_files, request.top, run.notes)
        lines = run.tracer.results()
        _publish(item, record, explanation(record, run, lines, allocators, source), lines, allocators, trace)

    def report_sections(self, item: pytest.Item, record: TestRecord) -> list[tuple[str, str]] | None:
        """A test traced from the start that failed a tfmem check is explained now: every
        feature has finished with the test's own run."""
        own_run = item.stash.get(OWN_RUN, None)
        if own_run is not None:
            del item.stash[OWN_RUN]
            request = self.request_for(item)
            if request is not None and record.failed_verdicts:
                with warn_instead(item, UNEXPLAINED):
                    self.explain(item, request, record, own_run)
            _remove_capture(own_run.profiler)
        return item.stash.get(SECTIONS, None)


def _tensorflow_peaks(files: list[Path], top: int, notes: list[str]) -> list[AllocatorPeak]:
    if not files:
        return []
    try:
        return peak_allocations(memory_profile(files), top)
    except TraceUnreadable as error:
        notes.append(f"no TensorFlow op table: {error}")
    except Exception as error:  # a trace that cannot be read must not hide the test's own failure
        notes.append(f"no TensorFlow op table: reading the trace failed: {error!r}")
    return []


def explanation(record: TestRecord, run: TracedRun, lines: list[FunctionLines],
                allocators: list[AllocatorPeak], source: str) -> dict[str, Any]:
    """What goes into the record and ``summary.json``."""
    verdict_peak = record.measurement.peak if record.measurement is not None else None
    notes = list(run.notes)
    if run.how == RERUN:
        how = (f"re-run once after the failure, with the same fixture values, under a line tracer: peak "
               f"{format_size(run.peak)} (the failed run: {format_size(verdict_peak)})")
        if run.error:
            how += f"; the re-run raised {run.error.splitlines()[0][:200]}"
    else:
        how = "the test's own run, traced from the start (its verdict includes what the tracers used)"
    if not lines:
        notes.append("no line of a traced function ran")
    largest = max(
        ((function, row) for function in lines for row in function.rows),
        key=lambda pair: pair[1].peak_increase() or 0,
        default=None,
    )
    return {
        "how": run.how,
        "description": how,
        "rerun": {"peak_bytes": run.peak, "error": run.error} if run.how == RERUN else None,
        "lines": [function.to_dict() for function in lines],
        "largest": None if largest is None else {
            "function": largest[0].name, "file": largest[0].filename, "line": largest[1].line,
            "contents": largest[1].contents, "peak_increase_bytes": largest[1].peak_increase(),
        },
        "tensorflow": {"source": source, "allocators": [peak.to_dict() for peak in allocators]} if allocators else None,
        "notes": notes,
    }


def sections(nodeid: str, data: dict[str, Any], lines: list[FunctionLines],
             allocators: list[AllocatorPeak]) -> list[tuple[str, str]]:
    """Report sections: one ``memory by line (...)`` per traced function, then the TF op table."""
    result = []
    for index, function in enumerate(lines):
        text = [data["description"]] if index == 0 else []
        text += render_lines(function)
        largest = function.largest()
        if largest is not None:
            text.append(f"largest increase: line {largest.line} ({format_size(largest.peak_increase(), signed=True)}): "
                        f"{largest.contents}")
        if index == len(lines) - 1:
            text += [*LEGEND, *(f"note: {note}" for note in data["notes"])]
        result.append((f"memory by line ({function.name})", "\n".join(text)))
    if not lines:
        text = [data["description"], *(f"note: {n}" for n in data["notes"])]
        result.append((f"memory by line ({nodeid})", "\n".join(text)))
    if allocators:
        text = [f"from {data['tensorflow']['source']}"]
        for peak in allocators:
            text += render_ops(peak)
        result.append((TF_SECTION, "\n".join(text)))
    return result


def _publish(item: pytest.Item, record: TestRecord, data: dict[str, Any], lines: list[FunctionLines],
             allocators: list[AllocatorPeak], trace: TraceHandoff | None) -> None:
    """Put the explanation into the trace's summary, the record (refreshing the copy in the item's
    properties) and the report sections."""
    if trace is not None:
        try:
            trace.add_to_summary(SECTION_KEY, data)
        except (OSError, ValueError) as error:
            data["notes"].append(f"not added to the trace's summary.json: {error}")
    record.extra[SECTION_KEY] = data
    publish(item, record)
    item.stash[SECTIONS] = sections(item.nodeid, data, lines, allocators)


def _remove_capture(profiler: ProfilerCapture | None) -> None:
    if profiler is not None:
        shutil.rmtree(profiler.logdir, ignore_errors=True)
