"""The processes a test starts are part of its figure: subprocess, multiprocessing (fork, spawn,
forkserver), ProcessPoolExecutor, a shell script's children; each named, how each ended said.

One pytest run (in process, then isolated) serves the checks that read it: each of its tests
starts processes that hold known sizes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cgroup_helpers import memory_cgroup, oom_kills, run_pytest_in

from pytest_tfmem.core.summary import combined_basis
from pytest_tfmem.probes import children
from pytest_tfmem.probes.children import ChildFigure, ChildrenReading, _combined
from pytest_tfmem.probes.watchdog import ProcessMark

MiB = 2**20
REPOSITORY = Path(__file__).resolve().parent.parent

HOLD = 150  # MiB each child holds

SUITE = f'''
import concurrent.futures, multiprocessing, os, signal, subprocess, sys, time

HOLD = {HOLD}
SCRIPT = (
    "import sys, time\\n"
    "block = bytearray(int(sys.argv[1]) * 2**20)\\n"
    "for i in range(0, len(block), 4096): block[i] = 1\\n"
)


def hold(mib, seconds=0.3):
    block = bytearray(mib * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(seconds)
    return len(block)


def test_subprocess_script():
    subprocess.run([sys.executable, "-c", SCRIPT, str(HOLD)], check=True)


def test_fork_pool():
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(hold, [HOLD, HOLD])


def test_spawn_process():
    process = multiprocessing.get_context("spawn").Process(target=hold, args=(HOLD,))
    process.start()
    process.join()


def test_forkserver_process():
    process = multiprocessing.get_context("forkserver").Process(target=hold, args=(HOLD,))
    process.start()
    process.join()


def test_process_pool_executor():
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        list(pool.map(hold, [HOLD, HOLD]))


def test_shell_script():
    subprocess.run(["sh", "-c", f'"{{sys.executable}}" -c "$0" {{HOLD}}; true', SCRIPT + "time.sleep(0.3)\\n"], check=True)


def test_child_killed():
    child = subprocess.Popen([sys.executable, "-c", SCRIPT + "time.sleep(30)\\n", "40"])
    time.sleep(1.0)
    child.send_signal(signal.SIGKILL)
    child.wait()


def test_pool_left_running():
    global POOL
    POOL = multiprocessing.get_context("fork").Pool(1)
    POOL.apply(hold, (30, 0))


def test_starts_nothing():
    pass
'''


def _run(tmp: Path, *args: str) -> dict:
    (tmp / "test_kids.py").write_text(SUITE)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_kids.py", "--tfmem-budget=100MB",
               "--tfmem-report=report.json", "-rA", *args]
    result = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=300)
    assert (tmp / "report.json").exists(), result.stdout + result.stderr
    report = json.loads((tmp / "report.json").read_text())
    return {"stdout": result.stdout, "tests": {t["nodeid"].split("::")[1]: t for t in report["tests"]}}


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run(tmp_path_factory.mktemp("children"))


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _run(tmp_path_factory.mktemp("children-isolated"), "--tfmem-isolate")


def _children(entry: dict) -> ChildrenReading:
    return ChildrenReading.from_dict(entry["measurement"]["children"])


@pytest.mark.parametrize("run", ["in_process", "isolated"])
@pytest.mark.parametrize(
    ("test", "processes_at_least", "combined_mib"),
    [
        ("test_subprocess_script", 1, HOLD),
        ("test_fork_pool", 2, 2 * HOLD),
        ("test_spawn_process", 1, HOLD),
        ("test_forkserver_process", 1, HOLD),
        ("test_process_pool_executor", 2, 2 * HOLD),
        ("test_shell_script", 2, HOLD),
    ],
)
def test_what_a_test_starts_counts_in_its_peak_and_fails_its_budget(
    request: pytest.FixtureRequest, run: str, test: str, processes_at_least: int, combined_mib: int
):
    entry = request.getfixturevalue(run)["tests"][test]
    children = _children(entry)
    assert len(children.processes) >= processes_at_least
    # Each child holds HOLD MiB above what it inherited; a Python interpreter adds 10-30 MiB; a
    # forkserver's copy's inherited size is its size when first read, within milliseconds of its
    # start, when it may have grown a little.
    assert 0.97 * combined_mib * MiB <= children.combined <= (combined_mib + 2 * 40) * MiB
    assert entry["measurement"]["peak"] >= children.combined  # the tree's figure, this process's own added
    assert entry["outcome"] == "failed"
    budget = next(v for v in entry["verdicts"] if v["check"] == "budget")
    assert "it started" in budget["message"] and "the largest pid" in budget["message"]
    assert all(figure.command for figure in children.processes)


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_overlapping_children_are_an_upper_bound_with_the_sampled_sum_below(in_process: dict):
    children = _children(in_process["tests"]["test_fork_pool"])
    assert children.combined_basis == "marks summed"
    assert 2 * HOLD * MiB * 0.9 <= children.sampled_sum <= children.combined
    assert "an upper bound" in combined_basis(children) and "a lower bound" in combined_basis(children)
    one = _children(in_process["tests"]["test_subprocess_script"])
    assert one.combined_basis == "one at a time"
    [script] = one.processes
    assert script.exact and script.ended == "exited with 0" and "python" in script.command


def test_fork_copies_count_what_they_grew_not_what_they_share(in_process: dict):
    for figure in _children(in_process["tests"]["test_fork_pool"]).processes:
        assert figure.command.startswith("fork of ")
        # each told its size at the fork (children.ForkSizes): what it grew is read to the page,
        # with the pages of its parent's libraries it touches again (0.3 MiB usually, 4 MiB seen)
        assert HOLD * MiB <= figure.peak <= (HOLD + 8) * MiB


@pytest.mark.linux  # wait4's peak of the child it reaps
def test_a_child_killed_by_a_signal_is_named_though_the_test_passes(in_process: dict):
    entry = in_process["tests"]["test_child_killed"]
    assert entry["outcome"] == "passed"
    [child] = _children(entry).processes
    assert child.died and child.ended.startswith("killed by SIGKILL")
    assert child.last_rss >= 40 * MiB
    section = in_process["stdout"].split("test_child_killed ___")[1]
    assert f"pid {child.pid}" in section and "last read at" in section and "killed by SIGKILL" in section


def test_a_process_left_running_is_named(in_process: dict):
    [worker] = _children(in_process["tests"]["test_pool_left_running"]).processes
    assert worker.running and 0.9 * 30 * MiB <= worker.peak <= 40 * MiB


def test_a_test_that_starts_nothing_has_no_children_view(in_process: dict, isolated: dict):
    for run in (in_process, isolated):
        assert run["tests"]["test_starts_nothing"]["measurement"]["children"] is None
        assert run["tests"]["test_starts_nothing"]["outcome"] == "passed"


def test_the_table_has_a_children_column(in_process: dict):
    table = in_process["stdout"].split("peak memory need per test")[1]
    header = table.splitlines()[1]
    assert "children" in header.split()
    row = next(line for line in table.splitlines() if "test_starts_nothing" in line)
    assert " - " in row


EXITS_AT_ONCE = """
import subprocess, sys
import pytest

@pytest.mark.parametrize("attempt", range(10))
def test_holds_and_exits(attempt):
    script = "block = bytearray(300 * 2**20)\\nfor i in range(0, len(block), 4096): block[i] = 1\\n"
    subprocess.run([sys.executable, "-c", script], check=True)
"""


@pytest.mark.linux  # wait4's peak of the child it reaps
def test_a_child_that_exits_at_once_is_caught_every_time(pytester: pytest.Pytester):
    pytester.makepyfile(EXITS_AT_ONCE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-report=report.json")
    result.assert_outcomes(passed=10)
    tests = json.loads((pytester.path / "report.json").read_text())["tests"]
    figures = [_children(entry).processes[0] for entry in tests]
    assert len(figures) == 10
    assert all(300 * MiB <= figure.peak <= 330 * MiB and figure.exact for figure in figures)


def _mark(pid: int, first: float, last: float) -> ProcessMark:
    return ProcessMark(pid, 1, "x", first, last, 0, 0, 0, False)


def test_combined_figure_adds_only_processes_alive_together():
    figures = [ChildFigure(pid, "x", peak, True, 0, None, False) for pid, peak in ((1, 100), (2, 50), (3, 70))]
    # 1 and 2 ran together, 3 after both
    combined, basis = _combined(figures, [_mark(1, 0, 2), _mark(2, 1, 3), _mark(3, 4, 5)])
    assert (combined, basis) == (150, "marks summed")
    combined, basis = _combined(figures, [_mark(1, 0, 1), _mark(2, 2, 3), _mark(3, 4, 5)])
    assert (combined, basis) == (100, "one at a time")
    # the readings saw 1 and 2 at once where the spans did not (one never read): never below them
    combined, basis = _combined(figures, [_mark(1, 0, 1), None, _mark(3, 4, 5)], sampled_sum=140)
    assert (combined, basis) == (140, "sampled together")


OOM_SUITE = """
import subprocess, sys

def test_training_script_runs_out_of_memory():
    script = "block = bytearray(600 * 2**20)\\nfor i in range(0, len(block), 4096): block[i] = 1\\n"
    child = subprocess.run([sys.executable, "-c", script])
    assert child.returncode == -9
"""


@pytest.mark.linux  # a memory cgroup's OOM-kill count
def test_a_child_the_oom_killer_took_is_named_with_the_cgroups_count(pytester: pytest.Pytester):
    """A real OOM kill: pytest runs in a 300 MiB memory cgroup; the test's child asks for 600 MiB."""
    pytester.makepyfile(OOM_SUITE)
    with memory_cgroup(300 * MiB) as cgroup:
        result = run_pytest_in(pytester, cgroup, "-p", "no:cacheprovider", "--tfmem-budget=1GB", "-rA")
        kills = oom_kills(cgroup)  # 1, or more where the kernel took another process of the cgroup too
        assert kills >= 1
    result.assert_outcomes(passed=1)
    line = next(line for line in result.outlines if line.startswith("  pid "))
    assert "`python -c block = bytearray(600 * 2**20)" in line
    assert f"killed by SIGKILL: the kernel's OOM killer: out of memory (this cgroup's oom_kill count rose by {kills})" in line
    assert "last read at " in line


# A pool's worker that keeps what it made after its task: POOLS keeps the pools, BLOCK the memory.
KEEPING_WORKERS = """
import multiprocessing

POOLS = []

def hold(mib):
    global BLOCK
    BLOCK = bytearray(mib * 2**20)
    for i in range(0, len(BLOCK), 4096):
        BLOCK[i] = 1
"""

LEFT_RUNNING = KEEPING_WORKERS + """
import pytest

@pytest.fixture(scope="module")
def server():
    pool = multiprocessing.get_context("fork").Pool(1)
    pool.apply(hold, (60,))
    yield pool
    pool.terminate()

def test_leaves_a_worker_holding_80_mib():
    POOLS.append(multiprocessing.get_context("fork").Pool(1))
    POOLS[-1].apply(hold, (80,))

def test_uses_the_module_server(server):
    pass

def test_after():
    pass
"""


def test_a_process_left_running_counts_in_the_retained_figure_and_a_fixtures_in_its_booking(
    pytester: pytest.Pytester,
):
    pytester.makepyfile(LEFT_RUNNING)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--tfmem-max-retained=50MB", "--tfmem-report=report.json", "-rA"
    )
    result.assert_outcomes(passed=3, errors=1)
    report = json.loads((pytester.path / "report.json").read_text())
    tests = {entry["nodeid"].split("::")[1]: entry for entry in report["tests"]}
    leaver = tests["test_leaves_a_worker_holding_80_mib"]
    assert 75 * MiB <= leaver["retained_bytes"] <= 90 * MiB
    [worker] = _children(leaver).processes
    assert worker.running
    stayed = leaver["retained"]["stayed"]
    assert stayed[0].startswith(f"process pid {worker.pid} `fork of ") and " still running: " in stayed[0]
    assert "max_retained" in result.stdout.str() and f"process pid {worker.pid}" in result.stdout.str()
    # the module fixture's pool is booked to the fixture by name, not to the test that asked for it
    user = tests["test_uses_the_module_server"]
    assert abs(user["retained_bytes"]) < 10 * MiB
    [setup] = [b for b in report["session"]["workers"][0]["fixtures"] if b["detail"] == "setup"]
    assert setup["name"].startswith("server") and 55 * MiB <= setup["bytes"] <= 70 * MiB


LEAKING_POOLS = KEEPING_WORKERS + """
import pytest_tfmem

def start_a_pool_and_keep_it():
    POOLS.append(multiprocessing.get_context("fork").Pool(1))
    POOLS[-1].apply(hold, (20,))

def test_a_pool_per_iteration_leaks():
    pytest_tfmem.assert_no_leak(start_a_pool_and_keep_it, iterations=5, warmup=1, max_growth="4MB")
"""


def test_a_leak_check_sees_processes_left_running_per_iteration(pytester: pytest.Pytester):
    pytester.makepyfile(LEAKING_POOLS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "tfmem: leak: +20.* MiB per iteration > max_growth 3.8 MiB *",
        "  growth per iteration * processes it started +20.* MiB",
    ])


TRACED = """
import subprocess, sys
import tensorflow as tf

def test_runs_a_training_script():
    tf.constant(1.0)
    script = "import time\\nblock = bytearray(150 * 2**20)\\nfor i in range(0, len(block), 4096): block[i] = 1\\ntime.sleep(0.3)\\n"
    subprocess.run([sys.executable, "-c", script], check=True)
"""


@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_the_trace_timeline_of_a_test_over_budget_draws_its_processes(pytester: pytest.Pytester):
    pytester.makepyfile(TRACED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=100MB")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["memory timeline: TensorBoard scalars memory/host_rss_mib, memory/children_mib, *"])
    [summary] = pytester.path.glob(".tfmem/traces/*/*/summary.json")
    assert (summary.parent / "timeline.png").stat().st_size > 0


@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_keras_pydataset_workers_count_and_show_in_tfmem_show(pytester: pytest.Pytester):
    """The docs' workload (docs/measurement.md): a ``PyDataset`` whose two workers make each batch
    with 150 MiB of scratch space."""
    pytester.makepyfile(test_processes=(REPOSITORY / "benchmarks" / "workloads" / "processes.py").read_text())
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--tfmem-budget=4GB", "--tfmem-report=report.json", "--tfmem-trace=off",
        "-k", "keras_pydataset",
    )
    result.assert_outcomes(passed=1, deselected=8)
    [entry] = json.loads((pytester.path / "report.json").read_text())["tests"]
    children = _children(entry)
    workers = [figure for figure in children.processes if figure.command.startswith("fork of ")]
    assert len(workers) == 2 and all(145 * MiB <= figure.peak <= 175 * MiB for figure in workers)
    shown = subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", "show", "report.json"], cwd=pytester.path,
                           capture_output=True, text=True, timeout=60)
    header = next(line for line in shown.stdout.splitlines() if line.startswith("test "))
    assert "children" in header.split()


MIXED_SESSION = """
import pytest

@pytest.mark.tfmem(isolate=True)
def test_isolated():
    pass

def test_in_process_after_it():
    pass
"""


@pytest.mark.parametrize("xdist", [pytest.param([], id="one process"), pytest.param(["-n", "1"], id="xdist")])
def test_tfmems_own_processes_and_xdist_workers_are_nobodys_children(pytester: pytest.Pytester, xdist: list[str]):
    """The isolation template (a child of the session's process) and pytest-xdist's workers (the
    controller's) run beside the tests; no test's figure counts them."""
    pytester.makepyfile(MIXED_SESSION)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB", "--tfmem-report=report.json",
                                           *xdist)
    result.assert_outcomes(passed=2)
    tests = json.loads((pytester.path / "report.json").read_text())["tests"]
    assert [entry["measurement"]["children"] for entry in tests] == [None, None]


IMPORT_STARTS_A_PROCESS = """
import subprocess, sys

def test_imports_a_module_that_runs_a_helper():
    import runs_a_helper

def test_starts_its_own():
    subprocess.run([sys.executable, "-c", "block = bytearray(40 * 2**20)\\nfor i in range(0, len(block), 4096): block[i] = 1\\n"], check=True)
"""

RUNS_A_HELPER = """
import subprocess, sys
# as matplotlib runs fc-list when it is first imported (under import keras)
subprocess.run([sys.executable, "-c", "block = bytearray(60 * 2**20)\\nfor i in range(0, len(block), 4096): block[i] = 1\\n"], check=True)
"""


def test_a_process_a_first_import_starts_is_left_out_with_the_import(pytester: pytest.Pytester):
    pytester.makepyfile(runs_a_helper=RUNS_A_HELPER, test_imports=IMPORT_STARTS_A_PROCESS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=30MB", "--tfmem-report=report.json",
                                           "test_imports.py")
    result.assert_outcomes(passed=1, failed=1)
    tests = {entry["nodeid"].split("::")[1]: entry for entry in json.loads((pytester.path / "report.json").read_text())["tests"]}
    importer = tests["test_imports_a_module_that_runs_a_helper"]
    assert importer["measurement"]["children"] is None and importer["outcome"] == "passed"
    assert 40 * MiB <= _children(tests["test_starts_its_own"]).combined <= 70 * MiB


def test_the_watch_s_thread_looks_between_windows_without_a_wake_up_and_sleeps_when_idle(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(children, "IDLE_AFTER_S", 0.3)
    watch = children.ChildWatch()
    for _ in range(20):  # a run of short tests: the thread is woken once, then looks on its own
        watch.close(watch.open())
        assert watch._wake.is_set()
    window = watch.open()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.4)"])
    try:
        deadline = time.monotonic() + 2
        while child.pid not in window.seen and time.monotonic() < deadline:  # found by a look, not at the end
            time.sleep(0.01)
        assert child.pid in window.seen
    finally:
        child.wait()
        reading = watch.close(window)
    assert reading is not None and [figure.pid for figure in reading.processes] == [child.pid]
    deadline = time.monotonic() + 2
    while watch._wake.is_set() and time.monotonic() < deadline:  # no window for IDLE_AFTER_S: it sleeps
        time.sleep(0.05)
    assert not watch._wake.is_set()


TELLS_LATE = """
import os, signal, sys, time
from pytest_tfmem import platforms
from pytest_tfmem.platforms.fork_sizes import ForkSizes

sizes = ForkSizes(platforms.current().current_size, sys.argv[1])
if os.fork() == 0:
    own = bytearray(32 * 2**20)
    own[::4096] = b"\\1" * len(own[::4096])  # 32 MiB of its own, before it tells
    signal.signal(signal.SIGUSR1, lambda *_: sizes.tell(platforms.current().current_size()))
    print(os.getpid(), flush=True)
    while True:
        time.sleep(0.1)
os.wait()
"""


@pytest.mark.linux  # a fork copy, its resident size read from /proc
def test_a_fork_copy_that_tells_its_size_after_it_was_first_read_is_counted_from_what_it_told(tmp_path: Path):
    """A fork that maps shared pages again (``batch_trials``) tells its size only once it may have
    been read: the reading that found it first counts what it grew, later ones what it told
    (``told_late``: the process's own forks tell theirs as they start, ``start_size``)."""
    from pytest_tfmem import platforms
    from pytest_tfmem.platforms.fork_sizes import ForkSizes
    from pytest_tfmem.probes.watchdog import ProcessTreeRss

    told = ForkSizes(platforms.current().current_size, str(tmp_path / "told"))
    parent = subprocess.Popen([sys.executable, "-c", TELLS_LATE, str(tmp_path / "told")], stdout=subprocess.PIPE, text=True)
    try:
        fork = int(parent.stdout.readline())
        tree = ProcessTreeRss(parent.pid, told_late=told.size)
        tree.read()
        assert tree.processes[fork].fork_copy and tree.processes[fork].own_peak >= 24 * MiB  # as first read
        os.kill(fork, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while told.size(fork) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        tree.read()
        assert tree.processes[fork].own_peak < 4 * MiB  # from what it told: its 32 MiB were in it
    finally:
        parent.kill()
        parent.wait()
        try:
            os.kill(fork, signal.SIGKILL)
        except (ProcessLookupError, NameError):
            pass
