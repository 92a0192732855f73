"""Notebooks run as tests (nbmake) with a real ipykernel: a notebook over its budget, or killed at
its limit in a child process, fails as a test does, with tfmem's message (the figure, the kernel
process named), not as nbmake's "INTERNAL ERROR" with a traceback through pluggy."""

from __future__ import annotations

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

BIG_CELL = "import numpy as np\nblock = np.ones(400 * 2**20, dtype=np.uint8)\nint(block[-1])"


def notebook(path, *cells: str) -> None:
    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(book, str(path))


def assert_failed_as_a_test(result: pytest.RunResult, expected: str) -> None:
    output = result.stdout.str()
    assert "INTERNAL ERROR" not in output and "Traceback" not in output and "pluggy/_" not in output, output
    failed = [line for line in result.stdout.lines if line.startswith("FAILED ")]
    assert len(failed) == 1 and " - tfmem: " in failed[0], output
    result.stdout.fnmatch_lines([expected])


@pytest.mark.linux  # the kernel is a process the test started: its peak is read from /proc
def test_a_notebook_over_its_budget_fails_like_a_test_naming_the_kernel(pytester: pytest.Pytester):
    pytest.importorskip("nbmake")
    notebook(pytester.path / "big.ipynb", BIG_CELL)
    result = pytester.runpytest_subprocess("--nbmake", "--tfmem-budget=200MB", "big.ipynb")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert_failed_as_a_test(result, "tfmem: peak 4??.? MiB > budget 200MB (190.7 MiB) (host RSS *, 1 process it "
                                    "started 4??.? MiB, the largest pid * `python -m ipykernel_launcher *` 4??.? MiB)")
    result.stdout.fnmatch_lines(["tfmem: what used it: mostly the processes it started (4??.? MiB of 4??.? MiB); "
                                 "their lines ran there, *`%%tfmem` a notebook cell's (docs/notebooks.md)"])


@pytest.mark.linux
def test_an_isolated_notebook_killed_at_its_limit_fails_like_a_test(pytester: pytest.Pytester):
    pytest.importorskip("nbmake")
    notebook(pytester.path / "big.ipynb", BIG_CELL)
    result = pytester.runpytest_subprocess("--nbmake", "--tfmem-isolate", "--tfmem-kill-at=300MB", "big.ipynb")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert_failed_as_a_test(result, "tfmem: killed at kill_at 300MB (286.1 MiB): the isolated test's process tree "
                                    "reached * MiB after *")
