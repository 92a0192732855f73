"""A test holding NumPy data and TensorFlow tensors at once reads the same figure whatever ran
before it, and about what it needs in a fresh interpreter.

Each order is a pytest session in a fresh interpreter, with TensorFlow's pooling CPU allocator
(oneDNN on, as ``conftest.py`` sets for the suite).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import forked_sessions
import pytest

MIB = 2**20
REPOSITORY = Path(__file__).resolve().parent.parent

MIXED = '''
import time

import numpy as np
import pytest
import tensorflow as tf

MIB = 2**20
TENSOR = 10 * MIB // 4  # float32 elements of a 10 MiB tensor


def make_tensors(mib):
    return [tf.ones((TENSOR,)) for _ in range(mib // 10)]


def test_heavier_tensorflow():
    tensors = make_tensors(600)
    assert len(tensors) == 60


def test_heavier_numpy():
    blocks = [np.ones(10 * MIB, dtype=np.uint8) for _ in range(60)]
    assert len(blocks) == 60


def test_mixed():
    data = np.ones(200 * MIB, dtype=np.uint8)  # held while the tensors are made
    tensors = make_tensors(200)
    time.sleep(0.1)  # both held for a while, as while a model trains: longer than the sampling interval
    assert int(data[-1]) == 1 and len(tensors) == 20


def test_freed_first():
    data = np.ones(200 * MIB, dtype=np.uint8)
    assert int(data.sum()) == 200 * MIB
    del data  # gone before any tensor is made: the test never needs both at once
    tensors = make_tensors(200)
    assert len(tensors) == 20
'''


@pytest.fixture(scope="module")
def mixed_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("mixed")
    (directory / "test_mixed_body.py").write_text(MIXED)
    return directory / "test_mixed_body.py"


def peaks(path: Path, *args: str) -> dict[str, float]:
    """Each measured test's peak in MiB, from one pytest session of its own."""
    report = path.parent / "report.json"
    forked_sessions.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--tfmem-budget=4GB",
         f"--tfmem-report={report}", "--tfmem-trace=off", str(path), *args],
        cwd=path.parent, check=True, timeout=600,
    )
    tests = json.loads(report.read_text())["tests"]
    return {test["nodeid"].split("::")[-1]: test["measurement"]["peak"] / MIB for test in tests}


def reference(path: Path, test: str) -> float:
    """The body alone in a fresh interpreter: its kernel high-water mark above the level after
    TensorFlow's runtime started (the benchmarks' yardstick)."""
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.reference", str(path), test],
        cwd=REPOSITORY, capture_output=True, text=True, check=True, timeout=600,
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])["peak"] / MIB


NEEDED = {"test_mixed": 400, "test_freed_first": 200}  # MiB each measured test's body needs
MEASURED = tuple(NEEDED)
# -k selects by the module's name too, and "test_mixed" is in it
BOTH = "(test_mixed and not heavier and not freed) or test_freed_first"


def orders(mixed_file: Path) -> dict[str, dict[str, float]]:
    """Each order's session, read for both measured tests: ``{order: {test: MiB}}``. In the
    first, ``test_mixed`` is the session's first test (TensorFlow's runtime starts in it) and
    ``test_freed_first`` follows it; in the others each comes after a heavier test."""
    return {
        "test_mixed first": peaks(mixed_file, "-k", BOTH),
        "after a heavier TensorFlow test": peaks(mixed_file, "-k", f"heavier_tensorflow or {BOTH}"),
        "after a heavier NumPy test": peaks(mixed_file, "-k", f"heavier_numpy or {BOTH}"),
        "under -n 2": peaks(mixed_file, "-n", "2"),
        "isolated, after a heavier TensorFlow test": peaks(mixed_file, "-k", f"heavier_tensorflow or {BOTH}",
                                                           "--tfmem-isolate"),
    }


@pytest.mark.linux  # malloc_trim hands freed heap back before each reading
@pytest.mark.slow
def test_each_figure_alone_after_heavier_tests_and_under_xdist(mixed_file: Path) -> None:
    """Both measured tests in one test: pytest-xdist could send two to different workers, and each
    worker would run the order sessions again."""
    runs = orders(mixed_file)
    for test, needed in NEEDED.items():
        figures = {order: peaks_of_order[test] for order, peaks_of_order in runs.items() if test in peaks_of_order}
        fresh = reference(mixed_file, test)
        assert abs(fresh - needed) <= 0.1 * needed, (test, fresh)  # the body needs what it says
        for order, figure in figures.items():
            assert abs(figure - fresh) <= 0.1 * fresh, (test, order, figures, fresh)
