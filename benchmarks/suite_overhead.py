"""What measuring every test costs a real TensorFlow suite: with and without pytest-tfmem, in one run.

    python benchmarks/suite_overhead.py                  # about 4 minutes on 2 cores
    python benchmarks/suite_overhead.py --repeat 1 --keras-tests 10 --trivial-tests 100

Three generated suites, each run as a whole pytest session in a fresh process, alternately
without the plugin (``-p no:tfmem``) and with ``--tfmem-budget=4GB`` (every test measured):

- ``keras``: small Keras ``fit`` tests (about 1 s each on 2 cores), half plain functions, half methods of a
  ``tf.test.TestCase`` class;
- ``trivial-tf``: tests that do nothing, in a module that imports TensorFlow and Keras: the
  fixed cost per measured test, with the most objects for the garbage collector to see;
- ``drift``: trivial tests in a TensorFlow module where each test drops the 1 MiB cyclic object
  the test before it made, and makes its own: garbage that only a full collection finds. The
  RSS every 20 tests, from test 20 to the last, shows whether such memory is reclaimed.

Wall time is the session's (``time.perf_counter`` around the process); CPU time is the
process's user + system time (steadier on a shared machine); GC is the CPU time spent collecting
garbage, Python's own collections and tfmem's (``benchmarks/gc_clock.py``, loaded on both sides):
tfmem's collections before each test stand in for much of what Python would collect anyway.
The table shows the median of the repetitions and the ratio with/without.
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
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``pytest_tfmem`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import machine
from pytest_tfmem.files import write_text_atomic

# TensorFlow's pooling CPU allocator (oneDNN) is its default on some x86 CPUs and not on others
# (AMD EPYC): on, every machine measures the same TensorFlow, with the pool that hides memory.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

KERAS_MODULE = '''
import numpy as np
import pytest
import tensorflow as tf
import keras

X = np.random.default_rng(0).random((512, 16), dtype=np.float32)
Y = X.sum(axis=1, keepdims=True)


def fit_small_model():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.fit(X, Y, epochs=2, batch_size=64, verbose=0)
    return model


@pytest.mark.parametrize("seed", range({functions}))
def test_fit_function(seed):
    assert fit_small_model().count_params() == 577


class FitTest(tf.test.TestCase):
{methods}
'''

METHOD = '''
    def test_fit_method_{index}(self):
        self.assertEqual(fit_small_model().count_params(), 577)
'''

TRIVIAL_MODULE = '''
import pytest
import tensorflow as tf
import keras

tf.constant(1.0)  # the runtime started, as in a real suite


@pytest.mark.parametrize("index", range({count}))
def test_trivial(index):
    pass
'''

DRIFT_MODULE = '''
import os
import pytest
import tensorflow as tf
import keras


class Cycle:
    def __init__(self):
        self.me = self
        self.payload = bytearray(2**20)


HELD = [None]


def rss_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.parametrize("index", range({count}))
def test_drop_and_make(index):
    HELD[0] = Cycle()  # the previous test's cycle becomes garbage now
    if index % 20 == 0 or index == {count} - 1:
        with open(os.environ["DRIFT_FILE"], "a") as out:
            out.write(f"{{index}} {{rss_mib():.1f}}\\n")
'''


REPOSITORY = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Run:
    wall_s: float
    cpu_s: float
    gc_s: float  # CPU time in garbage collection, Python's own and tfmem's (``gc_clock``)
    drift: dict[int, float]


def write_suites(root: Path, keras_tests: int, trivial_tests: int) -> dict[str, Path]:
    suites = {"keras": root / "keras", "trivial-tf": root / "trivial", "drift": root / "drift"}
    for path in suites.values():
        path.mkdir()
        (path / "pytest.ini").write_text("[pytest]\n")
    functions = keras_tests // 2
    methods = "".join(METHOD.format(index=i) for i in range(keras_tests - functions))
    (suites["keras"] / "test_keras.py").write_text(KERAS_MODULE.format(functions=functions, methods=methods))
    (suites["trivial-tf"] / "test_trivial.py").write_text(TRIVIAL_MODULE.format(count=trivial_tests))
    (suites["drift"] / "test_drift.py").write_text(DRIFT_MODULE.format(count=trivial_tests))
    return suites


def run_session(suite: Path, with_plugin: bool) -> Run:
    drift_file, gc_file = suite / "drift.txt", suite / "gc.txt"
    drift_file.unlink(missing_ok=True)
    plugin_args = ["--tfmem-budget=4GB"] if with_plugin else ["-p", "no:tfmem"]
    python_path = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "DRIFT_FILE": str(drift_file), "GC_CLOCK_FILE": str(gc_file),
                   "PYTHONPATH": python_path, "TF_CPP_MIN_LOG_LEVEL": "3"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-p", "benchmarks.gc_clock", *plugin_args],
        cwd=suite, env=environment, capture_output=True, text=True,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode != 0:
        how = "with" if with_plugin else "without"
        raise RuntimeError(f"{suite.name} ({how} tfmem) failed:\n{completed.stdout[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    drift = {}
    if drift_file.exists():
        for line in drift_file.read_text().splitlines():
            index, mib = line.split()
            drift[int(index)] = float(mib)
    return Run(wall, cpu, float(gc_file.read_text()), drift)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="sessions per suite and side (default 3)")
    parser.add_argument("--keras-tests", type=int, default=40, help="tests in the Keras suite (default 40)")
    parser.add_argument("--trivial-tests", type=int, default=300, help="tests in the trivial suites (default 300)")
    parser.add_argument(
        "--output", help="also write the table, with the command and the machine, to this Markdown file"
    )
    args = parser.parse_args(argv)
    runs: dict[tuple[str, bool], list[Run]] = {}
    with tempfile.TemporaryDirectory(prefix="tfmem-suite-overhead-") as temporary:
        suites = write_suites(Path(temporary), args.keras_tests, args.trivial_tests)
        for repetition in range(args.repeat):
            for name, suite in suites.items():
                order = (False, True) if repetition % 2 == 0 else (True, False)  # alternate who goes first
                for with_plugin in order:
                    print(f"[{repetition + 1}/{args.repeat}] {name} {'with' if with_plugin else 'without'} tfmem",
                          file=sys.stderr, flush=True)
                    runs.setdefault((name, with_plugin), []).append(run_session(suite, with_plugin))
    tests = {"keras": args.keras_tests, "trivial-tf": args.trivial_tests, "drift": args.trivial_tests}
    rows = []
    for name in suites:
        without, with_ = runs[(name, False)], runs[(name, True)]
        row = {"suite": name, "tests": tests[name]}
        for key in ("wall_s", "cpu_s", "gc_s"):
            plain = statistics.median(getattr(r, key) for r in without)
            measured = statistics.median(getattr(r, key) for r in with_)
            row[key] = (plain, measured, measured / plain, (measured - plain) / tests[name] * 1000)
        if name == "drift":
            last = args.trivial_tests - 1
            row["rss_mib"] = {
                side: {
                    "end": statistics.median(r.drift[last] - r.drift[20] for r in rs),
                    "highest": statistics.median(max(mib for i, mib in r.drift.items() if i >= 20) - r.drift[20]
                                                 for r in rs),
                }
                for side, rs in (("without", without), ("with", with_))
            }
        rows.append(row)
    table = render(rows)
    print(table)
    if args.output:
        heading = (
            f"# What measuring every test costs\n\n{machine.written_by('benchmarks/suite_overhead.py', argv)}; "
            "medians of the repetitions. See the module docstring of `benchmarks/suite_overhead.py`.\n\n"
        )
        write_text_atomic(args.output, heading + table + "\n")
    return 0


def render(rows: list[dict]) -> str:
    lines = [
        "| suite | tests | wall without | wall with | ratio | extra per test | CPU without | CPU with | ratio "
        "| GC without | GC with |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        wall, cpu, collecting = row["wall_s"], row["cpu_s"], row["gc_s"]
        lines.append(
            f"| {row['suite']} | {row['tests']} "
            f"| {wall[0]:.2f} s | {wall[1]:.2f} s | x{wall[2]:.3f} | {wall[3]:+.1f} ms "
            f"| {cpu[0]:.2f} s | {cpu[1]:.2f} s | x{cpu[2]:.3f} "
            f"| {collecting[0]:.2f} s | {collecting[1]:.2f} s |"
        )
    drift = next((row["rss_mib"] for row in rows if "rss_mib" in row), None)
    if drift is not None:
        lines.append("")
        lines.append(
            f"RSS of `drift` (each test leaves 1 MiB of cyclic garbage) above its level at test 20, read every "
            f"20 tests: without tfmem {drift['without']['end']:+.1f} MiB at the last test, "
            f"{drift['without']['highest']:+.1f} MiB at the highest; with tfmem {drift['with']['end']:+.1f} MiB "
            f"at the last test, {drift['with']['highest']:+.1f} MiB at the highest"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
