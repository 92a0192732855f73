"""The ``tfmem`` command on a baseline and a report from real pytest runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import forked_sessions
import pytest
from gates_helpers import suite_source

from pytest_tfmem import __version__
from pytest_tfmem.cli.main import EXIT_BAD_INPUT, EXIT_OK, EXIT_READER_GONE, EXIT_REGRESSION


@pytest.fixture(scope="module")
def gate_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``base.json`` from a first run; ``report.json`` after ``test_grow`` grew from 80 to 120 MB, compared at 10%."""
    folder = tmp_path_factory.mktemp("cli")
    environment = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}

    def pytest_run(sizes: dict[str, int], *args: str) -> None:
        (folder / "test_suite.py").write_text(suite_source(sizes))
        forked_sessions.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_suite.py", *args],
            cwd=folder, env=environment, framework=False,
        )  # fmt: skip

    pytest_run({"grow": 80, "steady": 60}, "--tfmem-save-baseline=base.json")
    pytest_run(
        {"grow": 120, "steady": 60, "new": 20},
        "--tfmem-baseline=base.json", "--tfmem-tolerance=10%", "--tfmem-report=report.json", "--tfmem-budget=1GB",
    )  # fmt: skip
    assert (folder / "base.json").is_file() and (folder / "report.json").is_file()
    return folder


def tfmem(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest_tfmem.cli.main", *args], cwd=folder, capture_output=True, text=True, check=False
    )


def test_compare_prints_the_table_and_exits_1_on_a_regression(gate_files):
    done = tfmem(gate_files, "compare", "base.json", "report.json", "--tolerance", "10%")
    assert done.returncode == EXIT_REGRESSION, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["test", "what", "baseline", "now", "change", "tolerance", "status"]
    grow = next(line for line in lines if line.startswith("test_suite.py::test_grow"))
    assert grow.split()[-2:] == ["10%", "regression"]
    new = next(line for line in lines if line.startswith("test_suite.py::test_new"))
    assert new.endswith("not in baseline")
    assert not any(line.startswith("test_suite.py::test_steady") for line in lines)  # within tolerance: not listed
    # tests, not their quantities: test_steady (its peak and what it left behind, within tolerance)
    assert lines[-1] == "1 regression(s), 0 improvement(s) beyond tolerance, 1 within tolerance, 1 not in the baseline"


def test_compare_exits_0_within_tolerance_and_all_lists_every_test(gate_files):
    done = tfmem(gate_files, "compare", "base.json", "report.json", "--tolerance", "60%", "--all")
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    # one row a test: its peak, and what it left behind where its baseline entry has that figure
    assert sorted(line.split()[:3] for line in done.stdout.splitlines() if line.startswith("test_suite.py::")) == [
        ["test_suite.py::test_grow", "peak;", "retained"],
        ["test_suite.py::test_new", "peak", "-"],
        ["test_suite.py::test_steady", "peak;", "retained"],
    ]
    assert "0 regression(s)" in done.stdout


def test_compare_uses_the_tolerance_the_report_was_compared_with(gate_files):
    done = tfmem(gate_files, "compare", "base.json", "report.json")
    assert done.returncode == EXIT_REGRESSION
    grow = next(line for line in done.stdout.splitlines() if line.startswith("test_suite.py::test_grow"))
    assert grow.split()[-2:] == ["10%", "regression"]


def test_compare_markdown_for_a_pull_request_comment(gate_files):
    done = tfmem(gate_files, "compare", "base.json", "report.json", "--tolerance=10%", "--markdown")
    assert done.returncode == EXIT_REGRESSION
    assert done.stdout.startswith("### pytest-tfmem: memory compared with the baseline\n")
    row = next(line for line in done.stdout.splitlines() if line.startswith("| test_suite.py::test_grow |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "peak" and cells[-2:] == ["10%", "regression"]
    change = float(cells[4].split("(")[1].rstrip("%)"))
    assert 40 < change < 60  # 120 MB against 80 MB


def test_compare_bad_input_exits_2_with_a_clear_message(gate_files):
    (gate_files / "corrupt.json").write_text('{"format": "pytest-tfmem-baseline", ')
    cases = {
        ("compare", "missing.json", "report.json"): "tfmem: error: baseline file 'missing.json': no such file",
        ("compare", "corrupt.json", "report.json"): "tfmem: error: baseline file 'corrupt.json': not valid JSON",
        ("compare", "base.json", "base.json"): "tfmem: error: report file 'base.json': not a pytest-tfmem report",
        ("compare", "report.json", "report.json"): "tfmem: error: baseline file 'report.json': not a pytest-tfmem baseline",
        ("compare", "base.json", "report.json", "--tolerance=10"): "invalid --tolerance value '10': expected a percentage",
        ("show", "."): "tfmem: error: report file '.': cannot be read (Is a directory)",
    }
    for args, message in cases.items():
        done = tfmem(gate_files, *args)
        assert done.returncode == EXIT_BAD_INPUT, args
        assert message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_show_prints_every_test_heaviest_first(gate_files):
    done = tfmem(gate_files, "show", "report.json")
    assert done.returncode == EXIT_OK, done.stderr
    assert "3 tests measured: 0 over budget, 1 regression beyond tolerance" in done.stdout
    assert "report.json: created" in done.stdout.splitlines()[0]
    tests_table, moved_table = done.stdout.split("beyond tolerance of the baseline")
    rows = [line.split()[0] for line in tests_table.splitlines() if line.startswith("test_suite.py::")]
    assert rows == ["test_suite.py::test_grow", "test_suite.py::test_steady", "test_suite.py::test_new"]
    moved = [line.split() for line in moved_table.splitlines() if line.startswith("test_suite.py::")]
    assert [(row[0], row[-1]) for row in moved] == [("test_suite.py::test_grow", "regression")]


def test_plot_writes_a_png_with_the_bars(gate_files):
    from matplotlib import image
    done = tfmem(gate_files, "plot", "report.json", "-o", "memory.png")
    assert done.returncode == EXIT_OK, done.stderr
    assert done.stdout.strip() == "memory.png: 3 test(s) drawn"
    pixels = image.imread(gate_files / "memory.png")
    height, width, _ = pixels.shape
    assert width == 1000 and height >= 300
    rgb = pixels[..., :3]
    not_white = (rgb < 0.95).any(axis=-1).mean()
    assert not_white > 0.05, "the chart is blank"
    def share(colour: list[float]) -> float:
        return (abs(rgb - colour) < 0.02).all(axis=-1).mean()

    assert share([0.122, 0.467, 0.706]) > 0.005  # blue bars: the tests within tolerance
    assert share([0.839, 0.153, 0.157]) > 0.01  # a red bar: the regression


def test_help_and_the_installed_console_script(gate_files):
    done = tfmem(gate_files, "--help")
    assert done.returncode == 0
    for command in ("compare", "show", "plot", "last", "run", "merge", "history"):
        assert command in done.stdout
    said = " ".join(done.stdout.split())  # argparse folds the epilog
    assert ("exit codes: 0 fine; 1 a regression beyond tolerance (compare), or the session `last` describes did "
            "not finish; 2 bad input; 141 the reader of the output closed it") in said
    version = tfmem(gate_files, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"tfmem (pytest-tfmem) {__version__}"
    assert tfmem(gate_files).returncode == EXIT_BAD_INPUT  # no command: help on stderr
    for command in ("compare", "show", "plot"):
        done = tfmem(gate_files, command, "--help")
        assert done.returncode == 0 and done.stdout.startswith(f"usage: tfmem {command}"), done.stderr
    assert "10%+16MB" in tfmem(gate_files, "compare", "--help").stdout
    # The console script installed beside this interpreter (PATH may find another environment's).
    script = Path(sys.executable).with_name("tfmem")
    assert script.exists(), "the tfmem console script is not installed: pip install -e ."
    done = subprocess.run(
        [script, "compare", "base.json", "report.json"], cwd=gate_files, capture_output=True, text=True, check=False
    )
    assert done.returncode == EXIT_REGRESSION and "regression" in done.stdout.lower(), done.stderr


def test_show_into_a_reader_that_stops_early_ends_quietly(tmp_path: Path):
    """``tfmem show r.json | head -5`` on a report larger than a pipe holds: no BrokenPipeError."""
    (tmp_path / "test_many.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('i', range(1500))\ndef test_t(i):\n    pass\n")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                    "--tfmem-report=r.json", "test_many.py"], cwd=tmp_path, capture_output=True, check=True)
    assert (tmp_path / "r.json").stat().st_size > 2**16  # more than a pipe's buffer
    shown = subprocess.Popen([sys.executable, "-m", "pytest_tfmem.cli.main", "show", "r.json"], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert shown.stdout is not None and shown.stderr is not None
    assert shown.stdout.readline().startswith(b"report r.json")
    shown.stdout.close()  # as head does after its lines
    error = shown.stderr.read().decode()
    assert shown.wait(timeout=60) == EXIT_READER_GONE
    assert "Traceback" not in error and "BrokenPipeError" not in error, error
