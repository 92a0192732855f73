"""Memory by line: a line tracer that charges each line of chosen functions with the memory it took.

At every line event in a traced function the tracer restarts one peak window per memory view
(host RSS through the kernel's high-water mark, each framework's device view): the window that
ends belongs to the line that just ran. Each line's peak is therefore exact, not sampled: a
300 MB array that lives for microseconds inside one line is charged to that line. The windows
go through the process-wide ``PeakTracker`` of each view, so an enclosing window (the test's
own measurement, a ``tfmem.measure()`` block) keeps its peak across the tracer's resets.

A line that calls another traced function is charged with everything the call took; the
callee's lines are charged with their own parts. ``sys.settrace`` is used because every
supported Python has it: it traces the calling thread only, and while it runs it replaces any
other tracer (a debugger, coverage), which is put back afterwards.
"""

from __future__ import annotations

import importlib
import inspect
import linecache
import sys
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from pytest_tfmem import frameworks
from pytest_tfmem.core.measure import PeakTracker, ViewReading, probes
from pytest_tfmem.units import format_size

if TYPE_CHECKING:
    from pytest_tfmem.core.measure import _Window

MAX_ROWS = 60  # per function in the report section; the record keeps every line
MAX_CONTENTS = 72


def line_trackers() -> list[PeakTracker]:
    """The views a line is measured in: host RSS and the frameworks' device views (TensorFlow's
    allocators, a JAX or PyTorch GPU); not NVML: too slow per line."""
    return [t for t in probes().trackers() if t.source.name == "host" or frameworks.owner(t.source.name) is not None]


def is_host_side(view: str) -> bool:
    """Views that make up the headline peak (``Measurement.peak``): host RSS and the frameworks'
    views of host memory (TensorFlow's CPU allocator), not a GPU's."""
    return view == "host" or frameworks.is_host_view(view)


def resolve_function(dotted: str) -> CodeType:
    """The code object of ``package.module.function`` (or ``package.module.Class.method``).

    Raises ``LookupError`` naming what could not be found.
    """
    parts = dotted.split(".")
    target: Any = None
    for split in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:split])
        try:
            target = importlib.import_module(module_name)
        except ImportError:
            continue
        for attribute in parts[split:]:
            try:
                target = getattr(target, attribute)
            except AttributeError:
                raise LookupError(f"{dotted}: module {module_name!r} has no {attribute!r}") from None
        break
    else:
        raise LookupError(f"{dotted}: no importable module in that name")
    return function_code(target, dotted)


def function_code(function: Any, name: str) -> CodeType:
    """The code object of a function, method or decorated function (``functools.wraps``)."""
    function = inspect.unwrap(getattr(function, "__func__", function))
    code = getattr(function, "__code__", None)
    if not isinstance(code, CodeType):
        raise LookupError(f"{name}: not a Python function ({type(function).__name__})")
    return code


@dataclass(frozen=True)
class ViewFigures:
    """One line in one view, in bytes: largest increase while it ran, what it kept, highest level."""

    peak_increase: int
    net: int
    peak: int  # highest level reached while the line ran, above the level where tracing began


@dataclass(frozen=True)
class LineRow:
    """One executed line of a traced function, over all the times it ran."""

    line: int
    hits: int
    contents: str
    views: dict[str, ViewFigures]

    def _headline(self, gpu: bool) -> list[ViewFigures]:
        return [figures for view, figures in self.views.items() if is_host_side(view) != gpu]

    def peak_increase(self, gpu: bool = False) -> int | None:
        """Largest increase in the headline views (host RSS, a host pool such as TF CPU), or in the GPU views."""
        figures = self._headline(gpu)
        return max(f.peak_increase for f in figures) if figures else None

    def net(self, gpu: bool = False) -> int | None:
        """What the line kept: the headline view whose change was largest, with its sign."""
        figures = self._headline(gpu)
        return max((f.net for f in figures), key=abs) if figures else None

    def peak(self, gpu: bool = False) -> int | None:
        figures = self._headline(gpu)
        return max(f.peak for f in figures) if figures else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "hits": self.hits,
            "contents": self.contents,
            "peak_increase_bytes": self.peak_increase(),
            "net_bytes": self.net(),
            "peak_bytes": self.peak(),
            "gpu_peak_increase_bytes": self.peak_increase(gpu=True),
            "gpu_net_bytes": self.net(gpu=True),
            "views": {view: vars(figures) for view, figures in self.views.items()},
        }


@dataclass(frozen=True)
class FunctionLines:
    """The executed lines of one traced function, in line order."""

    name: str
    filename: str
    first_line: int
    rows: list[LineRow]

    def largest(self) -> LineRow | None:
        return max(self.rows, key=lambda row: row.peak_increase() or 0, default=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "function": self.name,
            "file": self.filename,
            "first_line": self.first_line,
            "rows": [row.to_dict() for row in self.rows],
        }


@dataclass
class _Active:
    """A traced frame in progress: the line now running and its windows, one per tracker."""

    code: CodeType
    line: int
    windows: list[_Window]


@dataclass
class _Totals:
    hits: int = 0
    peak_increase: dict[str, int] = field(default_factory=dict)
    net: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)


class LineTracer:
    """Trace the lines of the given functions while it runs: ``with LineTracer(...) as tracer:``."""

    def __init__(self, functions: dict[CodeType, str], trackers: list[PeakTracker]) -> None:
        self.functions = functions  # code object -> name shown in the report
        self.trackers = trackers
        self._active: dict[FrameType, _Active] = {}
        self._totals: dict[tuple[CodeType, int], _Totals] = {}
        self._base: dict[str, int] | None = None  # each view's level where tracing began
        self._previous: Any = None
        self.replaced_tracer = False

    def start(self) -> LineTracer:
        self._previous = sys.gettrace()
        self.replaced_tracer = self._previous is not None
        sys.settrace(self._on_call)
        return self

    def stop(self) -> None:
        sys.settrace(self._previous)
        for frame in list(self._active):  # frames still running (the tracer stopped inside them)
            self._leave(frame)

    def __enter__(self) -> LineTracer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _on_call(self, frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code in self.functions:
            return self._on_event
        return None

    def _on_event(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "line":
            self._on_line(frame)
        elif event == "return":
            self._leave(frame)
        return self._on_event

    def _on_line(self, frame: FrameType) -> None:
        active = self._active.get(frame)
        if active is None:
            windows = [tracker.open() for tracker in self.trackers]
            if self._base is None:
                self._base = {t.source.name: w.start for t, w in zip(self.trackers, windows)}
            self._active[frame] = _Active(frame.f_code, frame.f_lineno, windows)
            return
        readings = [tracker.restart(window) for tracker, window in zip(self.trackers, active.windows)]
        self._charge(active, readings)
        active.line = frame.f_lineno

    def _leave(self, frame: FrameType) -> None:
        active = self._active.pop(frame, None)
        if active is not None:
            self._charge(active, [tracker.close(window) for tracker, window in zip(self.trackers, active.windows)])

    def _charge(self, active: _Active, readings: list[ViewReading]) -> None:
        totals = self._totals.setdefault((active.code, active.line), _Totals())
        totals.hits += 1
        assert self._base is not None
        for reading in readings:
            view = reading.view
            totals.peak_increase[view] = max(totals.peak_increase.get(view, 0), reading.increase)
            totals.net[view] = totals.net.get(view, 0) + reading.net
            totals.peak[view] = max(totals.peak.get(view, 0), reading.peak - self._base[view])

    def results(self) -> list[FunctionLines]:
        """One entry per traced function that ran, in the order given."""
        results = []
        for code, name in self.functions.items():
            rows = [
                LineRow(
                    line=line,
                    hits=totals.hits,
                    contents=linecache.getline(code.co_filename, line).strip(),
                    views={
                        view: ViewFigures(totals.peak_increase[view], totals.net[view], totals.peak[view])
                        for view in totals.peak_increase
                    },
                )
                for (traced_code, line), totals in sorted(self._totals.items(), key=lambda item: item[0][1])
                if traced_code is code
            ]
            if rows:
                results.append(FunctionLines(name, code.co_filename, code.co_firstlineno, rows))
        return results


def _signed(value: int | None) -> str:
    return format_size(value, signed=True) if value is not None else "-"


def render_lines(function: FunctionLines) -> list[str]:
    """The table of one function: ``Line  Hits  Peak+  Net  Peak  Line contents``."""
    gpu = any(not is_host_side(view) for row in function.rows for view in row.views)
    shown = function.rows
    if len(shown) > MAX_ROWS:
        keep = sorted(shown, key=lambda row: row.peak_increase() or 0, reverse=True)[:MAX_ROWS]
        shown = sorted(keep, key=lambda row: row.line)
    header = ["Line", "Hits", "Peak+", "Net", "Peak"] + (["GPU Peak+", "GPU Net"] if gpu else [])
    table = [header]
    for row in shown:
        cells = [str(row.line), str(row.hits), _signed(row.peak_increase()), _signed(row.net()),
                 format_size(row.peak())]
        if gpu:
            cells += [_signed(row.peak_increase(gpu=True)), _signed(row.net(gpu=True))]
        table.append(cells)
    widths = [max(len(cells[i]) for cells in table) for i in range(len(header))]
    contents = ["Line contents"] + [_shorten(row.contents) for row in shown]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(cells, widths)) + "  " + text
             for cells, text in zip(table, contents)]
    if len(function.rows) > len(shown):
        hidden = len(function.rows) - len(shown)
        lines.append(f"({hidden} lines with smaller increases not shown; all are in the JSON record)")
    return lines


def _shorten(text: str) -> str:
    return text if len(text) <= MAX_CONTENTS else text[: MAX_CONTENTS - 3] + "..."
