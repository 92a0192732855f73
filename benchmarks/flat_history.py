"""A memory history of unchanged code, shuffled at every commit, and then one real step.

    python -m benchmarks.flat_history [--commits 10] [--output docs/history.md] [--keep HISTORY]

In a fresh git repository: ``benchmarks/workloads/small_keras.py`` (small Keras tests on
TensorFlow), Keras's own ``dense_test``, ``embedding_test``, ``sequential_test``,
``functional_test`` and ``early_stopping_test`` (copied from the installed Keras) and
``test_batch.py`` (a test that holds one batch of data, 40 MiB) are committed ``--commits`` times
with no change to the code, each commit measured once with ``--tfmem-history`` in a random order
(pytest-randomly, one seed a commit) and with the gate the docs suggest
(``--tfmem-history-gate=25%``). Then the batch grows by half (a real +50% step in one
test) and two more commits are measured the same way. Printed: what ``tfmem history`` names over
the flat commits and over them all, and each session's gate verdicts. ``--keep`` copies the
history written (``tests/data/flat-history.jsonl`` is one, which ``tests/test_history_robust.py``
reads: the gate and the steps on real figures of unchanged code).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import machine
from benchmarks.order_spread import KERAS_OWN, KERAS_TESTS

WORKLOAD = Path(__file__).resolve().parent / "workloads" / "small_keras.py"
# Keras's own modules are copied into the repository by these names, so that their node ids are its own
KERAS_MODULES = [Path(module).name for module in KERAS_OWN]
GATE = "25%"
BATCH = '''import numpy as np

ROWS = {rows}


def test_batch():
    batch = np.ones((ROWS, 1024), dtype=np.float64)  # ROWS x 8 KiB
    assert batch.sum() == ROWS * 1024
'''
ROWS = 5120  # 40 MiB
ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore", "KERAS_BACKEND": "tensorflow",
               "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com",
               "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.com"}


def git(directory: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=directory, check=True, capture_output=True, env={**os.environ, **ENVIRONMENT})


def commit(directory: Path, number: int, rows: int) -> None:
    (directory / "test_batch.py").write_text(BATCH.format(rows=rows))
    (directory / "COMMIT").write_text(f"{number}\n")  # the code stays as it is
    git(directory, "add", "-A")
    git(directory, "commit", "-q", "-m", f"commit {number}", "--date", f"2026-12-01T00:{number:02d}:00+00:00")


def measure(directory: Path, seed: int, history: Path) -> tuple[int, list[str]]:
    """One session; its exit code and its gate's failure lines."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "small_keras.py", *KERAS_MODULES, "test_batch.py", "-p", "no:cacheprovider",
         f"--randomly-seed={seed}", f"--tfmem-history={history}", f"--tfmem-history-gate={GATE}", "-q"],
        cwd=directory, capture_output=True, text=True, env={**os.environ, **ENVIRONMENT}, timeout=900,
    )
    failures = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    return done.returncode, failures


def history_lines(history: Path, *extra: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", "history", str(history), *extra],
                          capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=10, help="flat commits before the step (default 10)")
    parser.add_argument("--output", type=Path, help="write the result between this script's markers in the page")
    parser.add_argument("--keep", type=Path, help="copy the history written here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfmem-flat-") as scratch:
        directory = Path(scratch)
        shutil.copy(WORKLOAD, directory / WORKLOAD.name)
        for module, name in zip(KERAS_OWN, KERAS_MODULES):
            shutil.copy(KERAS_TESTS / module, directory / name)
        (directory / "pytest.ini").write_text("[pytest]\n")
        history = directory / "memory-history.jsonl"
        git(directory, "init", "-q")
        sessions = []
        for number in range(1, args.commits + 3):
            rows = ROWS if number <= args.commits else ROWS * 3 // 2
            commit(directory, number, rows)
            code, failures = measure(directory, number, history)
            sessions.append((number, rows != ROWS, code, failures))
            print(f"commit {number}: exit {code}, {len(failures)} gate failure(s)", flush=True)
        flat = directory / "flat.jsonl"
        flat.write_text("".join(history.read_text().splitlines(keepends=True)[: args.commits]))
        flat_lines = history_lines(flat)
        all_lines = history_lines(history)
        if args.keep is not None:
            shutil.copy(history, args.keep)
    minutes = (time.perf_counter() - started) / 60
    lines = [
        machine.written_by("-m benchmarks.flat_history", argv) + f"; took {minutes:.1f} min.",
        "",
        f"{args.commits} commits of unchanged code (`small_keras.py` on TensorFlow, Keras's own "
        f"{', '.join(f'`{name}`' for name in KERAS_MODULES)}, and `test_batch.py`, which holds a 40 MiB batch), "
        f"each measured once in its own random order, with `--tfmem-history-gate={GATE}`; "
        "then the batch grows by half in two more commits. Each session's gate:",
        "",
        "| commit | code | exit | gate failures |",
        "|---|---|---|---|",
        *[f"| {number} | {'batch +50%' if stepped else 'unchanged'} | {code} | "
          f"{'; '.join(failure.removeprefix('FAILED ') for failure in failures) or '-'} |"
          for number, stepped, code, failures in sessions],
        "",
        f"`tfmem history` over the {args.commits} unchanged commits:",
        "",
        "```",
        *flat_lines,
        "```",
        "",
        "and over all of them:",
        "",
        "```",
        *all_lines,
        "```",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    print(json.dumps({"flat_quiet": not any(line.startswith("    ") for line in flat_lines)}))
    if args.output is not None:
        machine.write_section(args.output, "benchmarks/flat_history.py", text, "A flat history")
    return 0


if __name__ == "__main__":
    sys.exit(main())
