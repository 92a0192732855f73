"""What ``--tfmem-explain`` costs: passing tests (should be nothing), failing tests, each traced line.

    python benchmarks/explain_overhead.py [--repeats 5]

1. Small Keras fits as real ``pytest`` processes with explaining off, on (the default ``rerun``
   mode) and on in ``from-start`` mode: the median and the fastest of the summed test times
   (JUnit XML: set-up, call and teardown of each test), and their ratios to "off". The settings
   alternate within each repeat, so drift hits them alike; on a busy machine the fastest run is
   the steadier figure.
2. The time the explain plugin's own hooks take per passing test, read with ``cProfile`` from
   a session of empty tests (an upper bound: profiling slows the hooks too).
3. One failing test with and without its explanation, and the tracer's cost per executed line.
"""

from __future__ import annotations

import argparse
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

PASSING_WORKLOAD = (Path(__file__).resolve().parent / "workloads" / "small_fits.py").read_text()

EMPTY_TESTS = 200
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


def compare(
    directory: Path, budget: str, repeats: int, settings: dict[str, list[str]]
) -> dict[str, tuple[float, float]]:
    """(median, fastest) summed test time per setting; the settings alternate so drift hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(repeats):
        for name, arguments in settings.items():
            times[name].append(test_times(directory, [f"--tfmem-budget={budget}", *arguments]))
    return {name: (statistics.median(values), min(values)) for name, values in times.items()}


def print_times(title: str, times: dict[str, tuple[float, float]]) -> None:
    print(title)
    median_off, fastest_off = times["off"]
    for name, (median, fastest) in times.items():
        print(f"  explain {name:<16} median {median:6.2f} s (x{median / median_off:.2f})"
              f"   fastest {fastest:6.2f} s (x{fastest / fastest_off:.2f})")


def hook_time_per_test(directory: Path) -> float:
    """Seconds the explain plugin's hooks take per passing test, read with ``cProfile``."""
    profile = directory / "hooks.prof"
    command = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--tfmem-budget=4GB", "--tfmem-explain", str(directory)]
    subprocess.run(command, cwd=directory, capture_output=True, text=True, check=False)
    stats = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    hooks = ("pytest_runtest_call", "pytest_runtest_makereport", "pytest_tfmem_rerun_wanted")
    total = sum(
        cumulative
        for (filename, _, function), (_, _, _, cumulative, _) in stats.items()
        if filename.endswith("pytest_tfmem/explain.py") and function in hooks
    )
    return total / EMPTY_TESTS


def per_line_cost(lines: int = 2000) -> float:
    """Seconds the tracer adds per executed line of a traced function."""
    from pytest_tfmem.explain.lines import LineTracer, function_code, line_trackers

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
    with tempfile.TemporaryDirectory(prefix="tfmem-explain-bench-") as temporary:
        root = Path(temporary)
        times = compare(workload(root, "keras", PASSING_WORKLOAD), "4GB", args.repeats, SETTINGS)
        print_times(f"8 passing Keras fit tests, summed test time ({args.repeats} runs):", times)
        hooks = hook_time_per_test(workload(root, "empty", EMPTY_WORKLOAD))
        print(
            f"explain on (rerun): its hooks take {hooks * 1e6:.0f} us per passing test "
            f"({EMPTY_TESTS} empty tests, cProfile)"
        )
        on_off = {name: SETTINGS[name] for name in ("off", "on (rerun)")}
        times = compare(workload(root, "failing", FAILING_WORKLOAD), "200MB", args.repeats, on_off)
        print_times(f"1 failing test (100 + 300 + 50 MB), its test time ({args.repeats} runs):", times)
    print(f"line tracer: {per_line_cost() * 1e6:.0f} us per executed line of a traced function")


if __name__ == "__main__":
    main()
