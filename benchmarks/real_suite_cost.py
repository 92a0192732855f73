"""What measuring every test costs a real suite, side by side in one run: plain, measured, gated.

    python -m benchmarks.real_suite_cost [--suite keras-layers|keras-text|keras-own|tf-keras|small-keras]
                                         [--sides plain,tfmem] [--rounds 2] [--same-core] [--tf-keras PATH]
                                         [--output PAGE]

Suites:

- ``keras-layers``: Keras's own tests from the installed Keras (its wheel ships them) of its
  convolutional, RNN, attention and normalization layers, on TensorFlow: a real suite whose
  process grows past 1 GiB (traced functions, kernels, Keras's caches);
- ``keras-text``: Keras's own tests of its text and transformer parts, from the installed Keras:
  index, integer and hashing lookups, hashed crossing, einsum-dense, reversible embedding,
  multi-head and grouped-query attention (342 tests, a process of about 1 GiB; the text
  vectorization and string lookup tests need ``grain`` and are left out);
- ``keras-own``: the five modules of Keras's own tests the order benchmarks use
  (``benchmarks.order_spread``: dense, embedding, sequential, functional, early stopping);
- ``tf-keras``: tf-keras's own attention and layer-normalization tests from a checkout
  (``--tf-keras PATH``; read as ``benchmarks.verdicts`` reads them);
- ``small-keras``: small Keras tests on TensorFlow (``benchmarks/workloads/small_keras.py`` twice,
  18 tests), a session of a few seconds, where what a session's start costs shows most.

Sides, each the whole suite as one session in a fresh process, in file order (pytest-randomly
off), one at a time, their order rotated from round to round; with ``--same-core``, a round's
sides at once, all pinned to one core, and a round on each core at once: the sessions take turns
on their core, so whatever slows it (a busy neighbour on a shared host) slows each side alike, as
``benchmarks/suite_overhead.py`` pairs its sessions. One after the other, the same plain session
of ``keras-layers`` took 82.7 to 104.1 s of CPU time here. Pinned, a session's wall time is about
the sum of its core's sessions' and each test's time grows with it: the CPU ratios are the figures
to read there.

- ``plain``: without pytest-tfmem (``-p no:tfmem``);
- ``tfmem``: ``--tfmem-budget=64GB``, every test measured;
- ``tfmem-warm``: the same with the first-use warm-up (``--tfmem-first-use-warmup=true``; off by default);
- ``gates``: the budget with the memory history and its gate (``--tfmem-history-gate=25%``), as a
  pull request runs them; the history holds one earlier commit of the suite (a session before the
  rounds, not timed), and the tests its verdicts re-ran (``core.confirm``) are counted.

A plugin of this benchmark (``benchmarks.process_size``'s) times each test's whole protocol
(setup, call, teardown) and reads the process's RSS at the last test. Printed for each side: the
sessions' wall times and their median against the first side's (each round's ratio, then the
median); the same ratios of the sessions' CPU time (user and system, the session's process and
its children), which other work on a shared machine moves far less than wall time; the median
test's time; what a test costs beyond the first side (the median of the
tests' differences, the first two tests of a session left out: they pay its start); and the
first test's difference alone (the session's start: the runtime start, the first-use warm-up).
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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from benchmarks import machine, pinned
from benchmarks.flat_history import GATE, commit, git
from benchmarks.order_spread import KERAS_OWN, KERAS_TESTS
from benchmarks.process_size import TIMING, WORKLOAD
from benchmarks.tables import markdown_table
from benchmarks.verdicts import reruns, suites

GIB = 2**30
KERAS_LAYERS = ("layers/convolutional", "layers/rnn", "layers/attention", "layers/normalization")
KERAS_TEXT = tuple(f"layers/{module}_test.py" for module in (
    "preprocessing/index_lookup", "preprocessing/integer_lookup", "preprocessing/hashing",
    "preprocessing/hashed_crossing", "core/einsum_dense", "core/reversible_embedding",
    "attention/multi_head_attention", "attention/grouped_query_attention"))
SUITES = {"keras-layers": "Keras's own convolutional, RNN, attention and normalization layer tests",
          "keras-text": "Keras's own text and transformer-part tests (lookups, hashing, einsum-dense, "
                        "reversible embedding, multi-head and grouped-query attention)",
          "keras-own": "Keras's own tests of five modules (dense, embedding, sequential, functional, early stopping)",
          "tf-keras": "tf-keras's own attention and layer-normalization tests",
          "small-keras": "small Keras tests on TensorFlow (small_keras.py twice: 18)"}
BUDGET = ("--tfmem-budget=64GB",)
SIDES = {
    "plain": ("-p", "no:tfmem"),
    "tfmem": BUDGET,
    "tfmem-warm": (*BUDGET, "--tfmem-first-use-warmup=true"),
    "gates": (*BUDGET, "--tfmem-history=history.jsonl", f"--tfmem-history-gate={GATE}", "--tfmem-report=report.json"),
}
ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore", "KERAS_BACKEND": "tensorflow"}
STARTING_TESTS = 2  # the first tests of a session pay its start (imports, the runtime, the warm-up)


def prepare(directory: Path, suite: str, tf_keras: Path | None) -> list[str]:
    """The folder the sessions run in, and what they run."""
    (directory / "pytest.ini").write_text("[pytest]\n")
    (directory / "bench_timing.py").write_text(TIMING)
    keras_modules = {"keras-layers": KERAS_LAYERS, "keras-text": KERAS_TEXT, "keras-own": KERAS_OWN}
    if suite in keras_modules:
        return [str(KERAS_TESTS / module) for module in keras_modules[suite]]
    if suite == "tf-keras":
        copied = suites(tf_keras)["tf-keras"]
        for source, name in copied.copies.items():
            text = source.read_text()
            for old, new in copied.rewrite:
                text = text.replace(old, new)
            (directory / name).write_text(text)
        return list(copied.copies.values())
    for copy in ("a", "b"):
        shutil.copy(WORKLOAD, directory / f"test_small_keras_{copy}.py")
    return ["test_small_keras_a.py", "test_small_keras_b.py"]


class Session(NamedTuple):
    wall: float  # seconds
    cpu: float  # seconds of user and system time, the session's process and its children (``pinned.wait_any``)
    timed: dict  # the plugin's per-test times and last RSS


class Slot(NamedTuple):
    """Where a session runs: its folder (one per side and core: sessions at once write their own
    files there) and the core it is pinned to (None: any)."""

    directory: Path
    core: int | None


def sessions(slots: Sequence[Slot], targets: Sequence[str], options: Sequence[Sequence[str]]) -> list[Session]:
    """Whole sessions started at once, each in its slot with its options; their wall and CPU
    times, and the plugin's per-test times and last RSS."""
    started: dict[int, tuple[int, float]] = {}  # the index and start of each running session, by pid
    for index, (slot, chosen) in enumerate(zip(slots, options)):
        out = slot.directory / "times.json"
        out.unlink(missing_ok=True)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-p",
                   "bench_timing", *chosen, *targets]
        environment = {**os.environ, **ENVIRONMENT, "TFMEM_BENCH_TIMES": str(out), "PYTHONPATH": os.pathsep.join(
            filter(None, [str(slot.directory), os.environ.get("PYTHONPATH")]))}
        with open(slot.directory / "output.txt", "wb") as output:
            process = pinned.popen(command, slot.core, cwd=slot.directory, env=environment, stdout=output,
                                   stderr=subprocess.STDOUT)
        started[process.pid] = (index, time.perf_counter())
    done: dict[int, Session] = {}
    while started:
        ended = pinned.wait_any()
        if ended.pid not in started:
            continue
        index, began = started.pop(ended.pid)
        directory = slots[index].directory
        if not (directory / "times.json").exists():
            raise RuntimeError(f"the session wrote no times:\n{(directory / 'output.txt').read_text()[-3000:]}")
        done[index] = Session(time.perf_counter() - began, ended.cpu_s,
                              json.loads((directory / "times.json").read_text()))
    return [done[index] for index in range(len(slots))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:+.1f} ms"


def _ratios(ratios: Sequence[float]) -> str:
    """The median ratio, then each round's."""
    return f"x{statistics.median(ratios):.3f} ({', '.join(f'x{ratio:.3f}' for ratio in ratios)})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=SUITES, default="keras-layers", help="which suite (default keras-layers)")
    parser.add_argument("--sides", default="plain,tfmem",
                        help=f"the sessions compared, the first the reference ({', '.join(SIDES)}; "
                        "default plain,tfmem)")
    parser.add_argument("--rounds", type=int, default=2, help="sessions of each side, in turn (default 2)")
    parser.add_argument("--same-core", action="store_true",
                        help="run each round's sides at once, pinned to one core (a round on each core at once): "
                        "whatever slows the core slows every side alike")
    parser.add_argument("--tf-keras", type=Path, help="a checkout of tf-keras (the tf-keras suite's tests)")
    parser.add_argument("--output", type=Path, help="write the table between this script's markers in the page")
    args = parser.parse_args(argv)
    sides = args.sides.split(",")
    unknown = [side for side in sides if side not in SIDES]
    if unknown or len(sides) < 2:
        parser.error(f"--sides takes two or more of {', '.join(SIDES)} (got {args.sides!r})")
    if args.suite == "tf-keras" and args.tf_keras is None:
        parser.error("--suite tf-keras needs --tf-keras PATH, a checkout of keras-team/tf-keras")
    runs: dict[str, list[Session]] = {side: [] for side in sides}
    rerun_counts: list[int] = []
    cores: list[int | None] = list(sorted(os.sched_getaffinity(0))) if args.same_core else [None]
    with tempfile.TemporaryDirectory() as folder:
        slots = {(core, side): Slot(Path(folder) / f"{side}-on-{core}", core) for core in cores for side in sides}
        for slot in slots.values():
            slot.directory.mkdir()
        targets = [prepare(slot.directory, args.suite, args.tf_keras) for slot in slots.values()][0]
        for core in cores if "gates" in sides else []:  # the history holds an earlier commit for the gate
            directory = slots[core, "gates"].directory
            git(directory, "init", "-q")
            commit(directory, 0, 1)
            sessions([slots[core, "gates"]], targets, [SIDES["gates"]])
            commit(directory, 1, 1)
        for first in range(0, args.rounds, len(cores)):
            if args.same_core:  # each round's sides at once on one core, a round on each core at once
                groups = [[(core, side) for core in cores[: args.rounds - first] for side in sides]]
            else:  # one session at a time, the sides' order rotated from round to round
                turn = first % len(sides)
                groups = [[(None, side)] for side in sides[turn:] + sides[:turn]]
            for group in groups:
                finished = sessions([slots[key] for key in group], targets, [SIDES[side] for _, side in group])
                for (core, side), done in zip(group, finished):
                    runs[side].append(done)
                    if side == "gates":
                        rerun_counts.append(reruns(slots[core, side].directory / "report.json"))
                    where = "" if core is None else f" on core {core}"
                    print(f"round {len(runs[side])} {side}{where}: {done.wall:.1f} s, CPU {done.cpu:.1f} s",
                          file=sys.stderr, flush=True)
    reference = runs[sides[0]]
    rows = []
    for side in sides:
        ratios = [mine.wall / theirs.wall for mine, theirs in zip(runs[side], reference)]
        cpu_ratios = [mine.cpu / theirs.cpu for mine, theirs in zip(runs[side], reference)]
        costs, starts = [], []
        for mine, theirs in zip(runs[side], reference):
            paired = list(zip(theirs.timed["times"], mine.timed["times"]))
            costs.append(statistics.median(after - before for before, after in paired[STARTING_TESTS:]))
            starts.append(paired[0][1] - paired[0][0])
        median_test = statistics.median(statistics.median(done.timed["times"][STARTING_TESTS:]) for done in runs[side])
        rows.append([
            side, str(len(runs[side][0].timed["times"])),
            f"{statistics.median(done.timed['rss'] for done in runs[side]) / GIB:.2f} GiB",
            ", ".join(f"{done.wall:.1f} s" for done in runs[side]),
            _ratios(ratios),
            ", ".join(f"{done.cpu:.1f} s" for done in runs[side]),
            _ratios(cpu_ratios),
            f"{median_test * 1000:.1f} ms",
            "-" if side == sides[0] else ms(statistics.median(costs)),
            "-" if side == sides[0] else ms(statistics.median(starts)),
        ])
    header = ["side", "tests", "RSS at the last test", "sessions", f"vs {sides[0]} (each round)", "sessions' CPU",
              f"CPU vs {sides[0]} (each round)", "median test",
              f"a test's cost vs {sides[0]}", "first test's (the start)"]
    text = (f"{machine.written_by('-m benchmarks.real_suite_cost', argv)}. {SUITES[args.suite]}, "
            f"{args.rounds} rounds.\n\n" + "\n".join(markdown_table(header, rows)) + "\n")
    if rerun_counts:
        text += f"\nTests the gated sessions re-ran to confirm a verdict: {', '.join(map(str, rerun_counts))}.\n"
    print(text)
    if args.output is not None:
        script = f"benchmarks/real_suite_cost.py {args.suite} {args.sides}{' same-core' if args.same_core else ''}"
        machine.write_section(args.output, script, text, "What measuring costs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
