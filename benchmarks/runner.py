"""Run one workload under one contender as a real pytest process and collect what it recorded.

Workloads run from a scratch directory holding a copy of ``benchmarks/workloads`` and an
empty ``pytest.ini``, so this repository's own pytest settings (``addopts``, ``testpaths``)
do not leak into the measurements. ``bench_plugin`` writes one JSON line per test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.bench_plugin import CONTENDER_ENV, RESULTS_ENV
from benchmarks.contenders import Contender

REPOSITORY = Path(__file__).resolve().parent.parent
WORKLOADS = Path(__file__).resolve().parent / "workloads"
# Only the plugins a contender names with -p are loaded; TensorFlow's start-up logging is off.
WORKLOAD_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}


@dataclass(frozen=True)
class Job:
    """One pytest process: a workload file, a contender, and what varies (selection, sizes)."""

    section: str
    workload: str
    contender: Contender
    variant: str = ""
    select: tuple[str, ...] = ()  # extra pytest arguments, e.g. ("-k", "test_numpy_arrays")
    sizes: tuple[tuple[str, str], ...] = ()  # TFMEM_BENCH_RUNS / TFMEM_BENCH_TESTS

    def describe(self) -> str:
        variant = f" ({self.variant})" if self.variant else ""
        return f"{self.section}: {self.workload}{variant} / {self.contender.label}"


@dataclass
class JobResult:
    job: Job
    tests: list[dict[str, Any]] = field(default_factory=list)  # bench_plugin's lines
    wall_s: float = 0.0  # the whole pytest process


class WorkloadError(RuntimeError):
    """A workload process failed in a way no contender's verdict explains."""


class Runner:
    def __init__(self) -> None:
        self._scratch = Path(tempfile.mkdtemp(prefix="tfmem-bench-"))
        shutil.copytree(WORKLOADS, self._scratch, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        (self._scratch / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")

    def close(self) -> None:
        shutil.rmtree(self._scratch, ignore_errors=True)

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPOSITORY), env.get("PYTHONPATH")]))
        env.update(WORKLOAD_ENV)
        env.update(extra)
        return env

    def run(self, job: Job) -> JobResult:
        results = self._scratch / "results.jsonl"
        results.unlink(missing_ok=True)
        command = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "benchmarks.bench_plugin",
            *job.contender.pytest_args, job.workload, *job.select,
        ]
        env = self._env({RESULTS_ENV: str(results), CONTENDER_ENV: job.contender.key, **dict(job.contender.env),
                         **dict(job.sizes)})
        started = time.perf_counter()
        completed = subprocess.run(command, cwd=self._scratch, env=env, capture_output=True, text=True, check=False)
        wall_s = time.perf_counter() - started
        if completed.returncode not in (0, 1):  # 1: some tests failed, as leak checks should
            raise WorkloadError(f"{job.describe()}: pytest exited {completed.returncode}\n{_tail(completed)}")
        lines = results.read_text(encoding="utf-8").splitlines() if results.exists() else []
        tests = [json.loads(line) for line in lines]
        return JobResult(job, tests, wall_s)

    def reference_peak(self, workload: str, test_name: str) -> int:
        """The test's peak alone in a fresh interpreter (``benchmarks/reference.py``)."""
        command = [sys.executable, "-m", "benchmarks.reference", workload, test_name]
        completed = subprocess.run(
            command, cwd=self._scratch, env=self._env({}), capture_output=True, text=True, check=False
        )
        if completed.returncode != 0:
            raise WorkloadError(f"reference peak of {workload}::{test_name} failed\n{_tail(completed)}")
        return int(json.loads(completed.stdout.strip().splitlines()[-1])["peak"])


def _tail(completed: subprocess.CompletedProcess[str], lines: int = 25) -> str:
    return "\n".join((completed.stdout + completed.stderr).splitlines()[-lines:])
