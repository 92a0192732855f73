"""A new user's first hour, followed step by step: a project of their own in a fresh virtual
environment that has ``tensorflow-cpu`` already, the README's own install line, then a budget, a
baseline and a memory history gate failing, each saying what used the memory."""

from __future__ import annotations

import json
import re
import subprocess
import venv
from importlib import metadata
from pathlib import Path

import pytest

from pytest_tfmem.gates.environment import PROVIDERS

REPOSITORY = Path(__file__).resolve().parent.parent
PLACEHOLDER = "/path/to/pytest-tfmem"

PROJECT = '''
import numpy as np

ROWS = {rows}


def test_batch():
    batch = np.ones((ROWS, 1024), dtype=np.float64)  # ROWS x 8 KiB
    assert batch.sum() == ROWS * 1024
'''


def readme_install_line() -> list[str]:
    """The README's line for one's own project: ``pip install "/path/to/pytest-tfmem"``, as words."""
    readme = (REPOSITORY / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("pip install") and PLACEHOLDER in line
                and "own project" in line)
    command = line.split("#", 1)[0].split()
    assert command[:2] == ["pip", "install"], line
    return [word.strip('"').replace(PLACEHOLDER, str(REPOSITORY)) for word in command[2:]]


def run(*command: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(part) for part in command], cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.mark.slow  # a fresh environment, tensorflow-cpu from the package index: a minute or two
def test_a_project_with_tensorflow_cpu_gets_no_second_tensorflow_and_each_failure_says_what_used_the_memory(
    tmp_path: Path,
) -> None:
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    tensorflow = metadata.version("tensorflow")  # the version this suite runs, as its CPU-only wheel
    # --no-compile: no byte code written for TensorFlow's thousands of modules (CPU time, not what is installed)
    done = run(python, "-m", "pip", "install", "--quiet", "--no-compile", f"tensorflow-cpu=={tensorflow}", cwd=tmp_path)
    if done.returncode != 0:
        pytest.skip(f"tensorflow-cpu {tensorflow} cannot be installed here: {done.stderr[-500:]}")
    words = readme_install_line()
    done = run(python, "-m", "pip", "install", "--quiet", "--no-compile", *words, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    listed = json.loads(run(python, "-m", "pip", "list", "--format=json", cwd=tmp_path).stdout)
    names = {package["name"].lower().replace("_", "-") for package in listed}  # pip may list tensorflow_cpu
    assert names & set(PROVIDERS["tensorflow"]) == {"tensorflow-cpu"}, sorted(names)  # still the only one
    assert "pytest-tfmem" in names

    project = tmp_path / "project"
    project.mkdir()
    for command in (["init", "-q"], ["config", "user.email", "ci@example.com"], ["config", "user.name", "CI"]):
        assert run("git", *command, cwd=project).returncode == 0

    def commit(rows: int, message: str) -> None:
        (project / "test_model.py").write_text(PROJECT.format(rows=rows))
        assert run("git", "add", "test_model.py", cwd=project).returncode == 0
        assert run("git", "commit", "-qm", message, cwd=project).returncode == 0

    def pytest_run(*options: str) -> subprocess.CompletedProcess[str]:
        return run(python, "-m", "pytest", "-p", "no:cacheprovider", *options, cwd=project)

    commit(5120, "a 40 MiB batch")
    for _ in range(2):  # two readings: a level
        recorded = pytest_run("--tfmem-history=history.jsonl", "--tfmem-save-baseline=baseline.json",
                              "--tfmem-report=report.json")
        assert recorded.returncode == 0, recorded.stdout
    report = json.loads((project / "report.json").read_text())
    assert report["environment"]["tensorflow"] == tensorflow  # the module, from the CPU-only wheel
    commit(5120 * 2, "the batch doubles")
    failures = {
        "budget": pytest_run("--tfmem-budget=50MB"),
        "baseline": pytest_run("--tfmem-baseline=baseline.json"),
        "history gate": pytest_run("--tfmem-history=history.jsonl", "--tfmem-history-gate=25%"),
    }
    for check, failed in failures.items():
        assert failed.returncode == 1, (check, failed.stdout)
        assert re.search(r"^tfmem: what used it: mostly host memory outside the frameworks' allocators \(NumPy "
                         r"arrays, Python objects, native libraries\): host RSS (79|80)\.\d MiB of (79|80)\.\d MiB; for the "
                         r"line, run the test with --tfmem-explain$", failed.stdout, re.MULTILINE), (check, failed.stdout)
