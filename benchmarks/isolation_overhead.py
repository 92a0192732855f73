"""What ``--tfmem-isolate`` costs per test: plain tests and tests that import TensorFlow.

    python benchmarks/isolation_overhead.py [--tests 6] [--repeats 3]

Runs two workloads as real ``pytest`` sessions, in process and isolated, and prints the
median wall time and CPU time (user + system, of pytest and every process it started) of
each session, and the isolated session's extra time per test. A plain
test costs a fresh interpreter that imports pytest, its plugins and the test module; a TF
test adds TensorFlow's import and runtime start-up, paid once per session in process but
once per test isolated. The machine's load average is printed with the numbers: on a
shared machine the CPU time is the steadier figure.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOADS = {
    "plain": """
import numpy as np
import pytest

@pytest.mark.parametrize("run", range({tests}))
def test_plain(run):
    assert np.ones(10**6).sum() == 10**6
""",
    "tensorflow": """
import pytest
import tensorflow as tf

@pytest.mark.parametrize("run", range({tests}))
def test_tf(run):
    x = tf.random.uniform((256, 256))
    assert float(tf.reduce_sum(tf.matmul(x, x))) > 0
""",
}


def session_seconds(directory: Path, *options: str) -> tuple[float, float]:
    """Wall and CPU seconds of one pytest session (CPU: user + system of it and its children)."""
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tfmem-budget=4GB", *options],
        check=False,
        cwd=directory,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode != 0:
        raise SystemExit(f"pytest failed in {directory}:\n{completed.stdout[-3000:]}")
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return elapsed, cpu


def command_seconds(code: str) -> tuple[float, float]:
    """Wall and CPU seconds of ``python -c code``: the yardstick for start-up costs."""
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return elapsed, (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)


def medians(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(wall for wall, _ in runs), statistics.median(cpu for _, cpu in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=6, help="tests per workload (default 6)")
    parser.add_argument("--repeats", type=int, default=3, help="sessions per variant; the median is shown (default 3)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{args.tests} tests per session; wall / CPU seconds, median of {args.repeats}")
    print(f"{'workload':<11} {'in process':>16} {'isolated':>16} {'extra per isolated test':>26}")
    for name, source in WORKLOADS.items():
        with tempfile.TemporaryDirectory(prefix=f"tfmem-isolation-{name}-") as directory:
            path = Path(directory)
            (path / f"test_{name}.py").write_text(source.replace("{tests}", str(args.tests)))
            wall, cpu = medians([session_seconds(path) for _ in range(args.repeats)])
            isolated = [session_seconds(path, "--tfmem-isolate") for _ in range(args.repeats)]
            wall_isolated, cpu_isolated = medians(isolated)
        extra_wall, extra_cpu = (wall_isolated - wall) / args.tests, (cpu_isolated - cpu) / args.tests
        print(
            f"{name:<11} {wall:>7.2f} / {cpu:>5.2f}s {wall_isolated:>7.2f} / {cpu_isolated:>5.2f}s "
            f"{extra_wall:>14.2f} / {extra_cpu:>5.2f}s"
        )
    for code in ("import pytest", "import tensorflow"):
        wall, cpu = medians([command_seconds(code) for _ in range(args.repeats)])
        print(f"for scale, python -c {code!r}: {wall:.2f} / {cpu:.2f}s")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
