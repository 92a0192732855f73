"""Notebooks run as tests with a real ipykernel: under nbmake (a notebook, one test, in a kernel it
starts) and nbval (a cell, one test, in a kernel started before the first cell's window), a
notebook over its budget, or killed at its limit in a child process, fails as a test does, with
tfmem's message (the figure, the kernel process named), not as nbmake's "INTERNAL ERROR" with a
traceback through pluggy."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

BIG_CELL = "import numpy as np\nblock = np.ones(400 * 2**20, dtype=np.uint8)\nint(block[-1])"


def notebook(path, *cells: str) -> None:
    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell(source, execution_count=number + 1) for number, source in enumerate(cells)]
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(book, str(path))


# A section of a test's captured output in pytest's report, and the header of whatever comes next.
CAPTURED = re.compile(r"^-+ Captured \w+ \w+ -+$")
SECTION = re.compile(r"^([-=_])\1{2,}( .* \1{3,})?$")


def without_captured_output(lines: list[str]) -> str:
    """The report without the captured output of tests: there, the kernel's own stderr, where
    ipykernel may print a traceback of its own as it shuts down (ipython/ipykernel#1518)."""
    kept: list[str] = []
    captured = False
    for line in lines:
        if CAPTURED.match(line) or SECTION.match(line):
            captured = bool(CAPTURED.match(line))
        if not captured:
            kept.append(line)
    return "\n".join(kept)


def assert_failed_as_a_test(result: pytest.RunResult, expected: str) -> None:
    output = result.stdout.str()
    report = without_captured_output(result.stdout.lines)
    assert "INTERNAL ERROR" not in report and "Traceback" not in report and "pluggy/_" not in report, output
    failed = [line for line in result.stdout.lines if line.startswith("FAILED ")]
    assert len(failed) == 1 and " - tfmem: " in failed[0], output
    result.stdout.fnmatch_lines([expected])


@pytest.mark.linux  # the kernel's memory is read from /proc
@pytest.mark.parametrize(("runner", "option", "kernel"),
                         [("nbmake", "--nbmake", "it started"), ("nbval", "--nbval-lax", "it used")])
def test_a_notebook_over_its_budget_fails_like_a_test_naming_the_kernel(pytester: pytest.Pytester, runner: str,
                                                                         option: str, kernel: str):
    """nbmake's kernel starts in the test; nbval's before the cell's window opens: it counts by
    what it grew while the cell ran (``--nbval-lax``: the cells' outputs are not compared). The
    kernel may start a short helper of its own (``uname -p``), so the count of processes is not fixed."""
    pytest.importorskip(runner)
    notebook(pytester.path / "big.ipynb", BIG_CELL)
    result = pytester.runpytest_subprocess("-p", runner, option, "--tfmem-budget=200MB", "big.ipynb")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert_failed_as_a_test(result, f"tfmem: peak 4??.? MiB > budget 200MB (190.7 MiB) (host RSS *, * {kernel} "
                                    "4??.? MiB, the largest pid * `python -m ipykernel_launcher *` 4??.? MiB)")
    result.stdout.fnmatch_lines([f"tfmem: what used it: mostly the process* {kernel} (4??.? MiB of 4??.? MiB); "
                                 "the code that used it ran there, *`%%tfmem` a notebook cell's (docs/notebooks.md)"])


@pytest.mark.linux
def test_a_cell_that_leaves_too_much_in_the_kernel_errors_at_its_teardown_like_a_test(pytester: pytest.Pytester):
    """nbval's kernel lives on between cells: what a cell leaves in it is the cell's retained figure."""
    pytest.importorskip("nbval")
    notebook(pytester.path / "keep.ipynb", BIG_CELL, "x = 1")
    result = pytester.runpytest_subprocess("-p", "nbval", "--nbval-lax", "--tfmem-max-retained=100MB", "keep.ipynb")
    output = result.stdout.str()
    assert "INTERNAL ERROR" not in output and "Traceback" not in output, output
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of keep.ipynb::Cell 0*",
                                 "tfmem: retained 4??.? MiB > max_retained 100MB (95.4 MiB) after the teardown *"
                                 "process pid * `python -m ipykernel_launcher *` still running: 4??.? MiB*"])


KERAS_CELLS = ("import numpy as np, keras", "block = np.ones(100 * 2**20, dtype=np.uint8)\nint(block[-1])", "x = 1")


@pytest.mark.linux
def test_a_notebook_cell_is_held_to_its_own_need_and_the_kernels_start_and_imports_are_booked_apart(
    pytester: pytest.Pytester,
):
    """nbval: the first cell imports NumPy and Keras in the kernel (hundreds of MiB, the kernel's
    once); it is held to what it needs itself, the section says what the kernel booked apart, and
    the last cell is not charged the kernel's shutdown."""
    pytest.importorskip("nbval")
    notebook(pytester.path / "keras.ipynb", *KERAS_CELLS)
    result = pytester.runpytest_subprocess("-p", "nbval", "--nbval-lax", "--tfmem-budget=200MB",
                                           "--tfmem-report=report.json", "keras.ipynb", "-rA")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([
        "tfmem: notebook kernels book their start and first imports apart (--tfmem-notebook-kernel=whole holds the "
        "whole kernel)",
        "*running before the test, grew * while it ran (as read every 5 ms), running when the test ended; booked "
        "apart, not counted: first import of numpy *.? MiB, first import of keras *.? MiB",
    ])
    tests = {test["nodeid"].split("::")[-1]: test for test in json.loads((pytester.path / "report.json").read_text())["tests"]}
    # The kernel, running before the cell, and what the cell's imports started: under load, a fork
    # of the kernel (its ``uname -p``) can be listed too, with the kernel's command.
    processes = tests["Cell 0"]["measurement"]["children"]["processes"]
    kernel = next(process for process in processes if "ipykernel" in process["command"] and process["running_before"])
    assert kernel["booked"] > 300 * 2**20 and kernel["peak"] < 20 * 2**20
    assert tests["Cell 1"]["measurement"]["peak"] > 99 * 2**20  # the notebook's own work stays its own
    assert tests["Cell 2"]["retained_bytes"] > -10 * 2**20  # the kernel's shutdown is not the last cell's


@pytest.mark.linux
def test_the_whole_kernel_is_held_to_the_budget_on_request(pytester: pytest.Pytester):
    """nbmake with --tfmem-notebook-kernel=whole: the kernel's start and imports count, as a machine's limit sees them."""
    pytest.importorskip("nbmake")
    notebook(pytester.path / "keras.ipynb", *KERAS_CELLS)
    own = pytester.runpytest_subprocess("-p", "nbmake", "--nbmake", "--tfmem-budget=200MB", "keras.ipynb")
    own.assert_outcomes(passed=1)
    whole = pytester.runpytest_subprocess("-p", "nbmake", "--nbmake", "--tfmem-budget=200MB",
                                          "--tfmem-notebook-kernel=whole", "keras.ipynb")
    whole.assert_outcomes(failed=1)
    assert_failed_as_a_test(whole, "tfmem: peak *.? MiB > budget 200MB (190.7 MiB) (host RSS *, * it started *)")
    bad = pytester.runpytest_subprocess("-p", "nbmake", "--tfmem-notebook-kernel=all", "keras.ipynb")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*invalid --tfmem-notebook-kernel value 'all': expected own * or whole *"])


SHORT_PROGRAM_CELL = """import subprocess, sys
program = "import time; block = bytearray(60 * 2**20); [block.__setitem__(i, 1) for i in range(0, len(block), 4096)]; time.sleep(0.2)"
subprocess.run([sys.executable, "-c", program], check=True)"""


@pytest.mark.linux
def test_a_cell_whose_program_is_over_its_budget_fails_on_the_first_run_and_says_cells_are_not_re_run(
    pytester: pytest.Pytester,
):
    """The kernel's own child, a program of a fifth of a second: read through the kernel's tree.
    A cell is not run twice (it would run in a kernel its first run changed): its verdict is the
    first run's, and its section says so."""
    pytest.importorskip("nbval")
    notebook(pytester.path / "short.ipynb", SHORT_PROGRAM_CELL)
    result = pytester.runpytest_subprocess("-p", "nbval", "--nbval-lax", "--tfmem-budget=50MB", "short.ipynb")
    assert_failed_as_a_test(result, "tfmem: peak 7?.? MiB > budget 50MB (47.7 MiB) (host RSS *, 1 process it started 7?.? MiB, *")
    result.stdout.fnmatch_lines(["the verdict is the first run's, not confirmed by a re-run: an IPyNbCell is not "
                                 "re-run: only test functions and unittest.TestCase methods are *"])


LEAKY_CELL = """import numpy as np
import pytest_tfmem
kept = []
def step():
    kept.append(np.ones(2 * 2**20, dtype=np.uint8))
pytest_tfmem.assert_no_leak(step, iterations=8, max_growth="512KB")"""


@pytest.mark.linux
def test_a_leak_check_in_a_notebook_fails_it_with_the_leaks_message(pytester: pytest.Pytester):
    """Inside the kernel a leak check's failure is an ordinary exception: nbmake shows the cell
    and that one error, as for any cell that raises."""
    pytest.importorskip("nbmake")
    notebook(pytester.path / "leaky.ipynb", LEAKY_CELL)
    result = pytester.runpytest_subprocess("-p", "nbmake", "--nbmake", "leaky.ipynb")
    output = result.stdout.str()
    assert "INTERNAL ERROR" not in output and "pluggy/_" not in output, output
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*LeakDetected*: tfmem: leak: +?.? MiB per iteration > max_growth 500.0 KiB*"])


@pytest.mark.linux
def test_an_isolated_notebook_killed_at_its_limit_fails_like_a_test(pytester: pytest.Pytester):
    pytest.importorskip("nbmake")
    notebook(pytester.path / "big.ipynb", BIG_CELL)
    result = pytester.runpytest_subprocess("-p", "nbmake", "--nbmake", "--tfmem-isolate", "--tfmem-kill-at=300MB",
                                           "big.ipynb")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert_failed_as_a_test(result, "tfmem: killed at kill_at 300MB (286.1 MiB): the isolated test's process tree "
                                    "reached * MiB after *")


def cell_text(cell) -> str:
    """What a cell printed, or the error it ended in (``BudgetExceeded: tfmem: peak ...``)."""
    parts = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif output["output_type"] == "error":
            parts.append(f"{output['ename']}: {output['evalue']}")
    return "".join(parts)


@pytest.mark.linux  # exact marks: a cell's peak is the kernel's high-water mark
def test_the_docs_notebook_runs_in_a_real_kernel_as_the_docs_show_it() -> None:
    """docs/notebooks/magics.ipynb is written by scripts/doc_notebook.py: run again here with
    nbclient in a fresh ipykernel, its cells print the figures the docs show; over budget, one
    error; past the guard, a growing loop stopped where it was; the kernel and its variables live on."""
    pytest.importorskip("nbclient")
    script = Path(__file__).resolve().parent.parent / "scripts" / "doc_notebook.py"
    spec = importlib.util.spec_from_file_location("doc_notebook", script)
    assert spec is not None and spec.loader is not None
    doc_notebook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc_notebook)
    ran = [cell_text(cell) for cell in doc_notebook.executed().cells]
    assert ran[0] == ""
    assert re.match(r"tfmem: peak (79|80)\.\d MiB .*; left behind \+(49\.9|50\.\d) MiB", ran[1]), ran[1]
    assert "<= budget 100MB (95.4 MiB)" in ran[2]
    assert ran[3].startswith("BudgetExceeded: tfmem: peak 4") and "> budget 20MB (19.1 MiB)" in ran[3], ran[3]
    assert ran[4] == "the kernel lives on: kept 50 MiB, big 40 MiB\n"
    assert ran[5] == "tfmem auto: a line after every cell\n"
    assert re.match(r"tfmem: peak \+(49|50)\.\d MiB, kept [+-]", ran[6]), ran[6]
    assert ran[7].startswith("tfmem auto: off")
    assert ran[8].startswith("tfmem guard: a cell that takes the kernel past 500MB (476.8 MiB) is stopped there")
    # stopped within a few 20 MiB batches of the guard: its thread reads every 20 ms, and on a busy
    # machine it has run late by a batch or two (504.9 MiB, in a full run beside another session)
    stopped_at = re.match(r"GuardTripped: tfmem guard: this cell took the kernel to (\d+\.\d) MiB", ran[9])
    assert stopped_at is not None and 476.8 < float(stopped_at[1]) < 476.8 + 3 * 20, ran[9]
    assert "past the guard of 476.8 MiB (500MB)" in ran[9], ran[9]
    # after the stop: the next cell begins above the guard, is told so once, and runs on, as do the cells after it
    told, printed = ran[10].split("\n", 1)
    assert told.startswith("tfmem guard: the kernel holds ") and "above the guard of 476.8 MiB" in told, ran[10]
    assert re.fullmatch(r"stopped after \d+ batches; kept 50 MiB is still here\n", printed), ran[10]
    assert ran[11] == "a cell that grows nothing runs on\n" and ran[12] == ""
    assert ran[13].startswith("tfmem guard: a cell that takes the kernel past ") and "less a margin of" in ran[13]
    stored = nbformat.read(str(doc_notebook.NOTEBOOK), as_version=4)
    assert [cell.source for cell in stored.cells] == list(doc_notebook.CELLS)  # the docs show these cells
    shown = [cell_text(cell) for cell in stored.cells]
    assert [text.split(" ", 2)[:2] for text in shown] == [text.split(" ", 2)[:2] for text in ran]  # as written, not by hand
