"""The line tracer on its own: exact per-line peaks, enclosing windows kept whole, names resolved."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from measure_helpers import ScriptedSource

from pytest_tfmem.core.measure import Monitor, PeakTracker
from pytest_tfmem.explain.lines import (
    FunctionLines,
    LineRow,
    LineTracer,
    ViewFigures,
    function_code,
    line_trackers,
    render_lines,
    resolve_function,
)

MB = 10**6


def test_restart_reads_a_window_and_starts_it_over_without_hiding_the_outer_peak():
    source = ScriptedSource()
    tracker = PeakTracker(source)
    outer = tracker.open()
    source.set(100)
    line = tracker.open()
    source.set(400)
    source.set(150)
    first = tracker.restart(line)
    assert (first.start, first.peak, first.end) == (100, 400, 150)
    source.set(200)
    second = tracker.restart(line)
    assert (second.start, second.peak, second.end) == (150, 200, 200)
    tracker.close(line)
    assert tracker.close(outer).peak == 400


def spiky():
    kept = np.ones(50 * MB // 8)
    total = np.ones(200 * MB // 8).sum()
    for _ in range(3):
        chunk = np.ones(20 * MB // 8)  # noqa: F841  # the row is found by its name
    return kept, total


def test_each_line_gets_its_exact_peak_and_the_enclosing_window_keeps_its_own():
    code = function_code(spiky, "spiky")
    with Monitor() as monitor, LineTracer({code: "spiky"}, line_trackers()) as tracer:
        spiky()
    (function,) = tracer.results()
    rows = {row.contents.split(" =")[0]: row for row in function.rows}
    assert abs(rows["kept"].peak_increase() - 50 * MB) <= 5 * MB
    assert abs(rows["kept"].net() - 50 * MB) <= 5 * MB
    assert abs(rows["total"].peak_increase() - 200 * MB) <= 20 * MB  # freed within the line
    assert abs(rows["total"].net()) <= 5 * MB
    assert rows["chunk"].hits == 3
    assert abs(rows["chunk"].peak_increase() - 20 * MB) <= 2 * MB
    assert function.largest() is rows["total"]
    # the tracer reset the high-water mark at every line; the enclosing window still saw the spike
    assert monitor.measurement is not None
    assert monitor.measurement.host >= 240 * MB


def test_the_tracer_puts_back_the_tracer_it_replaced():
    def other_tracer(frame, event, arg):
        return None

    previous = sys.gettrace()
    sys.settrace(other_tracer)
    try:
        with LineTracer({function_code(spiky, "spiky"): "spiky"}, []) as tracer:
            assert sys.gettrace() == tracer._on_call
        assert sys.gettrace() is other_tracer
        assert tracer.replaced_tracer
    finally:
        sys.settrace(previous)


class Holder:
    def method(self):
        return 1


def test_dotted_names_resolve_to_functions_and_methods():
    assert resolve_function(f"{__name__}.spiky") is spiky.__code__
    assert resolve_function(f"{__name__}.Holder.method") is Holder.method.__code__


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_such_package.module.fit", "no_such_package.module.fit: no importable module in that name"),
        ("os.path.no_such_function", "os.path.no_such_function: module 'os.path' has no 'no_such_function'"),
        ("math.sqrt", "math.sqrt: not a Python function (builtin_function_or_method)"),
    ],
)
def test_names_that_are_not_python_functions_say_why(name, message):
    with pytest.raises(LookupError, match="^" + message.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
        resolve_function(name)


def test_gpu_views_get_their_own_columns():
    # No GPU here: a hand-made row stands in for what the tracer records with a tf:GPU:0 view.
    row = LineRow(
        line=3,
        hits=1,
        contents="y = model(x)",
        views={
            "host": ViewFigures(peak_increase=2 * 2**20, net=0, peak=2 * 2**20),
            "tf:CPU:0": ViewFigures(peak_increase=0, net=0, peak=0),
            "tf:GPU:0": ViewFigures(peak_increase=512 * 2**20, net=-64 * 2**20, peak=600 * 2**20),
        },
    )
    header, line = render_lines(FunctionLines("test_gpu.py::test_fit", "test_gpu.py", 1, [row]))
    assert header.split() == ["Line", "Hits", "Peak+", "Net", "Peak", "GPU", "Peak+", "GPU", "Net", "Line", "contents"]
    assert line.split() == ["3", "1", "+2.0", "MiB", "+0", "B", "2.0", "MiB", "+512.0", "MiB", "-64.0", "MiB",
                            "y", "=", "model(x)"]
    assert row.to_dict()["gpu_peak_increase_bytes"] == 512 * 2**20
