"""What ``--tfmem-explain`` costs: passing tests (should be nothing), failing tests, each traced line.

    python benchmarks/explain_overhead.py [--repeats 5]

Runs workloads as real ``pytest`` processes with explaining off, on (the default ``rerun``
mode) and, for reference, on in ``from-start`` mode, and prints the median of the summed
test times (JUnit XML: set-up, call and teardown of each test) and their ratio to "off":
small Keras fits (the relative cost), 300 empty tests (the cost per test, in microseconds),
and one failing test (what its explanation costs). Then the tracer's cost per executed line
of a traced function. The settings alternate within each repeat, so drift hits them alike.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

PASSING_WORKLOAD = """
import numpy as np
import pytest
import tensorflow as tf

@pytest.mark.parametrize("run", range(8))
def test_small_fit(run):
    model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64), tf.keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.fit(np.zeros((256, 32), "float32"), np.zeros((256, 1), "float32"), batch_size=32, epochs=1, verbose=0)
"""

EMPTY_TESTS = 300
EMPTY_WORKLOAD = f"""
import pytest

@pytest.mark.parametrize("run", range({EMPTY_TESTS}))
def test_empty(run):
    pass
"""

FAILING_WORKLOAD = """
import numpy as np

def test_three_allocations():
    a = np.ones(100 * 10**6 // 8)
    b = np.ones(300 * 10**6 // 8)
    c = np.ones(50 * 10**6 // 8)
"""

SETTINGS = {
    "off": [],
    "on (rerun)": ["--tfmem-explain"],
    "on (from-start)": ["--tfmem-explain", "--tfmem-explain-mode=from-start"],
}


def test_times(directory: Path, arguments: list[str]) -> float:
    """Run pytest on ``directory``; the summed JUnit time of its tests, in seconds."""
    junit = directory / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}", "--tfmem-trace=off", *arguments, str(directory)]
    subprocess.run(command, cwd=directory, capture_output=True, text=True, check=False)
    return sum(float(case.get("time", 0)) for case in ET.parse(junit).getroot().iter("testcase"))


def compare(directory: Path, budget: str, repeats: int, settings: dict[str, list[str]]) -> dict[str, float]:
    """Median summed test time per setting; the settings alternate so drift hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(repeats):
        for name, arguments in settings.items():
            times[name].append(test_times(directory, [f"--tfmem-budget={budget}", *arguments]))
    return {name: statistics.median(values) for name, values in times.items()}


def per_line_cost(lines: int = 2000) -> float:
    """Seconds the tracer adds per executed line of a traced function."""
    from pytest_tfmem.explain_lines import LineTracer, function_code, line_trackers

    def loop() -> None:
        for number in range(lines):
            _ = number

    started = time.perf_counter()
    loop()
    plain = time.perf_counter() - started
    with LineTracer({function_code(loop, "loop"): "loop"}, line_trackers()):
        started = time.perf_counter()
        loop()
        traced = time.perf_counter() - started
    return (traced - plain) / (2 * lines)  # two line events per iteration


def workload(root: Path, name: str, source: str) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / f"test_{name}.py").write_text(source)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs = f"median of {args.repeats} runs"
    with tempfile.TemporaryDirectory(prefix="tfmem-explain-bench-") as temporary:
        root = Path(temporary)
        medians = compare(workload(root, "keras", PASSING_WORKLOAD), "4GB", args.repeats, SETTINGS)
        print(f"8 passing Keras fit tests, summed test time ({runs}):")
        for name, seconds in medians.items():
            print(f"  explain {name:<16} {seconds:6.2f} s   x{seconds / medians['off']:.3f}")
        on_off = {name: SETTINGS[name] for name in ("off", "on (rerun)")}
        medians = compare(workload(root, "empty", EMPTY_WORKLOAD), "4GB", args.repeats, on_off)
        added = (medians["on (rerun)"] - medians["off"]) / EMPTY_TESTS
        print(f"{EMPTY_TESTS} passing empty tests, summed test time ({runs}):")
        for name, seconds in medians.items():
            print(f"  explain {name:<16} {seconds:6.3f} s")
        print(f"  added per passing test: {added * 1e6:+.0f} us")
        medians = compare(workload(root, "failing", FAILING_WORKLOAD), "200MB", args.repeats, on_off)
        print(f"1 failing test (100 + 300 + 50 MB), its test time ({runs}):")
        for name, seconds in medians.items():
            print(f"  explain {name:<16} {seconds:6.3f} s")
    print(f"line tracer: {per_line_cost() * 1e6:.0f} us per executed line of a traced function")


if __name__ == "__main__":
    main()
