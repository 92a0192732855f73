"""The benchmark harness (``benchmarks/run.py``): its workloads run and its tables render.

These check the harness, not the numbers: the sizes are the smallest that exercise every
contender. docs/benchmarks.md is written by a full run (``--output docs/benchmarks.md``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
if str(REPOSITORY) not in sys.path:  # benchmarks/ sits beside the package, it is not installed
    sys.path.insert(0, str(REPOSITORY))

from benchmarks import machine, tables  # noqa: E402
from benchmarks.contenders import LEAK_MEMRAY, LEAK_TFMEM_TIGHT  # noqa: E402
from benchmarks.runner import Job, JobResult  # noqa: E402


def run_benchmarks(*arguments: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPOSITORY / "benchmarks" / "run.py"), *arguments],
        capture_output=True, text=True, timeout=timeout, cwd=REPOSITORY, check=False,
    )


def table_row(markdown: str, first_cell: str) -> list[str]:
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row starting with {first_cell!r} in:\n{markdown}")


def test_spike_workload_runs_under_every_contender_and_renders(tmp_path):
    output = tmp_path / "bench.md"
    completed = run_benchmarks("--quick", "--workloads", "spike", "--runs", "1", "--output", str(output))
    assert completed.returncode == 0, completed.stderr
    markdown = output.read_text()
    # the page: a title, the tables printed on stdout, then how the sections it holds measure
    assert markdown.startswith("# Benchmarks: pytest-tfmem and the alternatives\n")
    assert completed.stdout.strip() in markdown
    assert "Command: `python benchmarks/run.py --quick --workloads spike --runs 1 --output " in markdown
    assert "A smaller run than the default (3 repetitions, 20 spike and leak runs per contender; here 1 and 1)" in markdown
    method = markdown.split("## How it measures", 1)[1]
    assert "**Spike.**" in method and "**Leaks.**" not in method
    assert [path.name for path in tmp_path.iterdir()] == ["bench.md"]  # written by a rename: no temporary left
    header = table_row(markdown, "250 MB living 5 ms")
    caught = dict(zip(header, table_row(markdown, "runs whose peak includes the spike")))
    assert caught["no plugin"] == tables.NOT_A_PEAK
    assert caught["pytest-tfmem"] == "1/1"  # the kernel's high-water mark misses nothing
    assert caught["pytest-memray `limit_memory`"] == "1/1"
    assert caught["memory_profiler 0.1 s"] in ("0/1", "1/1")
    assert "- spike caught in every run: 1/1, met" in markdown
    assert "rep 1/1 spike: spike.py / memory_profiler 0.01 s" in completed.stderr  # progress on stderr
    assert "2 cores" in markdown or "cores (" in markdown  # the machine is described


@pytest.mark.parametrize(
    ("arguments", "named"),
    [(["--workloads", "spike,nope"], "nope"), (["--repeat", "0"], "--repeat"), (["--runs", "-2"], "--runs")],
)
def test_bad_arguments_are_usage_errors_naming_the_value(arguments, named):
    completed = run_benchmarks(*arguments, timeout=60)
    assert completed.returncode == 2
    assert named in completed.stderr
    assert "Traceback" not in completed.stderr


def test_a_failure_that_is_not_the_verdict_counts_as_an_error_not_a_detection():
    def line(test: str, outcome: str, message: str = "") -> dict:
        return {"test": test, "outcome": outcome, "seconds": 0.5, "peak": None, "message": message}

    leak_job = Job("leaks", "leaks.py", LEAK_TFMEM_TIGHT)
    results = tables.Results([JobResult(leak_job, [
        line("test_leak[0-0]", "passed"),
        line("test_leak[0.25-0]", "failed", "LeakDetected: tfmem: leak: +244.0 KiB per iteration"),
        line("test_leak[0.25-1]", "failed", "ZeroDivisionError: division by zero"),
    ])], {})
    figures = tables.leak_figures(results, LEAK_TFMEM_TIGHT)
    assert figures.caught[0.25] == (1, 2, 1)
    assert figures.smallest_always_caught is None
    assert "1/2 (1 errors)" in "\n".join(tables.leak_section(results))
    assert tables.leak_figures(results, LEAK_MEMRAY).caught[0.25] == (0, 0, 0)  # another contender's runs


@pytest.mark.linux  # malloc_trim hands freed heap back: a 0.25 MB/iteration leak is caught 2 of 2 times
@pytest.mark.longest
@pytest.mark.slow
def test_every_workload_runs_and_every_table_renders(tmp_path):
    completed = run_benchmarks("--quick", timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    markdown = completed.stdout
    for heading in ("**Overhead**", "**Spike capture**", "**Order independence**", "**Leak sensitivity**",
                    "**Isolation cost**", "**Targets**"):
        assert heading in markdown
    keras = table_row(markdown, "small Keras fit (TensorFlow): test time, median of 1 tests")
    assert all(cell.endswith("s") or "%)" in cell for cell in keras[1:]), keras
    assert "One full `gc.collect()`" in markdown and "objects; numpy-heavy" in markdown
    # fresh-process reference of 300 MB of small numpy arrays: about 286 MiB
    reference = table_row(markdown, "**numpy heap: 300 MB of 100 KB arrays**")
    assert reference[2].endswith("MiB") and 250 < float(reference[2].split()[0]) < 320, reference
    # --quick runs the order section's NumPy test only, and says so
    assert "TensorFlow: 300 MB of tensors" not in markdown
    assert "; order independence for 1 of its 3 tests)" in markdown
    tight = table_row(markdown, LEAK_TFMEM_TIGHT.label)
    assert tight[1] == "0/2" and tight[2] == "2/2", tight  # no false positive; 0.25 MB/iteration caught
    assert "errors" not in "\n".join(line for line in markdown.splitlines() if line.startswith("| "))
    assert table_row(markdown, "tests importing TensorFlow (1 tests)")[3].endswith(" s")


SMOKE_SUITES = ("keras-steps-pooled", "drift", "processes", "session-start")


@pytest.mark.longest
@pytest.mark.slow
def test_suite_overhead_runs_both_sides_and_writes_its_table(tmp_path):
    """The smallest run of ``benchmarks/suite_overhead.py``, with and without tfmem: one suite of
    each module template (the Keras one with its pooled prelude, the trivial one with drift's
    RSS readings), the processes, and the one-test session that the net figures subtract."""
    output = tmp_path / "overhead.md"
    completed = subprocess.run(
        [sys.executable, str(REPOSITORY / "benchmarks" / "suite_overhead.py"), "--repeat", "1", "--keras-tests", "2",
         "--trivial-tests", "25", "--suites", ",".join(SMOKE_SUITES), "--output", str(output)],
        capture_output=True, text=True, timeout=600, cwd=REPOSITORY, check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    written = output.read_text()
    assert written.startswith("# What measuring every test costs\n\nWritten by `python benchmarks/suite_overhead.py --repeat 1")
    for suite, tests in zip(SMOKE_SUITES, ("2", "25", "2", "1")):
        cells = table_row(written, suite)  # suite, tests, CPU without, CPU with, ratio, extra and net per test, GC x2
        assert len(cells) == 9 and cells[1] == tests and cells[4].startswith("x"), cells
        assert cells[2].endswith(" s") and cells[3].endswith(" s") and cells[5].endswith(" ms"), cells
        assert cells[6] == "-" if suite == "session-start" else cells[6].endswith(" ms"), cells
    assert "Each pair's CPU ratio, lowest to highest: keras-steps-pooled x" in written
    assert "| keras |" not in written and "| trivial-tf |" not in written  # --suites chose the others
    assert "RSS of `drift` (each test leaves 1 MiB of cyclic garbage) above its level at test 20" in written
    profile = written.split("## Where a test's time goes")[1]
    assert "| `core/measure.py` | " in profile and "| all of pytest-tfmem | " in profile


@pytest.mark.slow  # ten sessions of up to 400 trivial tests: about 40 s (TensorFlow's rows: docs/suite-overhead.md)
def test_suite_scale_writes_its_slopes_into_the_overhead_page_and_the_overhead_script_keeps_them(tmp_path):
    page = tmp_path / "overhead.md"
    page.write_text("# What measuring every test costs\n\nthe overhead table\n")
    completed = subprocess.run(
        [sys.executable, str(REPOSITORY / "benchmarks" / "suite_scale.py"), "--sizes", "1,200,400",
         "--frameworks", "none", "--repeat", "2", "--output", str(page)],
        capture_output=True, text=True, timeout=600, cwd=REPOSITORY, check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    written = page.read_text()
    assert written.startswith("# What measuring every test costs\n\nthe overhead table\n")  # the rest kept
    scale = written.split("<!-- suite_scale.py: begin -->")[1]
    assert "## At scale\n\nWritten by `python benchmarks/suite_scale.py --sizes 1,200,400" in scale
    rows = {(cells[0], cells[1]): cells for line in scale.splitlines()
            if (cells := [cell.strip() for cell in line.strip().strip("|").split("|")])[0] in ("none", "tensorflow")}
    assert {framework for framework, _ in rows} == {"none"}  # --frameworks chose it
    start, middle, more = rows[("none", "1")], rows[("none", "200")], rows[("none", "400")]
    assert start[5] == start[6] == start[7] == start[11] == "-", start
    assert more[5].endswith(" ms") and more[11].endswith(" B"), more
    # each session's CPU per test in its loop, read inside it; tfmem's the larger
    loop = re.fullmatch(r"(\d+\.\d\d) / (\d+\.\d\d) ms \(([+-]\d+\.\d\d)\)", more[6])
    assert loop is not None, more[6]
    plain_loop, measured_loop, extra_loop = (float(figure) for figure in loop.groups())
    assert 0 < plain_loop < measured_loop and abs(measured_loop - plain_loop - extra_loop) < 0.011, more[6]
    # of which collecting garbage: a part of each session's figure
    collecting = re.fullmatch(r"(\d+\.\d\d) / (\d+\.\d\d) ms", more[7])
    assert collecting is not None and float(collecting[1]) <= plain_loop and float(collecting[2]) <= measured_loop, more[7]
    # a suite that ran as two pairs gives each pair's difference in its loop, the row's among them
    each = re.fullmatch(r"\d+\.\d\d / \d+\.\d\d ms \(([+-]\d+\.\d\d); ([+-]\d+\.\d\d), ([+-]\d+\.\d\d)\)", middle[6])
    assert each is not None and each[1] in (each[2], each[3]), middle[6]
    # the smaller suite ran as two pairs, each one's extra CPU shown; the largest once
    assert re.fullmatch(r"[+-]\d+\.\d\d s \([+-]\d+\.\d\d, [+-]\d+\.\d\d\)", start[4]), start[4]
    assert re.fullmatch(r"[+-]\d+\.\d\d s", more[4]), more[4]
    # the measured session is the larger, and every passing test wrote a short journal line
    assert float(more[11].replace(",", "").split()[0]) > -2000 and int(more[12].replace(",", "").split()[0]) < 600
    assert machine.section_of(page, "suite_scale.py") == "<!-- suite_scale.py: begin -->" + scale.split(
        "<!-- suite_scale.py: end -->")[0] + "<!-- suite_scale.py: end -->"


def test_a_page_says_when_its_timings_were_taken_on_a_busy_machine():
    from benchmarks import machine

    assert machine.busy_warning(1.6, 1.9, cores=2) is None
    warning = machine.busy_warning(1.6, 11.2, cores=2)
    assert warning is not None and "exceeded its 2 cores" in warning and "memory figures" in warning


def test_a_smaller_run_is_named_only_where_its_sections_had_fewer_runs():
    from benchmarks import run

    assert not run.smaller_than_default(("order",), run.Sizes(repeat=2, overhead_tests=3, runs=20, isolation_tests=2))
    assert not run.smaller_than_default(("order", "isolation"), run.FULL)
    assert run.smaller_than_default(("order",), run.Sizes(repeat=1, overhead_tests=3, runs=20, isolation_tests=2))
    assert run.smaller_than_default(("spike",), run.Sizes(repeat=3, overhead_tests=3, runs=10, isolation_tests=2))
    assert run.smaller_than_default(("overhead", "order"), run.Sizes(repeat=2, overhead_tests=3, runs=20, isolation_tests=2))
    fewer_order_tests = dataclasses.replace(run.FULL, order_tests=1)
    assert run.smaller_than_default(("order",), fewer_order_tests)
    assert not run.smaller_than_default(("spike", "leaks"), fewer_order_tests)


@pytest.mark.slow
def test_a_fork_maps_again_the_library_pages_a_fit_runs():
    """``benchmarks/fork_file_pages.py``: the same small Keras fit (on TensorFlow) grows a fork's
    file-backed RSS more than its parent's, which had those library pages mapped already."""
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.fork_file_pages"], capture_output=True, text=True, timeout=300,
        cwd=REPOSITORY, env={**os.environ, "KERAS_BACKEND": "tensorflow"}, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    figures = json.loads(completed.stdout.splitlines()[0])
    fork, parent = figures["fork"], figures["parent"]
    assert figures["backend"] == "tensorflow"
    assert fork["RssFile"] > parent["RssFile"] + 4 * 2**20, figures
    gap = fork["VmRSS"] - parent["VmRSS"]
    assert fork["RssFile"] - parent["RssFile"] > 0.7 * gap, figures  # the gap is in file pages


def test_what_stayed_weighs_each_type_once_and_names_what_the_test_kept():
    """``benchmarks/what_stayed_cost.py``: the look at what stayed, timed beside the same objects
    sized one by one, names the kinds the test kept, with the bytes it counted."""
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.what_stayed_cost", "--objects", "3000"], capture_output=True, text=True,
        timeout=120, cwd=REPOSITORY, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    count = re.fullmatch(r"([\d,]+) new objects, 1,000 of them kept by the test in a list", lines[0])
    assert count is not None and int(count[1].replace(",", "")) >= 3000, lines[0]
    assert re.fullmatch(r"what stayed, as tfmem reads it: \d+\.\d ms \(\d+\.\d\d us an object\)", lines[1]), lines[1]
    assert re.fullmatch(r"the same objects sized one by one: \d+\.\d ms \(\d+\.\d\d us an object\): x\d+\.\d", lines[2])
    assert lines[3].startswith("new objects alive: ") and "function +1000 (" in lines[3], lines[3]
    named = re.fullmatch(r"named (\d+\.\d) of (\d+\.\d) KiB", lines[4])
    assert named is not None and 0 < float(named[1]) <= float(named[2]), lines[4]


def test_a_forked_inner_session_starts_faster_than_a_fresh_one():
    """``benchmarks/forked_session_start.py``: the tests' trivial inner session, fresh and forked."""
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.forked_session_start", "--repeat", "1"], capture_output=True, text=True,
        timeout=300, cwd=REPOSITORY, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = re.fullmatch(r"a session of one trivial test, median of 1 each: fresh interpreter (\d+\.\d\d) s, "
                        r"forked (\d+\.\d\d) s \(x\d\.\d\d\)", completed.stdout.strip())
    assert line is not None, completed.stdout
    assert float(line[1]) > 0 and float(line[2]) > 0, completed.stdout  # which is faster is the benchmark's to say


SPINNING_TEST = """
import os, time

def test_spins():
    with open("affinity.txt", "w") as written:
        written.write(" ".join(map(str, sorted(os.sched_getaffinity(0)))))
    started = time.process_time()
    while time.process_time() - started < 0.5:
        pass
"""


@pytest.mark.linux  # sched_setaffinity, os.wait4
def test_real_suite_sessions_at_once_are_pinned_to_their_core_and_each_gets_its_own_cpu_time(tmp_path):
    """``benchmarks.real_suite_cost --same-core``: the sides' sessions run at once, each pinned to
    its slot's core, and each reads its own CPU time (``os.wait4``), its test's half second included."""
    from benchmarks.process_size import TIMING
    from benchmarks.real_suite_cost import Slot, sessions

    core = min(os.sched_getaffinity(0))
    slots = [Slot(tmp_path / side, core) for side in ("plain", "tfmem")]
    for slot in slots:
        slot.directory.mkdir()
        (slot.directory / "pytest.ini").write_text("[pytest]\n")
        (slot.directory / "bench_timing.py").write_text(TIMING)
        (slot.directory / "test_spin.py").write_text(SPINNING_TEST)
    plain, measured = sessions(slots, ["test_spin.py"], [("-p", "no:tfmem"), ("--tfmem-budget=4GB",)])
    for slot, done in zip(slots, (plain, measured)):
        assert (slot.directory / "affinity.txt").read_text() == str(core)
        assert len(done.timed["times"]) == 1 and done.timed["times"][0] >= 0.5
        assert 0.5 < done.cpu < done.wall + 0.1, done


SPENDING = """
import subprocess
import sys


def test_starts_a_busy_process():
    subprocess.run([sys.executable, "-c", "sum(range(3 * 10**7))"], check=True)


def test_idles():
    pass
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_suite_cpu_counts_what_a_tests_processes_spent_and_the_controller_sums_the_workers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: list[str]
):
    monkeypatch.setenv("PYTHONPATH", str(REPOSITORY))
    pytester.makepyfile(test_spending=SPENDING)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "benchmarks.suite_cpu", *workers)
    result.assert_outcomes(passed=2)
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "suite CPU: where the tests' CPU time went" in line)
    assert re.fullmatch(r"2 tests: \d+\.\d s of CPU time in \d+\.\d s \(\d+\.\d\d cores busy\)", lines[start + 1]), lines[start + 1]
    tests = lines[lines.index("the 20 tests that took the most (CPU s, wall s, test):", start) + 1:][:2]
    (busy, _, busy_name), (idle, _, idle_name) = (line.split() for line in tests)
    assert (busy_name, idle_name) == ("test_spending.py::test_starts_a_busy_process", "test_spending.py::test_idles")
    assert float(busy) >= 0.3 > float(idle), tests  # the child's counting, read once it was waited for
