"""What measuring a test costs as the process grows: the same tests at about 0.2, 0.7 and 1.5 GiB.

    python -m benchmarks.process_size [--rounds 2] [--output docs/measurement.md]

A session fixture grows the process to the size first, as a real suite's earlier tests grow it:
several threads at once make many small allocations and let every other one go (each thread's own
arena left fragmented, as TensorFlow's thread pools leave theirs), Python containers, and, in a
TensorFlow/Keras process, Keras models built and fitted (traced functions, layers, kernels). Three
suites: 200 trivial tests in a process of Python alone (at 0.2, 0.7 and 1.5 GiB), the same 200
trivial tests in a TensorFlow/Keras process (which starts near 0.9 GiB: 1.5 GiB only), and small
Keras tests on TensorFlow (``benchmarks/workloads/small_keras.py``, two copies). Each suite and size
runs plain (``-p no:tfmem``) and with ``--tfmem-budget=64GB``, alternating, ``--rounds`` times; a
plugin of this benchmark times each test's whole protocol (setup, call, teardown), and as the last
test of each measured session begins, with the process still grown, times the protocol's steps
there, one by one (a young collection, a trim, the reads of the size and the mark, the mark's
reset) and counts the trims done and skipped (``probes.host.HeapTrims``). Printed: each test's
median time plain and measured, the difference (what a measured test costs), the ratio of the
largest size's cost to the smallest's, and the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import machine
from benchmarks.tables import markdown_table

MIB = 2**20
SIZES_MIB = (200, 700, 1500)
WORKLOAD = Path(__file__).resolve().parent / "workloads" / "small_keras.py"
GROWN = '''
import gc
import os
import threading

import psutil
import pytest

TARGET = int(os.environ["TFMEM_BENCH_SIZE_MIB"]) * 2**20


def fragmented(count, held):
    """A thread's many small allocations, every other one let go: its arena stays fragmented."""
    made = [bytearray(100 + (index % 13) * 150) for index in range(count)]
    held.append(made[::2])


@pytest.fixture(scope="session", autouse=True)
def grown_process():
    """The process grown to TARGET as a real suite's earlier tests grow it."""
    held = []
    keras = None
    if os.environ.get("TFMEM_BENCH_KERAS"):
        import keras
        import numpy as np
    while psutil.Process().memory_info().rss < TARGET:
        if keras is not None and len(held) < 240:
            model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256), keras.layers.Dense(64)])
            model.compile(optimizer="adam", loss="mse")
            model.fit(np.ones((64, 64), "float32"), np.ones((64, 64), "float32"), epochs=1, verbose=0)
            held.append(model)
        threads = [threading.Thread(target=fragmented, args=(20_000, held)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        held.append({index: [index] for index in range(2000)})
    gc.collect()
    yield held
'''
TIMING = '''
import gc
import json
import os
import statistics
import time

import psutil
import pytest

times = []
sizes = []
steps = {}  # the protocol's steps, timed as a measured session's last test begins


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if nextitem is None:  # the process as the tests ran, before the session fixture lets go
        sizes.append(psutil.Process().memory_info().rss)
        if item.config.pluginmanager.has_plugin("tfmem"):
            steps.update(_steps())
    started = time.perf_counter()
    try:
        return (yield)
    finally:
        times.append(time.perf_counter() - started)


def _step_ms(step, count=20):
    spent = []
    for _ in range(count):
        started = time.perf_counter()
        step()
        spent.append(time.perf_counter() - started)
    return statistics.median(spent) * 1000


def _steps():
    """The protocol's steps, each timed alone, in the grown process as its last test begins."""
    from pytest_tfmem import platforms
    from pytest_tfmem.probes import host

    platform = platforms.current()
    return {
        "young collection": _step_ms(lambda: gc.collect(1)),
        "trim (malloc_trim)": _step_ms(platform.release_freed_heap),
        "size (RSS)": _step_ms(platform.current_size),
        "mark (VmHWM)": _step_ms(platform.peak_mark),
        "mark's reset": _step_ms(platform.reset_peak_mark),
        "trims done": host.trims().trims,
        "trims skipped": host.trims().skipped,
    }


def pytest_sessionfinish(session):
    with open(os.environ["TFMEM_BENCH_TIMES"], "w") as out:
        json.dump({"times": times, "rss": sizes[-1] if sizes else 0, "steps": steps}, out)
'''
TRIVIAL = '''
import pytest


@pytest.mark.parametrize("index", range(200))
def test_trivial(index):
    pass
'''
SUITES = {"trivial": "200 trivial tests, Python alone", "trivial-keras": "200 trivial tests, TensorFlow/Keras process",
          "keras": "small Keras tests on TensorFlow (small_keras.py twice)"}


def prepare(directory: Path, suite: str) -> None:
    (directory / "pytest.ini").write_text("[pytest]\n")
    (directory / "conftest.py").write_text(GROWN)
    (directory / "bench_timing.py").write_text(TIMING)
    if suite.startswith("trivial"):
        (directory / "test_trivial.py").write_text(TRIVIAL)
    else:
        for copy in ("a", "b"):
            shutil.copy(WORKLOAD, directory / f"test_small_keras_{copy}.py")


def session(directory: Path, suite: str, size: int, measured: bool) -> dict:
    out = directory / "times.json"
    environment = {**os.environ, "TFMEM_BENCH_SIZE_MIB": str(size), "TFMEM_BENCH_TIMES": str(out),
                   "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow"}
    if suite != "trivial":
        environment["TFMEM_BENCH_KERAS"] = "1"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               "-p", "bench_timing", *(["--tfmem-budget=64GB"] if measured else ["-p", "no:tfmem"])]
    subprocess.run(command, cwd=directory, env=environment, capture_output=True, text=True, timeout=1800, check=False)
    return json.loads(out.read_text())


def median_ms(times: Sequence[float]) -> float:
    return statistics.median(times[2:]) * 1000  # the first tests pay the session's own start


# The sizes each suite runs at: a TensorFlow/Keras process starts near 0.9 GiB.
SUITE_SIZES = {"trivial": SIZES_MIB, "trivial-keras": SIZES_MIB[-1:], "keras": SIZES_MIB[-1:]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="plain and measured sessions, alternating (default 2)")
    parser.add_argument("--output", type=Path, help="write the tables between this script's markers in the page")
    args = parser.parse_args(argv)
    rows, costs, steps = [], {}, {}
    for suite, about in SUITES.items():
        with tempfile.TemporaryDirectory(prefix=f"tfmem-size-{suite}-") as scratch:
            directory = Path(scratch)
            prepare(directory, suite)
            for size in SUITE_SIZES[suite]:
                plain, measured, reached = [], [], []
                for _ in range(args.rounds):
                    for is_measured, kept in ((False, plain), (True, measured)):
                        result = session(directory, suite, size, is_measured)
                        kept.append(median_ms(result["times"]))
                        reached.append(result["rss"])
                        if is_measured:
                            steps[suite] = result["steps"]
                grown = statistics.median(reached)
                cost = statistics.median(measured) - statistics.median(plain)
                costs.setdefault(suite, []).append(cost)
                rows.append([about, f"{size} MiB", f"{grown / MIB:.0f} MiB", f"{statistics.median(plain):.2f} ms",
                             f"{statistics.median(measured):.2f} ms", f"{cost:+.2f} ms"])
                print(rows[-1], flush=True)
    lines = [machine.written_by("-m benchmarks.process_size", argv) + ".", "",
             *markdown_table(["suite", "size asked", "process at the last test", "a test, plain", "a test, measured",
                              "what measuring costs"], rows), ""]
    for suite, found in costs.items():
        if len(found) >= 2 and found[0] > 0:
            lines.append(f"{SUITES[suite]}: the cost at the largest size is {found[-1] / found[0]:.2f}x the cost at "
                         "the smallest.")
    lines += ["", f"The protocol's steps, each timed alone as the last test of a measured session at {SIZES_MIB[-1]} "
              "MiB began, the process still grown (median of 20), and the trims of that session before it:", ""]
    names = [name for name in next(iter(steps.values()), {}) if not name.startswith("trims")]
    lines += markdown_table(
        ["suite", *names, "trims done / skipped"],
        [[SUITES[suite], *(f"{found[name]:.3f} ms" for name in names),
          f"{found['trims done']} / {found['trims skipped']}"] for suite, found in steps.items() if found])
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.output is not None:
        machine.write_section(args.output, "benchmarks/process_size.py", text,
                              "What measuring costs as the process grows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
