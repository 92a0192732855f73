"""What TensorBoard traces cost: passing tests (should be nothing), and a failing test's trace.

    python benchmarks/trace_overhead.py [--repeats 5]

Runs workloads as real ``pytest`` processes and prints, per setting, the median over repeats
of the summed per-test time (set-up, call and teardown), both as wall-clock time and as the
process's CPU time (all threads; unlike wall time, it does not grow when other processes
compete for the CPU): small passing Keras fits with the trace feature absent
(``-p no:pytest_tfmem.trace.plugin``), ``off``, ``on-failure`` (the default once TensorFlow is
loaded) and, for reference, ``always``, each with its ratio to "absent"; then one failing
Keras test with tracing off and on-failure (what its trace costs: the re-run under the
profiler and writing the directory). The settings alternate within each repeat, so drift
hits them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PASSING_WORKLOAD = (Path(__file__).resolve().parent / "workloads" / "small_fits.py").read_text()

FAILING_WORKLOAD = """
import numpy as np
import tensorflow as tf

def test_small_fit_over_budget():
    inputs = tf.random.normal((2048, 4096))  # 32 MiB: over the 8 MB budget
    model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64), tf.keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.fit(np.zeros((256, 32), "float32"), np.zeros((256, 1), "float32"), batch_size=32, epochs=1, verbose=0)
"""

# Drives the trace feature's hooks that run for every passing measured test (its test-call
# wrapper, its report sections) the way pytest and the core do, many times, inside a real
# session with TensorFlow loaded: their own cost per passing test.
HOOKS_WORKLOAD = """
import json, os, time
import pytest
import tensorflow as tf

CALLS = 20000

@pytest.mark.tfmem(budget="4GB")
def test_hooks_of_a_passing_test(request):
    trace = request.config.pluginmanager.get_plugin("tfmem-trace")
    item = request.node
    started = time.perf_counter()
    for _ in range(CALLS):
        hook = trace.pytest_runtest_call(item)
        next(hook)
        try:
            hook.send(None)
        except StopIteration:
            pass
        trace.pytest_tfmem_report_sections(item)
    with open(os.environ["TFMEM_TRACE_BENCH_HOOKS"], "w") as out:
        out.write(json.dumps((time.perf_counter() - started) / CALLS))
"""

SETTINGS = {
    "absent": ["-p", "no:pytest_tfmem.trace.plugin"],
    "off": ["--tfmem-trace=off"],
    "on-failure": ["--tfmem-trace=on-failure"],
    "always": ["--tfmem-trace=always"],
}


# Loaded into the workload's pytest process: per test, wall and CPU seconds of its whole protocol.
TIMING_CONFTEST = """
import json, os, time
import pytest

@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        return (yield)
    finally:
        with open(os.environ["TFMEM_TRACE_BENCH_TIMES"], "a") as times:
            times.write(json.dumps([time.perf_counter() - wall, time.process_time() - cpu]) + "\\n")
"""


def test_times(directory: Path, arguments: list[str]) -> tuple[float, float]:
    """Run pytest on ``directory``; its tests' summed wall and CPU seconds."""
    times = directory / "times.jsonl"
    times.unlink(missing_ok=True)
    if "no:pytest_tfmem.trace.plugin" not in arguments:
        arguments = [f"--tfmem-trace-dir={directory / 'traces'}", *arguments]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *arguments, str(directory)]
    environment = {**os.environ, "TFMEM_TRACE_BENCH_TIMES": str(times)}
    subprocess.run(command, cwd=directory, capture_output=True, text=True, check=False, env=environment)
    rows = [json.loads(line) for line in times.read_text().splitlines()]
    return sum(wall for wall, _ in rows), sum(cpu for _, cpu in rows)


def compare(
    directory: Path, budget: str, repeats: int, settings: dict[str, list[str]]
) -> dict[str, tuple[float, float]]:
    """Median summed (wall, CPU) test time per setting; the settings alternate so drift hits them alike."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in settings}
    for _ in range(repeats):
        for name, arguments in settings.items():
            times[name].append(test_times(directory, [f"--tfmem-budget={budget}", *arguments]))
    return {
        name: (statistics.median(w for w, _ in values), statistics.median(c for _, c in values))
        for name, values in times.items()
    }


def workload(root: Path, name: str, source: str) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / "pytest.ini").write_text("[pytest]\n")  # this repository's settings stay out
    (directory / "conftest.py").write_text(TIMING_CONFTEST)
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
        wall_0, cpu_0 = medians["absent"]
        print(f"8 passing Keras fit tests, summed test time ({runs}):")
        for name, (wall, cpu) in medians.items():
            print(f"  trace {name:<11} wall {wall:6.2f} s  x{wall / wall_0:.3f}   CPU {cpu:6.2f} s  x{cpu / cpu_0:.3f}")
        medians = compare(workload(root, "failing", FAILING_WORKLOAD), "8MB", args.repeats, on_off)
        print(f"1 failing Keras fit test, its test time ({runs}):")
        for name, (wall, cpu) in medians.items():
            print(f"  trace {name:<11} wall {wall:6.2f} s   CPU {cpu:6.2f} s")
        added = medians["on-failure"][0] - medians["off"][0]
        print(f"  its trace (re-run under the profiler, files written): {added:+.2f} s wall")
        print(f"the trace feature's hooks, per passing measured test: {hook_cost(root) * 1e6:.1f} us")


def hook_cost(root: Path) -> float:
    """Seconds the trace feature's own hook wrappers take for one passing measured test."""
    directory = workload(root, "hooks", HOOKS_WORKLOAD)
    result = directory / "hooks.json"
    environment = {**os.environ, "TFMEM_TRACE_BENCH_HOOKS": str(result)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(directory)]
    subprocess.run(command, cwd=directory, capture_output=True, text=True, check=False, env=environment)
    return float(json.loads(result.read_text()))


if __name__ == "__main__":
    main()
