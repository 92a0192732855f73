"""Do tfmem's verdicts stand on suites it was not written for? With the confirming re-run and without.

    python -m benchmarks.verdicts [--commits 10] [--orders 5] [--suites keras-more,tf-keras,sklearn,xla,distribute]
                                  [--modes with,without] [--output docs/measurement.md] [--history-page docs/history.md]

Suites (none of them tuned for): Keras's own attention, multi-head attention, LSTM, GRU and
batch-normalization tests from the installed Keras, beyond the five modules the other benchmarks
use (``keras-more``); tf-keras's own attention and layer-normalization tests from its repository
(``tf-keras``: ``--tf-keras PATH``, a checkout; its ``from tf_keras.`` imports are read as the wheel's
``tf_keras.src``); scikit-learn's own PCA and k-means tests from the installed package
(``sklearn``); Keras's own trainer tests that compile with XLA (``jit_compile``, ``xla``), where cold
readings are largest (the first XLA compile of a session); Keras's own tests of TensorFlow's
distribution strategies (``MirroredStrategy`` over CPU devices, ``distribute``). Each suite runs in a
fresh git repository beside ``test_batch.py`` (one test holding
a 40 MiB batch), and each check runs twice, with tfmem's default (a verdict on a test's figures
stands only if a re-run in the same process reproduces it) and with ``--no-tfmem-confirm``:

- **history**: ``--commits`` commits of unchanged code, each measured once in its own random order
  (pytest-randomly, one seed a commit) with ``--tfmem-history`` and the gate the docs suggest
  (``--tfmem-history-gate=25%``): the gate's failures, and the tests ``tfmem history`` names (a
  step or creep) over those commits. Then the batch grows by half for two more commits: is it
  named at its commit, and does the gate fail it there?
- **budgets**: each test gets a budget of 1.5 times its smallest reading in the history above
  (with the re-run; at least that reading plus 2 MiB, the order benchmarks' floor), and the suite
  runs in ``--orders`` random orders: how many tests fail.
- **cost**: the first three commits are also measured with ``--tfmem-budget`` alone, in the same
  order, alternating with the history sessions: the sessions' times side by side, and how many
  re-runs each made.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import machine
from benchmarks.flat_history import BATCH, ENVIRONMENT, GATE, ROWS, commit, git
from benchmarks.tables import markdown_table

MIB = 2**20
WITHOUT = "--no-tfmem-confirm"
TIMED_COMMITS = 3  # the commits also measured with the budget alone, for the cost
BUDGET_SHARE, BUDGET_FLOOR = 1.5, 2 * MIB
BUDGETS_PLUGIN = '''import json
import pathlib

import pytest

BUDGETS = json.loads((pathlib.Path(__file__).parent / "budgets.json").read_text())


def pytest_collection_modifyitems(items):
    for item in items:
        if item.nodeid in BUDGETS:
            item.add_marker(pytest.mark.tfmem(budget=BUDGETS[item.nodeid]))
'''
MODES = {"with the re-run": (), "without (--no-tfmem-confirm)": (WITHOUT,)}
MODE_NAMES = {"with": "with the re-run", "without": "without (--no-tfmem-confirm)"}
DEFAULT_SUITES = "keras-more,tf-keras,sklearn,xla,distribute"


def _installed(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)  # found, not imported
    return Path(spec.origin).resolve().parent if spec is not None and spec.origin else None


@dataclass(frozen=True)
class Suite:
    """Test modules copied into the repository (``copies``: source -> name) or run where they lie
    (``in_place``), and for people what it is."""

    name: str
    about: str
    copies: dict[Path, str] = field(default_factory=dict)
    in_place: tuple[Path, ...] = ()
    rewrite: tuple[tuple[str, str], ...] = ()
    select: str = ""  # a ``-k`` expression: the tests of the modules that are the suite (test_batch.py too)

    def targets(self) -> list[str]:
        selected = ["-k", f"({self.select}) or test_batch"] if self.select else []
        return [*self.copies.values(), *(str(path) for path in self.in_place), "test_batch.py", *selected]


def suites(tf_keras: Path | None) -> dict[str, Suite]:
    keras = _installed("keras")
    sklearn = _installed("sklearn")
    found = {}
    if keras is not None:
        modules = ("layers/attention/attention_test.py", "layers/attention/multi_head_attention_test.py",
                   "layers/rnn/lstm_test.py", "layers/rnn/gru_test.py",
                   "layers/normalization/batch_normalization_test.py")
        found["keras-more"] = Suite(
            "keras-more", "Keras's own attention, multi-head attention, LSTM, GRU and batch-normalization tests",
            {keras / "src" / module: Path(module).name for module in modules})
    if tf_keras is not None:
        modules = ("layers/attention/attention_test.py", "layers/normalization/layer_normalization_test.py")
        found["tf-keras"] = Suite(
            "tf-keras", "tf-keras's own attention and layer-normalization tests",
            {tf_keras / "tf_keras" / module: f"tfk_{Path(module).name}" for module in modules},
            rewrite=(("from tf_keras.", "from tf_keras.src."), ("import tf_keras.", "import tf_keras.src.")))
    if sklearn is not None:
        modules = ("decomposition/tests/test_pca.py", "cluster/tests/test_k_means.py")
        found["sklearn"] = Suite("sklearn", "scikit-learn's own PCA and k-means tests",
                                 in_place=tuple(sklearn / module for module in modules))
    if keras is not None:
        found["xla"] = Suite("xla", "Keras's own trainer tests that compile with XLA (jit_compile)",
                             {keras / "src" / "trainers" / "trainer_test.py": "trainer_test.py"}, select="jit")
        modules = ("backend/tensorflow/distribute_test.py", "backend/tensorflow/optimizer_distribute_test.py")
        found["distribute"] = Suite(
            "distribute", "Keras's own tests of TensorFlow's distribution strategies (MirroredStrategy on CPUs)",
            {keras / "src" / module: Path(module).name for module in modules})
    return found


def pytest_run(directory: Path, suite: Suite, *arguments: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *suite.targets(), "-p", "no:cacheprovider", f"--rootdir={directory}",
         "-q", *arguments],
        cwd=directory, capture_output=True, text=True, env={**os.environ, **ENVIRONMENT}, timeout=1800,
    )
    return done, time.perf_counter() - started


def failures(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The tests that failed a tfmem check (``FAILED node - tfmem: ...``)."""
    return [line.split(" - ")[0].removeprefix("FAILED ") for line in done.stdout.splitlines()
            if line.startswith("FAILED ") and " - tfmem: " in line]


def reruns(report: Path) -> int:
    """How many tests of a session ran a second time to confirm a figure."""
    return sum(test.get("confirmation") is not None for test in json.loads(report.read_text())["tests"])


def named(history: Path) -> dict[str, list[str]]:
    """The tests ``tfmem history`` names, with what it says of each (``step ...``, ``since its best ...``)."""
    done = subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", "history", str(history)],
                          capture_output=True, text=True, check=True)
    found: dict[str, list[str]] = {}
    current = None
    for line in done.stdout.splitlines():
        if line.startswith("    ") and current is not None:
            found[current].append(line.strip())
        elif line.startswith("  ") and "::" in line:
            current = line.strip()
            found[current] = []
    return found


def read_peaks(history: Path, commits: int) -> dict[str, list[int]]:
    """Each test's peaks over the first ``commits`` lines of the history."""
    peaks: dict[str, list[int]] = {}
    for line in history.read_text().splitlines()[:commits]:
        for nodeid, samples in json.loads(line)["tests"].items():
            peaks.setdefault(nodeid, []).extend(int(sample[1]) for sample in samples)
    return peaks


@dataclass
class Outcome:
    """One suite in one mode."""

    flat_failures: list[list[str]] = field(default_factory=list)  # each unchanged commit's gate failures
    flat_named: dict[str, list[str]] = field(default_factory=dict)
    step_named: bool = False
    step_failed: bool = False
    budget_failures: list[list[str]] = field(default_factory=list)  # each order's
    timed: list[tuple[float, float, int]] = field(default_factory=list)  # (budget alone, gate and history, re-runs)
    tests: int = 0


def prepare(directory: Path, suite: Suite) -> None:
    for source, name in suite.copies.items():
        text = source.read_text()
        for old, new in suite.rewrite:
            text = text.replace(old, new)
        (directory / name).write_text(text)
    (directory / "pytest.ini").write_text("[pytest]\n")
    git(directory, "init", "-q")


def history_check(directory: Path, suite: Suite, mode: tuple[str, ...], commits: int, outcome: Outcome) -> Path:
    history = directory / "memory-history.jsonl"
    for number in range(1, commits + 3):
        rows = ROWS if number <= commits else ROWS * 3 // 2
        commit(directory, number, rows)
        report = directory / f"report-{number}.json"
        options = [f"--randomly-seed={number}", *mode]
        alone = None
        if number <= TIMED_COMMITS:
            alone = pytest_run(directory, suite, *options, "--tfmem-budget=64GB")[1]
        done, seconds = pytest_run(directory, suite, *options, f"--tfmem-history={history}",
                                   f"--tfmem-history-gate={GATE}", f"--tfmem-report={report}")
        if not report.exists():
            raise RuntimeError(f"{suite.name} commit {number} wrote no report:\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-3000:]}")
        failed = failures(done)
        if alone is not None:
            outcome.timed.append((alone, seconds, reruns(report)))
        if number <= commits:
            outcome.flat_failures.append(failed)
        elif number == commits + 1:
            outcome.step_failed = "test_batch.py::test_batch" in failed
        outcome.tests = len(json.loads(report.read_text())["tests"])
        print(f"{suite.name} {mode or 'default'} commit {number}: {len(failed)} failure(s) {failed[:3]}", flush=True)
    flat = directory / "flat.jsonl"
    flat.write_text("".join(history.read_text().splitlines(keepends=True)[:commits]))
    outcome.flat_named = named(flat)
    stepped = named(history).get("test_batch.py::test_batch", [])
    outcome.step_named = any(line.startswith("step +") for line in stepped)
    return history


def budget_check(directory: Path, suite: Suite, mode: tuple[str, ...], budgets: dict[str, int], orders: int,
                 outcome: Outcome) -> None:
    (directory / "test_batch.py").write_text(BATCH.format(rows=ROWS))  # the batch its warm figure is of
    (directory / "budgets.json").write_text(json.dumps(budgets))
    (directory / "conftest_budgets.py").write_text(BUDGETS_PLUGIN)
    for seed in range(101, 101 + orders):
        done, _ = pytest_run(directory, suite, f"--randomly-seed={seed}", "-p", "conftest_budgets", *mode)
        outcome.budget_failures.append(failures(done))
        print(f"{suite.name} {mode or 'default'} budgets, order {seed}: {failures(done)[:3]}", flush=True)


def warm_budgets(peaks: dict[str, list[int]]) -> dict[str, int]:
    """1.5 times each test's smallest reading, at least that reading plus the floor."""
    budgets = {}
    for nodeid, values in peaks.items():
        smallest = min(values)
        budgets[nodeid] = int(max(BUDGET_SHARE * smallest, smallest + BUDGET_FLOOR))
    return budgets


def measure(suite: Suite, commits: int, orders: int, modes: Sequence[str]) -> dict[str, Outcome]:
    outcomes = {name: Outcome() for name in modes}
    budgets: dict[str, int] = {}
    for name in modes:  # with the re-run first: its history gives the warm figures
        mode = MODES[name]
        with tempfile.TemporaryDirectory(prefix=f"tfmem-verdicts-{suite.name}-") as scratch:
            directory = Path(scratch)
            prepare(directory, suite)
            history = history_check(directory, suite, mode, commits, outcomes[name])
            if not budgets:
                budgets = warm_budgets(read_peaks(history, commits))
            budget_check(directory, suite, mode, budgets, orders, outcomes[name])
    return outcomes


def _count(lists: list[list[str]]) -> str:
    """``2 tests in 2 of 10 runs`` or ``none``."""
    runs = sum(bool(found) for found in lists)
    tests = len({test for found in lists for test in found})
    return "none" if not runs else f"{tests} test{'s' if tests != 1 else ''} in {runs} of {len(lists)} runs"


def rows(suite: Suite, outcomes: dict[str, Outcome]) -> list[list[str]]:
    found = []
    for name, outcome in outcomes.items():
        creeping = [test for test, said in outcome.flat_named.items() if test != "test_batch.py::test_batch" or said]
        alone = sum(t[0] for t in outcome.timed)
        gated = sum(t[1] for t in outcome.timed)
        found.append([
            f"{suite.name} ({outcome.tests} tests)", name, _count(outcome.flat_failures),
            str(len(creeping)) if creeping else "none",
            f"{'yes' if outcome.step_named else 'no'} / {'yes' if outcome.step_failed else 'no'}",
            _count(outcome.budget_failures),
            f"{alone:.0f} s / {gated:.0f} s (x{gated / alone:.2f})" if alone else "-",
            ", ".join(str(t[2]) for t in outcome.timed) or "-",
        ])
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=10, help="unchanged commits before the step (default 10)")
    parser.add_argument("--orders", type=int, default=5, help="random orders under the budgets (default 5)")
    parser.add_argument("--suites", default=DEFAULT_SUITES, help=f"which suites (default {DEFAULT_SUITES})")
    parser.add_argument("--modes", default="with,without",
                        help="with the re-run, without it (--no-tfmem-confirm), or both (default with,without)")
    parser.add_argument("--tf-keras", type=Path, help="a checkout of tf-keras (its own tests)")
    parser.add_argument("--output", type=Path, help="write the table between this script's markers in the page")
    parser.add_argument("--history-page", type=Path, help="write it into this page too")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    known = suites(args.tf_keras)
    chosen = [name for name in args.suites.split(",") if name]
    missing = [name for name in chosen if name not in known]
    if missing:
        parser.error(f"not available here: {', '.join(missing)} (tf-keras needs --tf-keras PATH, a checkout; "
                     "sklearn needs scikit-learn)")
    modes = [MODE_NAMES[mode] for mode in args.modes.split(",") if mode]
    table = []
    details = []
    for name in chosen:
        outcomes = measure(known[name], args.commits, args.orders, modes)
        table += rows(known[name], outcomes)
        for mode, outcome in outcomes.items():
            for test, said in outcome.flat_named.items():
                if test != "test_batch.py::test_batch" or said:
                    details.append(f"- {name}, {mode}: `{test}`: {'; '.join(said)}")
    minutes = (time.perf_counter() - started) / 60
    lines = [
        machine.written_by("-m benchmarks.verdicts", argv) + f"; took {minutes:.1f} min.",
        "",
        f"Each suite beside `test_batch.py` (a 40 MiB batch); {args.commits} unchanged commits, each in its own "
        f"random order with `--tfmem-history-gate={GATE}`, then the batch +50% at the next; per-test budgets "
        f"of {BUDGET_SHARE:g}x each test's smallest reading (at least +2 MiB) in {args.orders} other random orders; "
        f"the first {TIMED_COMMITS} commits also with `--tfmem-budget` alone, alternating.",
        "",
        *markdown_table(["suite", "verdicts", "gate failures, unchanged commits", "tests `tfmem history` names",
                         "+50% step named / failed at its commit", "budget failures",
                         "budget alone / gate and history", "re-runs a session"], table),
        "",
        *(["What `tfmem history` named over the unchanged commits:", "", *details, ""] if details else []),
        ]
    text = "\n".join(lines)
    print(text)
    # A run of other suites than the three (a check of one) has a section of its own.
    section = "benchmarks/verdicts.py" if args.suites == DEFAULT_SUITES else f"benchmarks/verdicts.py {args.suites}"
    if args.modes != "with,without":
        section += f" {args.modes}"
    for page in (args.output, args.history_page):
        if page is not None:
            machine.write_section(page, section, text, "Verdicts on suites tfmem was not written for")
    return 0


if __name__ == "__main__":
    sys.exit(main())
