"""What TensorBoard traces cost: passing tests (should be nothing), and a failing test's trace.

    python benchmarks/trace_overhead.py [--repeats 5]

Runs workloads as real ``pytest`` processes and prints the median of the summed test times
(JUnit XML: set-up, call and teardown of each test): small passing Keras fits with the trace
feature absent (``-p no:pytest_tfmem.trace``), ``off``, ``on-failure`` (the default once
TensorFlow is loaded) and, for reference, ``always``, with each one's ratio to "absent"; then
one failing Keras test with tracing off and on-failure (what its trace costs: the re-run under
the profiler and writing the directory). The settings alternate within each repeat, so drift
hits them alike.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
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

FAILING_WORKLOAD = """
import numpy as np
import tensorflow as tf

def test_small_fit_over_budget():
    inputs = tf.random.normal((2048, 4096))  # 32 MiB: over the 8 MB budget
    model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64), tf.keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.fit(np.zeros((256, 32), "float32"), np.zeros((256, 1), "float32"), batch_size=32, epochs=1, verbose=0)
"""

SETTINGS = {
    "absent": ["-p", "no:pytest_tfmem.trace"],
    "off": ["--tfmem-trace=off"],
    "on-failure": ["--tfmem-trace=on-failure"],
    "always": ["--tfmem-trace=always"],
}


def test_times(directory: Path, arguments: list[str]) -> float:
    """Run pytest on ``directory``; the summed JUnit time of its tests, in seconds."""
    junit = directory / "junit.xml"
    if "no:pytest_tfmem.trace" not in arguments:
        arguments = [f"--tfmem-trace-dir={directory / 'traces'}", *arguments]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *arguments, str(directory)]
    subprocess.run(command, cwd=directory, capture_output=True, text=True, check=False)
    return sum(float(case.get("time", 0)) for case in ET.parse(junit).getroot().iter("testcase"))


def compare(directory: Path, budget: str, repeats: int, settings: dict[str, list[str]]) -> dict[str, float]:
    """Median summed test time per setting; the settings alternate so drift hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(repeats):
        for name, arguments in settings.items():
            times[name].append(test_times(directory, [f"--tfmem-budget={budget}", *arguments]))
    return {name: statistics.median(values) for name, values in times.items()}


def workload(root: Path, name: str, source: str) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / "pytest.ini").write_text("[pytest]\n")  # this repository's settings stay out
    (directory / f"test_{name}.py").write_text(source)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs = f"median of {args.repeats} runs"
    on_off = {name: SETTINGS[name] for name in ("off", "on-failure")}
    with tempfile.TemporaryDirectory(prefix="tfmem-trace-bench-") as temporary:
        root = Path(temporary)
        medians = compare(workload(root, "keras", PASSING_WORKLOAD), "4GB", args.repeats, SETTINGS)
        print(f"8 passing Keras fit tests, summed test time ({runs}):")
        for name, seconds in medians.items():
            print(f"  trace {name:<11} {seconds:6.2f} s   x{seconds / medians['absent']:.3f}")
        medians = compare(workload(root, "failing", FAILING_WORKLOAD), "8MB", args.repeats, on_off)
        print(f"1 failing Keras fit test, its test time ({runs}):")
        for name, seconds in medians.items():
            print(f"  trace {name:<11} {seconds:6.3f} s")
        print(f"  its trace (re-run under the profiler, files written): {medians['on-failure'] - medians['off']:+.2f} s")


if __name__ == "__main__":
    main()
