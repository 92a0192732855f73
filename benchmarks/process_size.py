"""What measuring a test costs as the process grows: the same tests at about 0.2, 0.7 and 1.5 GiB.

    python -m benchmarks.process_size [--rounds 2] [--output docs/measurement.md]

Two suites: 200 trivial tests (no framework), and small Keras tests on TensorFlow
(``benchmarks/workloads/small_keras.py``, two copies of it). A session fixture grows the process
to the size first, as a real suite's earlier tests do: Keras models built and fitted (traced
functions, kernels), Python containers, buffers in the C allocator's heap and arrays, every third
let go again, so the heap is fragmented; where the suite's own start is larger than a size (a
TensorFlow process starts near 0.9 GiB), that size is left out. Each suite and size runs plain
(``-p no:tfmem``) and with ``--tfmem-budget=64GB``, alternating, ``--rounds`` times; a plugin of
this benchmark times each test's whole protocol (setup, call, teardown). Printed: each test's
median time plain and measured, the difference (what a measured test costs), the ratio of the
largest size's cost to the smallest's, and where the measured test's time goes at the largest size
(``cProfile``, by pytest-tfmem's module, as ``benchmarks/per_test_profile.py`` reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import machine
from benchmarks.per_test_profile import per_test_times
from benchmarks.tables import markdown_table

MIB = 2**20
SIZES_MIB = (200, 700, 1500)
WORKLOAD = Path(__file__).resolve().parent / "workloads" / "small_keras.py"
GROWN = '''
import gc
import os

import psutil
import pytest

TARGET = int(os.environ["TFMEM_BENCH_SIZE_MIB"]) * 2**20


@pytest.fixture(scope="session", autouse=True)
def grown_process():
    """The process grown to TARGET as a real suite's earlier tests grow it, every third piece let go."""
    held = []
    keras = None
    if os.environ.get("TFMEM_BENCH_KERAS"):
        import keras
        import numpy as np
    while psutil.Process().memory_info().rss < TARGET:
        if keras is not None and len(held) < 120:
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256), keras.layers.Dense(64)])
            model.compile(optimizer="adam", loss="mse")
            model.fit(np.ones((64, 64), "float32"), np.ones((64, 64), "float32"), epochs=1, verbose=0)
            held.append(model)
        held.append([bytearray(1500) for _ in range(2000)])
        held.append({index: [index] for index in range(2000)})
        held.append(bytearray(200_000))
        held[-3] = None  # let go of every third piece as it grows: a fragmented heap of this size
    gc.collect()
    yield held
'''
TIMING = '''
import json
import os
import time

import psutil
import pytest

times = []
sizes = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if nextitem is None:  # the process as the tests ran, before the session fixture lets go
        sizes.append(psutil.Process().memory_info().rss)
    started = time.perf_counter()
    try:
        return (yield)
    finally:
        times.append(time.perf_counter() - started)


def pytest_sessionfinish(session):
    with open(os.environ["TFMEM_BENCH_TIMES"], "w") as out:
        json.dump({"times": times, "rss": sizes[-1] if sizes else 0}, out)
'''
TRIVIAL = '''
import pytest


@pytest.mark.parametrize("index", range(200))
def test_trivial(index):
    pass
'''
SUITES = {"trivial": "200 trivial tests", "keras": "small Keras tests on TensorFlow (small_keras.py twice)"}


def prepare(directory: Path, suite: str) -> None:
    (directory / "pytest.ini").write_text("[pytest]\n")
    (directory / "conftest.py").write_text(GROWN)
    (directory / "bench_timing.py").write_text(TIMING)
    if suite == "trivial":
        (directory / "test_trivial.py").write_text(TRIVIAL)
    else:
        for copy in ("a", "b"):
            shutil.copy(WORKLOAD, directory / f"test_small_keras_{copy}.py")


def session(directory: Path, suite: str, size: int, measured: bool, profile: Path | None = None) -> dict:
    out = directory / "times.json"
    environment = {**os.environ, "TFMEM_BENCH_SIZE_MIB": str(size), "TFMEM_BENCH_TIMES": str(out),
                   "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
    if suite == "keras":
        environment["TFMEM_BENCH_KERAS"] = "1"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               "-p", "bench_timing", *(["--tfmem-budget=64GB"] if measured else ["-p", "no:tfmem"])]
    if profile is not None:
        command[1:1] = ["-m", "cProfile", "-o", str(profile)]  # python -m cProfile -o PATH -m pytest ...
    subprocess.run(command, cwd=directory, env=environment, capture_output=True, text=True, timeout=1800, check=False)
    return json.loads(out.read_text())


def median_ms(times: Sequence[float]) -> float:
    return statistics.median(times[2:]) * 1000  # the first tests pay the session's own start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="plain and measured sessions, alternating (default 2)")
    parser.add_argument("--output", type=Path, help="write the tables between this script's markers in the page")
    args = parser.parse_args(argv)
    rows, costs, profiles = [], {}, []
    for suite, about in SUITES.items():
        with tempfile.TemporaryDirectory(prefix=f"tfmem-size-{suite}-") as scratch:
            directory = Path(scratch)
            prepare(directory, suite)
            for size in SIZES_MIB:
                plain, measured, reached = [], [], []
                for _ in range(args.rounds):
                    for is_measured, kept in ((False, plain), (True, measured)):
                        result = session(directory, suite, size, is_measured)
                        kept.append(median_ms(result["times"]))
                        reached.append(result["rss"])
                grown = statistics.median(reached)
                if grown > size * MIB * 1.3:  # the suite's own start is past this size
                    rows.append([about, f"{size} MiB", f"(starts at {grown / MIB:.0f} MiB)", "-", "-", "-"])
                    continue
                cost = statistics.median(measured) - statistics.median(plain)
                costs.setdefault(suite, []).append(cost)
                rows.append([about, f"{size} MiB", f"{grown / MIB:.0f} MiB", f"{statistics.median(plain):.2f} ms",
                             f"{statistics.median(measured):.2f} ms", f"{cost:+.2f} ms"])
                print(rows[-1], flush=True)
            profile = directory / "profile.out"
            tests = len(session(directory, suite, SIZES_MIB[-1], True, profile=profile)["times"])
            spent = per_test_times(pstats.Stats(str(profile)), tests)
            total = sum(spent.values())
            profiles.append((about, tests, spent, total))
    lines = [machine.written_by("-m benchmarks.process_size", argv) + ".", "",
             *markdown_table(["suite", "size asked", "process at the last test", "a test, plain", "a test, measured",
                              "what measuring costs"], rows), ""]
    for suite, found in costs.items():
        if len(found) >= 2 and found[0] > 0:
            lines.append(f"{SUITES[suite]}: the cost at the largest size is {found[-1] / found[0]:.2f}x the cost at "
                         "the smallest.")
    lines.append("")
    for about, tests, spent, total in profiles:
        lines += [f"Where a measured test's time goes at {SIZES_MIB[-1]} MiB, {about} (`cProfile`, per test):", "",
                  *markdown_table(["module", "per test (profiled)", "share"], [
                      [f"`{name}`", f"{seconds / tests * 1000:.2f} ms", f"{seconds / total:.0%}"]
                      for name, seconds in sorted(spent.items(), key=lambda item: -item[1])[:8]]), ""]
    text = "\n".join(lines)
    print(text)
    if args.output is not None:
        machine.write_section(args.output, "benchmarks/process_size.py", text,
                              "What measuring costs as the process grows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
