"""How much each test's figures move with the order of the tests before it, with and without the
first-use warm-up, and what the warm-up adds to a session's start.

    python -m benchmarks.order_spread [--orders 5] [--suites tensorflow,jax,torch,keras-own]
                                      [--output docs/measurement.md]

Suites: ``benchmarks/workloads/small_keras.py`` on each Keras backend (small Dense, Conv2D, LSTM
and Embedding tests, a training loop with the backend's own gradients, a tf.data pipeline on
TensorFlow), and Keras's own ``dense_test``, ``embedding_test``, ``sequential_test``,
``functional_test`` and ``early_stopping_test`` from the installed Keras, on TensorFlow. Each runs
``--orders`` times in a random order (pytest-randomly, seeds 1, 2, ...) and once more under
``-n 2`` (seed ``orders + 1``), measured with ``--tfmem-budget=64GB`` and the warm-up
(``--tfmem-first-use-warmup=true``), then again without it (``--no-tfmem-first-use-warmup``, the
default). A test is steady when every run's peak lies within max(2 MiB, 10%) of its median, and
its retained figure within max(1 MiB, 10%) of its own.

The session start is a session of one trivial test in a module that imports Keras, timed from
the process's start to its end, with the warm-up and without (median of three each); beside it,
``import keras`` in a fresh interpreter on that backend (median of three).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import machine
from benchmarks.tables import markdown_table
from pytest_tfmem.units import format_size

MIB = 2**20
WORKLOAD = Path(__file__).resolve().parent / "workloads" / "small_keras.py"
KERAS_SPEC = importlib.util.find_spec("keras")  # where the installed Keras's own tests lie (not imported)
KERAS_TESTS = Path(KERAS_SPEC.origin if KERAS_SPEC and KERAS_SPEC.origin else ".").resolve().parent / "src"
KERAS_OWN = ("layers/core/dense_test.py", "layers/core/embedding_test.py", "models/sequential_test.py",
             "models/functional_test.py", "callbacks/early_stopping_test.py")
SUITES = {  # name: (Keras backend, what it runs, for people)
    "tensorflow": ("tensorflow", "small Keras tests on TensorFlow (9)"),
    "jax": ("jax", "small Keras tests on JAX (8)"),
    "torch": ("torch", "small Keras tests on PyTorch (8)"),
    "keras-own": ("tensorflow", "Keras's own tests on TensorFlow (5 modules)"),
}
# The installed plugins load as in a user's session (pytest-randomly and pytest-xdist among them: the
# bench extra has them); the cache would remember the last failures.
PLUGINS = ("-p", "no:cacheprovider")
ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
WITH, WITHOUT = "--tfmem-first-use-warmup=true", "--no-tfmem-first-use-warmup"
PEAK_FLOOR, RETAINED_FLOOR, SHARE = 2 * MIB, MIB, 0.10


@dataclass
class Figures:
    """Each test's peaks and retained figures over the runs of one suite and variant."""

    peaks: dict[str, list[int]] = field(default_factory=dict)
    retained: dict[str, list[int]] = field(default_factory=dict)
    runs: int = 0

    def add(self, report: Path) -> None:
        self.runs += 1
        for test in json.loads(report.read_text())["tests"]:
            if test.get("measurement") is None:
                continue
            self.peaks.setdefault(test["nodeid"], []).append(test["measurement"]["peak"])
            if test.get("retained") is not None:
                self.retained.setdefault(test["nodeid"], []).append(test["retained"]["bytes"])


def steady(values: Sequence[int], floor: int) -> bool:
    middle = statistics.median(values)
    return all(abs(value - middle) <= max(floor, SHARE * abs(middle)) for value in values)


def spread_cells(figures: dict[str, list[int]], runs: int, floor: int) -> tuple[str, str]:
    """``17 of 18 (94%)`` and the widest test's range."""
    complete = {nodeid: values for nodeid, values in figures.items() if len(values) == runs}
    if not complete:
        return "-", "-"
    held = sum(steady(values, floor) for values in complete.values())
    widest = max(complete, key=lambda nodeid: max(complete[nodeid]) - min(complete[nodeid]))
    values = complete[widest]
    name = widest.rsplit("::", 1)[-1]
    share = f"{held} of {len(complete)} ({100 * held / len(complete):.0f}%)"
    return share, f"`{name}` {format_size(min(values))} - {format_size(max(values))}"


def run_pytest(arguments: Sequence[str], directory: Path, backend: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **ENVIRONMENT, "KERAS_BACKEND": backend}
    return subprocess.run([sys.executable, "-m", "pytest", *PLUGINS, *arguments], cwd=directory, env=environment,
                          capture_output=True, text=True, timeout=1800)


def measure_suite(suite: str, orders: int, warm: bool, directory: Path) -> Figures:
    backend, _ = SUITES[suite]
    targets = [str(KERAS_TESTS / path) for path in KERAS_OWN] if suite == "keras-own" else [WORKLOAD.name]
    figures = Figures()
    for seed in range(1, orders + 2):
        report = directory / f"{suite}-{warm}-{seed}.json"
        arguments = [*targets, f"--randomly-seed={seed}", "--tfmem-budget=64GB", f"--tfmem-report={report}", "-q"]
        if seed == orders + 1:
            arguments += ["-n", "2"]
        arguments.append(WITH if warm else WITHOUT)
        done = run_pytest(arguments, directory, backend)
        if not report.exists():
            raise RuntimeError(f"{suite} (seed {seed}) wrote no report:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        figures.add(report)
    return figures


def session_start(backend: str, directory: Path, repeat: int = 3) -> tuple[float, float, float]:
    """Medians: ``import keras`` in a fresh interpreter, and a one-test session without and with the warm-up."""
    module = directory / "test_start.py"
    module.write_text("import keras\n\n\ndef test_nothing():\n    pass\n")
    imports, without, with_warmup = [], [], []
    timer = "import time; started = time.perf_counter(); import keras; print(time.perf_counter() - started)"
    environment = {**os.environ, **ENVIRONMENT, "KERAS_BACKEND": backend}
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", timer], capture_output=True, text=True, env=environment,
                              check=True)
        imports.append(float(done.stdout.strip().splitlines()[-1]))
        for sessions, extra in ((without, [WITHOUT]), (with_warmup, [WITH])):
            started = time.perf_counter()
            run_pytest([module.name, "-p", "no:randomly", "--tfmem-budget=64GB", "-q", *extra], directory, backend)
            sessions.append(time.perf_counter() - started)
    module.unlink()
    return statistics.median(imports), statistics.median(without), statistics.median(with_warmup)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=5, help="random orders per suite (one -n 2 run more)")
    parser.add_argument("--suites", default=",".join(SUITES), help=f"of {', '.join(SUITES)}")
    parser.add_argument("--output", type=Path, help="write the tables between this script's markers in the page")
    args = parser.parse_args(argv)
    suites = [name.strip() for name in args.suites.split(",") if name.strip()]
    unknown = [name for name in suites if name not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}: expected some of {', '.join(SUITES)}")
    started = time.perf_counter()
    spreads, starts = [], []
    with tempfile.TemporaryDirectory(prefix="tfmem-order-") as scratch:
        directory = Path(scratch)
        shutil.copy(WORKLOAD, directory / WORKLOAD.name)
        (directory / "pytest.ini").write_text("[pytest]\n")
        for suite in suites:
            for warm in (False, True):
                figures = measure_suite(suite, args.orders, warm, directory)
                peaks = spread_cells(figures.peaks, figures.runs, PEAK_FLOOR)
                retained = spread_cells(figures.retained, figures.runs, RETAINED_FLOOR)
                row = [SUITES[suite][1], "on" if warm else "off", *peaks, *retained]
                spreads.append(row)
                print(" | ".join(row), flush=True)
        for backend in dict.fromkeys(SUITES[suite][0] for suite in suites):
            imported, without, with_warmup = session_start(backend, directory)
            added = with_warmup - without
            row = [backend, f"{imported:.2f} s", f"{without:.2f} s", f"{with_warmup:.2f} s", f"{added:+.2f} s",
                   f"{added / imported:.2f}"]
            starts.append(row)
            print(" | ".join(row), flush=True)
    minutes = (time.perf_counter() - started) / 60
    lines = [
        machine.written_by("-m benchmarks.order_spread", argv) + f"; took {minutes:.1f} min.",
        f"Machine: {machine.description()}. Versions: {machine.versions()}.",
        "",
        f"Each suite ran in {args.orders} random orders (pytest-randomly) and once more under `-n 2`, with the "
        "first-use warm-up (`on`: `--tfmem-first-use-warmup=true`) and without it (`off`, the default). A test is "
        "steady where every run's figure lies within max(2 MiB, 10%) of its median (peak), max(1 MiB, 10%) "
        "(retained).",
        "",
        *markdown_table(["suite", "warm-up", "steady peak", "widest peak", "steady retained", "widest retained"],
                        spreads),
        "",
        "What the warm-up adds to a session's start (one trivial test in a module that imports Keras; medians "
        "of three), against `import keras` on that backend in a fresh interpreter:",
        "",
        *markdown_table(["backend", "import keras", "session without", "session with", "added", "added / import"],
                        starts),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.output is not None:
        machine.write_section(args.output, "benchmarks/order_spread.py", text, "Order spread")
    return 0


if __name__ == "__main__":
    sys.exit(main())
