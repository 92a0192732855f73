"""The gate commands README.md and docs/ci.md show, run as written on a small Keras project: five
shuffled commits of unchanged code pass every one of them, and a real +50% step fails each.

The project: small Keras tests (``benchmarks/workloads/small_keras.py``) and one test that holds a
batch of data (40 MiB). Its baseline is saved on the first commit (``--tfmem-save-baseline``, "on
main"); each commit then runs in its own random order with the pull request's gate
(``--tfmem-baseline``, the default tolerance), a JSON report for ``tfmem compare``, and the memory
history with the gate history.md suggests (``--tfmem-history-gate=25%``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import forked_sessions
import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
WORKLOAD = REPOSITORY / "benchmarks" / "workloads" / "small_keras.py"
BATCH = """import numpy as np


def test_batch():
    batch = np.ones(({rows}, 1024), dtype=np.float64)  # rows x 8 KiB
    assert batch.sum() == {rows} * 1024
"""
ROWS = 5120  # 40 MiB
# As a user's session runs: shuffled by pytest-randomly (this suite's inner runs leave it off:
# tests/conftest.py), with tfmem's defaults: no first-use warm-up, verdicts confirmed by a re-run
USERS_SESSION = ("-p", "no:cacheprovider", "-p", "randomly", "-o", "tfmem_first_use_warmup=false",
                 "-o", "tfmem_confirm=true")
# Keras on TensorFlow, as the suite's own sessions run it: they fork from its forking process
ENVIRONMENT = {"KERAS_BACKEND": "tensorflow", "GIT_AUTHOR_NAME": "ci", "GIT_AUTHOR_EMAIL": "ci@example.com",
               "GIT_COMMITTER_NAME": "ci", "GIT_COMMITTER_EMAIL": "ci@example.com"}


class Project:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        shutil.copy(WORKLOAD, folder / "test_small_keras.py")
        (folder / "pytest.ini").write_text("[pytest]\n")
        self.git("init", "-q")

    def git(self, *args: str) -> None:
        subprocess.run(["git", *args], cwd=self.folder, check=True, capture_output=True,
                       env={**os.environ, **ENVIRONMENT})

    def commit(self, number: int, rows: int) -> None:
        (self.folder / "test_batch.py").write_text(BATCH.format(rows=rows))
        (self.folder / "COMMIT").write_text(f"{number}\n")
        self.git("add", "-A")
        self.git("commit", "-q", "-m", f"commit {number}")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A pytest session forked from a process with TensorFlow imported, as every one of them
        is; ``tfmem compare`` in a fresh interpreter."""
        return forked_sessions.run([sys.executable, *args], cwd=self.folder, timeout=600,
                                   env={**os.environ, **ENVIRONMENT})  # fmt: skip

    def pull_request(self, seed: int) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
        """The README's pull-request commands: the baseline gate with a report, then ``tfmem compare``."""
        gated = self.run("-m", "pytest", *USERS_SESSION, f"--randomly-seed={seed}", "--tfmem-baseline=tfmem-baseline.json",
                         "--tfmem-report=tfmem-report.json", "--tfmem-history=memory-history.jsonl",
                         "--tfmem-history-gate=25%")
        compared = self.run("-m", "pytest_tfmem.cli.main", "compare", "tfmem-baseline.json", "tfmem-report.json")
        return gated, compared


@pytest.mark.slow  # eight sessions of a small Keras project: about a minute
@pytest.mark.longest
def test_the_documented_gates_pass_unchanged_code_and_fail_a_real_step(tmp_path: Path) -> None:
    pytest.importorskip("pytest_randomly")
    project = Project(tmp_path)
    project.commit(0, ROWS)
    saved = project.run("-m", "pytest", *USERS_SESSION, "--randomly-seed=0", "--tfmem-save-baseline=tfmem-baseline.json",
                        "--tfmem-history=memory-history.jsonl")
    assert saved.returncode == 0, saved.stdout[-3000:]
    for number in range(1, 6):
        project.commit(number, ROWS)
        gated, compared = project.pull_request(seed=number)
        assert gated.returncode == 0, f"commit {number}:\n{gated.stdout[-4000:]}"
        assert compared.returncode == 0, f"commit {number}:\n{compared.stdout[-4000:]}"
    history = project.run("-m", "pytest_tfmem.cli.main", "history", "memory-history.jsonl")
    assert "without a step or creep" in history.stdout and "step +" not in history.stdout, history.stdout
    project.commit(6, ROWS * 3 // 2)  # the batch grows by half
    gated, compared = project.pull_request(seed=6)
    failed = [line for line in gated.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and failed[0].startswith("FAILED test_batch.py::test_batch - tfmem: peak "), gated.stdout
    assert "vs baseline" in failed[0] and "memory history" in gated.stdout
    assert compared.returncode == 1 and "test_batch.py::test_batch" in compared.stdout
