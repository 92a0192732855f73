"""What ``--tfmem-isolate`` costs per test: plain tests and tests that import TensorFlow.

    python benchmarks/isolation_overhead.py [--tests 6] [--repeats 3]

Runs two workloads as real ``pytest`` sessions, in process and isolated, and prints the
median wall time of each session, and the isolated session's extra time per test. A plain
test costs a fresh interpreter that imports pytest, its plugins and the test module; a TF
test adds TensorFlow's import and runtime start-up, paid once per session in process but
once per test isolated. The machine's load average is printed with the numbers: on a
shared machine, compare the ratio rather than the seconds.
"""

from __future__ import annotations

import argparse
import os
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


def session_seconds(directory: Path, *options: str) -> float:
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tfmem-budget=4GB", *options],
        cwd=directory,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(f"pytest failed in {directory}:\n{completed.stdout[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=6, help="tests per workload (default 6)")
    parser.add_argument("--repeats", type=int, default=3, help="sessions per variant; the median is shown (default 3)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'workload':<11} {'in process':>11} {'isolated':>10} {'extra per isolated test':>24}")
    for name, source in WORKLOADS.items():
        with tempfile.TemporaryDirectory(prefix=f"tfmem-isolation-{name}-") as directory:
            path = Path(directory)
            (path / f"test_{name}.py").write_text(source.replace("{tests}", str(args.tests)))
            in_process = statistics.median(session_seconds(path) for _ in range(args.repeats))
            isolated = statistics.median(session_seconds(path, "--tfmem-isolate") for _ in range(args.repeats))
        per_test = (isolated - in_process) / args.tests
        print(f"{name:<11} {in_process:>10.2f}s {isolated:>9.2f}s {per_test:>23.2f}s")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
