"""What measuring every test costs a real TensorFlow suite: with and without pytest-tfmem, in one run.

    python benchmarks/suite_overhead.py                  # about 9 minutes on 2 cores
    python benchmarks/suite_overhead.py --repeat 1 --keras-tests 10 --trivial-tests 100

Generated suites, each run as a whole pytest session in a fresh process, without the plugin
(``-p no:tfmem``) and with ``--tfmem-budget=4GB`` (every test measured) **at the same time, on
the same core** (both pinned to it; TensorFlow's and OpenMP's thread pools set to one thread).
The two sessions take turns on the core every few milliseconds, so whatever slows the core (a
busy neighbour on a shared host, interrupts) slows both alike: the ratio of their CPU times is
what tfmem adds. Run one after the other, the same session's CPU time varied by 10-30% on this
machine; on two cores at once, pair ratios still ranged over +-5%; on one core, two sessions
without tfmem read within 0.2% of each other. As many pairs run at once as there are cores, one
pair per core. The ratios are the medians of each pair's ratio:

- ``keras``: small Keras ``fit`` tests (about 1 s each here), half plain functions, half methods
  of a ``tf.test.TestCase`` class;
- ``keras-steps``: as many shorter Keras tests (about 0.3 s each here), eight eager training
  steps (``tf.GradientTape``, ``optimizer.apply``) of the same model, functions and methods;
- ``trivial-tf``: tests that do nothing, in a module that imports TensorFlow and Keras: the
  fixed cost per measured test, with the most objects for the garbage collector to see;
- ``processes``: tests that start processes (no TensorFlow): half run a Python script that holds
  50 MiB and counts to two million, half map four tasks over a fork ``Pool(2)``: what reading the
  processes a test starts costs (their CPU time counts, ``os.wait4`` gathers it);
- ``session-start``: one trivial test in a TensorFlow module: what the plugin costs a session
  once (its import, its start, its summary). "Net per test" is a suite's extra per test less
  this, spread over its tests: what each test costs once the session runs;
- ``drift``: trivial tests in a TensorFlow module where each test drops the 1 MiB cyclic object
  the test before it made, and makes its own: garbage that only a full collection finds. The
  RSS every 20 tests, from test 20 to the last, shows whether such memory is reclaimed.

CPU time is the process's user + system time (``os.wait4``); the tests are single-threaded,
so alone on a core a session's wall time is about its CPU time (sharing a core, it is about
twice that, and not reported). GC is the CPU time spent collecting
garbage, Python's own collections and tfmem's (``benchmarks/gc_clock.py``, loaded on both sides):
tfmem's collections before each test stand in for much of what Python would collect anyway.
"Extra per test" is the median of the pairs' differences divided by the tests.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``pytest_tfmem`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import machine, pinned
from pytest_tfmem.files import write_text_atomic

# TensorFlow's pooling CPU allocator (oneDNN) is its default on some x86 CPUs and not on others
# (AMD EPYC): on, every machine measures the same TensorFlow, with the pool that hides memory.
# Each session on one core: TensorFlow's and OpenMP's thread pools of one thread. The sessions'
# environment only (``session_environment``): a module that imports this one keeps its own.
SESSION_SETTINGS = {"TF_ENABLE_ONEDNN_OPTS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
                    "OMP_NUM_THREADS": "1"}  # fmt: skip

KERAS_MODULE = '''
import numpy as np
import pytest
import tensorflow as tf
import keras

X = np.random.default_rng(0).random((512, 16), dtype=np.float32)
Y = X.sum(axis=1, keepdims=True)
{prelude}

def small_model():
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])


def fit_small_model():
    model = small_model()
    model.compile("adam", "mse")
    model.fit(X, Y, epochs=2, batch_size=64, verbose=0)
    return model


def train_eight_steps():
    model = small_model()
    optimizer = keras.optimizers.Adam()
    for step in range(8):
        batch = slice(step * 64, (step + 1) * 64)
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((model(X[batch]) - Y[batch]) ** 2)
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return model


@pytest.mark.parametrize("seed", range({functions}))
def test_{kind}_function(seed):
    assert {train}().count_params() == 577


class {kind_class}Test(tf.test.TestCase):
{methods}
'''

METHOD = '''
    def test_{kind}_method_{index}(self):
        self.assertEqual({train}().count_params(), 577)
'''

# A tensor made and dropped on import: TensorFlow's pool keeps 64 MiB free for the tests, so each
# starts with room to hide tensors from RSS, and tfmem samples host and TF memory together.
POOLED = "tf.ones((16 * 2**20,)).numpy()  # 64 MiB, dropped at once\n"

# The Keras suites: (name in the tests, what each test runs, code run on import).
KERAS_KINDS = {
    "keras": ("fit", "fit_small_model", ""),
    "keras-steps": ("steps", "train_eight_steps", ""),
    "keras-steps-pooled": ("pooled", "train_eight_steps", POOLED),
}

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


PROCESSES_MODULE = '''
import multiprocessing
import subprocess
import sys

import pytest

SCRIPT = (
    "block = bytearray(50 * 2**20)\\n"
    "for i in range(0, len(block), 4096): block[i] = 1\\n"
    "sum(range(2_000_000))\\n"
)


def work(size):
    block = bytearray(size * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return sum(range(1_000_000))


@pytest.mark.parametrize("index", range({scripts}))
def test_runs_a_script(index):
    subprocess.run([sys.executable, "-c", SCRIPT], check=True)


@pytest.mark.parametrize("index", range({pools}))
def test_maps_over_a_pool(index):
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(work, [30, 30, 30, 30])
'''


REPOSITORY = Path(__file__).resolve().parent.parent
SUITES = [*KERAS_KINDS, "trivial-tf", "drift", "processes", "session-start"]


@dataclass(frozen=True)
class Run:
    cpu_s: float
    gc_s: float  # CPU time in garbage collection, Python's own and tfmem's (``gc_clock``)
    drift: dict[int, float]
    peak_bytes: int  # the session's largest resident size (``os.wait4``'s ``ru_maxrss``)
    loop_s: float  # CPU time of the test loop after the first test (``gc_clock``)
    loop_tests: int  # the tests in that loop: all but the first
    loop_gc_s: float  # CPU time in garbage collection in that loop


def write_suites(root: Path, keras_tests: int, trivial_tests: int, names: list[str] | None = None) -> dict[str, Path]:
    suites = {"keras": root / "keras", "keras-steps": root / "steps", "keras-steps-pooled": root / "pooled",
              "trivial-tf": root / "trivial", "drift": root / "drift", "processes": root / "processes",
              "session-start": root / "start"}
    suites = {name: path for name, path in suites.items() if names is None or name in names}
    for path in suites.values():
        path.mkdir(parents=True)
        (path / "pytest.ini").write_text("[pytest]\n")
    functions = keras_tests // 2
    for suite, (kind, train, prelude) in KERAS_KINDS.items():
        if suite not in suites:
            continue
        methods = "".join(METHOD.format(kind=kind, train=train, index=i) for i in range(keras_tests - functions))
        module = KERAS_MODULE.format(kind=kind, kind_class=kind.capitalize(), train=train, functions=functions,
                                     methods=methods, prelude=prelude)
        (suites[suite] / f"test_{kind}.py").write_text(module)
    modules = {
        "trivial-tf": ("test_trivial.py", TRIVIAL_MODULE.format(count=trivial_tests)),
        "session-start": ("test_trivial.py", TRIVIAL_MODULE.format(count=1)),
        "drift": ("test_drift.py", DRIFT_MODULE.format(count=trivial_tests)),
        "processes": ("test_processes.py", PROCESSES_MODULE.format(scripts=functions, pools=keras_tests - functions)),
    }
    for suite, (name, module) in modules.items():
        if suite in suites:
            (suites[suite] / name).write_text(module)
    return suites


@dataclass
class Started:
    """A session running in the background: its process, the core it runs on, its files."""

    suite: Path
    with_plugin: bool
    core: int
    process: subprocess.Popen[bytes]


def session_command(with_plugin: bool) -> list[str]:
    plugin_args = ["--tfmem-budget=4GB"] if with_plugin else ["-p", "no:tfmem"]
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
            "-p", "benchmarks.gc_clock", *plugin_args]


def session_environment(suite: Path) -> dict[str, str]:
    """The sessions' environment. Compiled modules are read from and written to ``__pycache__``, as
    on a user's machine: with ``PYTHONDONTWRITEBYTECODE`` set, each session would compile the
    plugin's modules again (about 0.4 s here), a cost of the environment, not of measuring a test.
    (A cache of its own, ``PYTHONPYCACHEPREFIX``, would compile TensorFlow, Keras and every module
    they import again in the first session: 12 s of CPU here.)"""
    python_path = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
    environment = {**SESSION_SETTINGS, **os.environ, "DRIFT_FILE": str(suite / "drift.txt"),
                   "GC_CLOCK_FILE": str(suite / "gc.txt"), "PYTHONPATH": python_path, "TF_CPP_MIN_LOG_LEVEL": "3"}
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    return environment


def warm_up(root: Path) -> None:
    """One session of a one-test TensorFlow suite with the plugin, unmeasured: every module the
    measured sessions import (those without the plugin import fewer) is compiled and cached, and
    its files read, before they run."""
    suite = root / "warm-up"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "test_warm_up.py").write_text(TRIVIAL_MODULE.format(count=1) + PROCESSES_MODULE.format(scripts=1, pools=1))
    subprocess.run(session_command(with_plugin=True), cwd=suite, env=session_environment(suite),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def start_session(suite: Path, with_plugin: bool, core: int) -> Started:
    for name in ("drift.txt", "gc.txt"):
        (suite / name).unlink(missing_ok=True)
    with open(suite / "output.txt", "wb") as output:
        process = pinned.popen(session_command(with_plugin), core, cwd=suite, env=session_environment(suite),
                               stdout=output, stderr=subprocess.STDOUT)
    return Started(suite, with_plugin, core, process)


def finished_run(session: Started, ended: pinned.Ended) -> Run:
    """A session's CPU time (its own and its children's), largest size, GC time, test loop's CPU
    time and drift readings."""
    session.process.returncode = ended.exit_code
    if session.process.returncode != 0:
        how = "with" if session.with_plugin else "without"
        output = (session.suite / "output.txt").read_text()
        raise RuntimeError(f"{session.suite.name} ({how} tfmem) failed:\n{output[-3000:]}")
    drift = {}
    if (session.suite / "drift.txt").exists():
        for line in (session.suite / "drift.txt").read_text().splitlines():
            index, mib = line.split()
            drift[int(index)] = float(mib)
    gc_s, loop_s, loop_tests, loop_gc_s = (session.suite / "gc.txt").read_text().split()
    return Run(ended.cpu_s, float(gc_s), drift, ended.peak_bytes, float(loop_s), int(loop_tests), float(loop_gc_s))


def run_pairs(
    jobs: list[str], suites: dict[int, dict[bool, dict[str, Path]]]
) -> dict[str, list[dict[bool, Run]]]:
    """Run each job (a suite's name) as a pair, without and with tfmem, on one core; as many
    pairs at once as there are cores. ``suites``: each core's copies of the suites, by side."""
    pending, free = list(jobs), sorted(suites)
    sessions: dict[int, Started] = {}  # by pid
    on_core: dict[int, tuple[str, dict[bool, Run]]] = {}  # the pair each busy core runs, its runs so far
    pairs: dict[str, list[dict[bool, Run]]] = {}
    while pending or sessions:
        while pending and free:
            core, name = free.pop(0), pending.pop(0)
            print(f"[{len(jobs) - len(pending)}/{len(jobs)}] {name}, without and with tfmem on core {core}",
                  file=sys.stderr, flush=True)
            on_core[core] = (name, {})
            for with_plugin in (False, True):
                session = start_session(suites[core][with_plugin][name], with_plugin, core)
                sessions[session.process.pid] = session
        ended = pinned.wait_any()
        session = sessions.pop(ended.pid)
        name, runs = on_core[session.core]
        runs[session.with_plugin] = finished_run(session, ended)
        if len(runs) == 2:
            pairs.setdefault(name, []).append(runs)
            del on_core[session.core]
            free.append(session.core)
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="pairs of sessions per suite (default 5)")
    parser.add_argument("--keras-tests", type=int, default=40,
                        help="tests in each Keras suite (default 40)")
    parser.add_argument("--trivial-tests", type=int, default=300, help="tests in the trivial suites (default 300)")
    parser.add_argument("--suites", help=f"comma-separated suites to run (default all: {', '.join(SUITES)})")
    parser.add_argument(
        "--output", help="also write the table, with the command and the machine, to this Markdown file"
    )
    args = parser.parse_args(argv)
    chosen = args.suites.split(",") if args.suites else None
    if chosen is not None and not set(chosen) <= set(SUITES):
        parser.error(f"--suites: unknown {sorted(set(chosen) - set(SUITES))}; known: {', '.join(SUITES)}")
    cores = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="tfmem-suite-overhead-") as temporary:
        suites = {
            core: {
                side: write_suites(Path(temporary) / f"core{core}-{name}", args.keras_tests, args.trivial_tests, chosen)
                for side, name in ((False, "without"), (True, "with"))
            }
            for core in cores
        }
        names = list(suites[cores[0]][False])
        warm_up(Path(temporary))
        pairs = run_pairs([name for _ in range(args.repeat) for name in names], suites)
        if args.output:
            from benchmarks.per_test_profile import profile_table

            profiled = profile_table(args.trivial_tests, 12, warmed_up=True)
    tests = {**dict.fromkeys(KERAS_KINDS, args.keras_tests), "trivial-tf": args.trivial_tests,
             "drift": args.trivial_tests, "processes": args.keras_tests, "session-start": 1}
    rows = []
    for name in names:
        runs = pairs[name]
        row: dict = {"suite": name, "tests": tests[name]}
        for key in ("cpu_s", "gc_s"):
            plain = statistics.median(getattr(pair[False], key) for pair in runs)
            measured = statistics.median(getattr(pair[True], key) for pair in runs)
            ratio = statistics.median(getattr(pair[True], key) / getattr(pair[False], key) for pair in runs)
            extra = statistics.median(getattr(pair[True], key) - getattr(pair[False], key) for pair in runs)
            row[key] = (plain, measured, ratio, extra / tests[name] * 1000)
        row["cpu_ratios"] = sorted(pair[True].cpu_s / pair[False].cpu_s for pair in runs)
        if name == "drift":
            last = args.trivial_tests - 1
            row["rss_mib"] = {
                side: {
                    "end": statistics.median(pair[plugged].drift[last] - pair[plugged].drift[20] for pair in runs),
                    "highest": statistics.median(
                        max(mib for i, mib in pair[plugged].drift.items() if i >= 20) - pair[plugged].drift[20]
                        for pair in runs
                    ),
                }
                for side, plugged in (("without", False), ("with", True))
            }
        rows.append(row)
    start = next((row for row in rows if row["suite"] == "session-start"), None)
    for row in rows:  # what each test costs once the session has started: less the one-test session's extra
        if start is not None and row is not start:
            row["net_ms"] = row["cpu_s"][3] - start["cpu_s"][3] / row["tests"]
    table = render(rows)
    print(table)
    if args.output:
        heading = (
            f"# What measuring every test costs\n\n{machine.written_by('benchmarks/suite_overhead.py', argv)}; "
            "each suite run without and with tfmem at the same time on one core, medians over the pairs (of the times, "
            "of each pair's ratio and of each pair's difference). See the module docstring of "
            "`benchmarks/suite_overhead.py`.\n\n"
        )
        profile = (
            f"\n\n## Where a test's time goes\n\nThe test loop of one session of {args.trivial_tests} trivial tests "
            "under `cProfile`, "
            "by module of pytest-tfmem: its own functions, and the calls they make outside it (`/proc` reads, `gc`, "
            "`json`). The profiler slows Python code more than system calls: read the shares. See "
            "`benchmarks/per_test_profile.py`.\n\n" + profiled + PER_TEST_WORK
        )
        scale = machine.section_of(Path(args.output), "suite_scale.py")  # written by benchmarks/suite_scale.py
        write_text_atomic(args.output, heading + table + profile + "\n" + (f"\n{scale}\n" if scale else ""))
    return 0


PER_TEST_WORK = """

What a measured test pays for, in the order it happens: at the boundary before it, nothing (the
reading after the test before is reused); as its window opens, a collection of the objects made
since the last one (`probes/garbage.py`: the survivors are frozen, so older objects are not
traversed again), freed heap handed back to the OS (`malloc_trim`, the largest single cost in
`probes/host.py`), the kernel's peak reset and each view's starting level; as it closes, each
view's peak, its record built, checked and published as JSON on the report (`core/record.py`),
and the journal's lines; after its teardown, another young collection and hand-back and one
reading of the process, which weighs what it kept and is the next test's boundary. `/proc/self`'s
`statm` and `status` stay open and are read with `pread`; a test that cannot have subtests
reads nothing for them. In a TensorFlow suite each test also reads the allocator's statistics;
where TensorFlow's pool has room to hide a test's tensors from RSS, a thread samples host and pool
memory together while the test runs (`probes/mixed.py`): `keras-steps-pooled` pays for it."""


def render(rows: list[dict]) -> str:
    lines = [
        "| suite | tests | CPU without | CPU with | ratio | extra per test | net per test | GC without | GC with |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        cpu, collecting = row["cpu_s"], row["gc_s"]
        net = f"{row['net_ms']:+.1f} ms" if "net_ms" in row else "-"
        lines.append(
            f"| {row['suite']} | {row['tests']} "
            f"| {cpu[0]:.2f} s | {cpu[1]:.2f} s | x{cpu[2]:.3f} | {cpu[3]:+.1f} ms | {net} "
            f"| {collecting[0]:.2f} s | {collecting[1]:.2f} s |"
        )
    lines.append("")
    lines.append("Each pair's CPU ratio, lowest to highest: " + "; ".join(
        f"{row['suite']} " + ", ".join(f"x{ratio:.3f}" for ratio in row["cpu_ratios"]) for row in rows
    ))
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
