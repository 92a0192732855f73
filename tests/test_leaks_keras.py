"""Leak checks on real Keras loops (build, compile, fit), with Keras 3 and with tf-keras.

Each group of loops runs once, in a fresh interpreter, and the tests read its output and
records. ``pytest tests/test_leaks_keras.py -m "slow or not slow" -s`` prints what was
measured per loop (docs/leaks.md quotes it).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import forked_sessions
import pytest
from conftest import dump_records, dumped_records

from pytest_tfmem.core.record import TestRecord

LOOPS = """
import numpy as np
import pytest
import tensorflow as tf
import KERAS as keras

X = np.random.default_rng(0).random((64, 8), dtype=np.float32)
Y = np.random.default_rng(1).random((64, 1), dtype=np.float32)
CHECK = dict(iterations=4, warmup=2)  # max_growth: the default, 1 MB per iteration


def build_and_fit(run_eagerly=False, build_optimizer=False):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", run_eagerly=run_eagerly)
    if build_optimizer:  # its slot variables created now, eagerly, not inside the traced step
        model.optimizer.build(model.trainable_variables)
    model.fit(X, Y, epochs=1, batch_size=64, verbose=0)
    return model


def test_fit_no_cleanup(tfmem):
    tfmem.assert_no_leak(build_and_fit, **CHECK)


def test_fit_clear_session(tfmem):
    def step():
        model = build_and_fit()
        del model
        keras.backend.clear_session()

    tfmem.assert_no_leak(step, **CHECK)


def test_fit_optimizer_built_clear_session(tfmem):
    def step():
        model = build_and_fit(build_optimizer=True)
        del model
        keras.backend.clear_session()

    tfmem.leak_check(step, **CHECK)  # measured and recorded, not asserted: it grows near the threshold


def test_models_kept_in_a_list(tfmem):
    models = []

    def step():
        models.append(build_and_fit())
        for model in models:
            del model  # unbinds the loop variable; the list still holds every model

    tfmem.assert_no_leak(step, **CHECK)


def test_fit_eagerly_clear_session(tfmem):
    def step():
        model = build_and_fit(run_eagerly=True)
        del model
        keras.backend.clear_session()

    tfmem.assert_no_leak(step, **CHECK)
"""


@dataclass
class LoopRun:
    output: str
    records: dict[str, TestRecord]

    def failure(self, test: str) -> str:
        """The failure text of one test: from its heading to the next section."""
        match = re.search(rf"_+ {test} _+\n(.*?)\n-{{10,}}", self.output, re.S)
        assert match, f"no failure for {test} in:\n{self.output}"
        return match.group(1)

    def leak(self, test: str) -> dict:
        return self.records[test].extra["leak"]


def run_loops(directory: Path, keras_module: str, selection: str) -> LoopRun:
    """Run the loops with ``keras_module`` in a session of its own (pytester is function-scoped)."""
    (directory / "pytest.ini").write_text("[pytest]\n")
    (directory / f"test_{keras_module}_loops.py").write_text(LOOPS.replace("KERAS", keras_module))
    junit = directory / "junit.xml"
    completed = forked_sessions.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--tfmem-trace=off", f"--junitxml={junit}", *dump_records(directory),
         "-k", selection],
        cwd=directory, timeout=600, env={**os.environ, "COLUMNS": "250"},
    )
    run = LoopRun(completed.stdout + completed.stderr, dumped_records(directory))
    print_measured(keras_module, run)
    return run


def print_measured(keras_module: str, run: LoopRun) -> None:
    keras = f"{keras_module} {version(keras_module.replace('_', '-'))}, tensorflow {version('tensorflow')}"
    print(f"\n{keras}: build + compile(adam) + fit 1 epoch on 64 samples, 4 measured iterations after 2 warmup")
    for test, record in run.records.items():
        leak = record.extra["leak"]
        library = leak["diagnosis"]["function_library"]
        functions = f"{library['per_iteration']:+.0f} functions/iter" if library else "-"
        verdict = "leak" if leak["leaked"] else "no leak"
        print(f"  {test:40} {leak['growth_per_iteration'] / 2**20:+6.2f} MiB/iter  {functions:>18}  {verdict}")


def library_growth(failure: str) -> int:
    match = re.search(r"TF function library +\+(\d+) functions per iteration", failure)
    assert match, failure
    return int(match.group(1))


@pytest.fixture(scope="module")
def keras3(tmp_path_factory: pytest.TempPathFactory) -> LoopRun:
    return run_loops(tmp_path_factory.mktemp("keras3"), "keras", "not no_cleanup and not optimizer_built")


def test_fit_with_clear_session_still_grows_and_the_failure_names_the_function_library(keras3: LoopRun):
    failure = keras3.failure("test_fit_clear_session")
    assert re.match(r"tfmem: leak: \+[\d.]+ MiB per iteration > max_growth 976.6 KiB", failure), failure
    assert library_growth(failure) >= 8  # 16 here: Adam's slot-variable cond branches
    assert re.search(r"e\.g\. \+\d+ adam_\w+_cond_(true|false)", failure), failure
    assert "AtomicFunction" in failure  # the Python objects behind the library entries
    leak = keras3.leak("test_fit_clear_session")
    assert leak["leaked"] and leak["growth_per_iteration"] > 10**6
    assert leak["diagnosis"]["keras_names"] == []  # clear_session did reset Keras's name counters


def test_the_failure_says_how_to_make_the_loop_flat(keras3: LoopRun):
    failure = keras3.failure("test_fit_clear_session")
    advice = re.search(r"to make it flat +(.*)", failure).group(1)
    assert "keras.backend.clear_session() does not remove them" in advice
    assert "Flat: compile(run_eagerly=True), or one compiled model fitted in every iteration" in advice
    assert "docs/leaks.md" in advice


def test_the_readmes_leak_example_passes(tmp_path: Path):
    """The README's leak example, as printed there, passes on the loop it shows."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = readme.split("### Leak checks", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "test_readme_leak.py").write_text(block)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = forked_sessions.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--tfmem-trace=off"],
                               cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_models_kept_in_a_list_are_flagged_naming_the_model_and_layer_types(keras3: LoopRun):
    failure = keras3.failure("test_models_kept_in_a_list")
    types = re.search(r"growing types +(.*)", failure).group(1)
    assert re.match(r"\+1 Functional, \+1 Sequential, \+1 InputLayer, \+1 Adam, \+2 Dense, ", types), types
    assert "list 'models' (closure variable of test_models_kept_in_a_list.<locals>.step) holding Sequential" in failure
    assert re.search(r"Keras name counters +\+3 keras_tensor \(keras\), \+2 dense \(keras\)", failure), failure
    assert keras3.leak("test_models_kept_in_a_list")["growth_per_iteration"] > 2 * 10**6


def test_fit_eagerly_with_clear_session_is_flat(keras3: LoopRun):
    assert "FAILED test_keras_loops.py::test_fit_eagerly_clear_session" not in keras3.output
    assert "2 failed, 1 passed" in keras3.output
    leak = keras3.leak("test_fit_eagerly_clear_session")
    assert not leak["leaked"]
    assert abs(leak["growth_per_iteration"]) < 200 * 1024  # flat: ~0 here, against 3-4 MiB compiled
    library = leak["diagnosis"]["function_library"]
    assert library["per_iteration"] == 0 and leak["diagnosis"]["types"] == []


@pytest.mark.slow
def test_fit_without_cleanup_grows_the_library_and_keras_name_counters(tmp_path: Path):
    run = run_loops(tmp_path, "keras", "no_cleanup or optimizer_built")
    failure = run.failure("test_fit_no_cleanup")
    assert library_growth(failure) >= 8
    assert re.search(r"Keras name counters +\+3 keras_tensor \(keras\), \+2 dense \(keras\)", failure), failure
    assert run.leak("test_fit_no_cleanup")["growth_per_iteration"] > 10**6

    # Adam's slot variables built eagerly: the library stops growing, a graph per model stays.
    built = run.leak("test_fit_optimizer_built_clear_session")["diagnosis"]
    assert built["function_library"]["per_iteration"] == 0
    assert {"FuncGraph", "Graph"} <= {growth["label"] for growth in built["types"]}


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None, reason="tf-keras (Keras 2) is not installed")
def test_tf_keras_fit_with_clear_session_grows_and_eager_fit_is_flat(tmp_path: Path):
    run = run_loops(tmp_path, "tf_keras", "clear_session")
    failure = run.failure("test_fit_clear_session")
    assert run.leak("test_fit_clear_session")["growth_per_iteration"] > 10**6
    assert re.search(r"growing types +\+1 Graph, \+[\d.]+ FuncGraph", failure), failure  # a graph kept per model
    flat = run.leak("test_fit_eagerly_clear_session")
    assert not flat["leaked"] and abs(flat["growth_per_iteration"]) < 200 * 1024


LISTINGS_SCRIPT = """
import tensorflow as tf
from pytest_tfmem.frameworks import tensorflow as tensorflow_framework
from pytest_tfmem.leaks.diagnosis import GrowthTracker

tf.function(lambda x: x + 1)(tf.constant(1.0))  # the runtime started, a function in its library
listings = []
listing = tensorflow_framework.function_library_names
tensorflow_framework.function_library_names = lambda: listings.append(1) or listing()
tracker = GrowthTracker()
for _ in range(3):
    tracker.observe()
diagnosis = tracker.diagnosis()  # the library read as before: named, and not among the other holders
print("LISTINGS", len(listings), diagnosis.function_library.label,
      [growth.label for growth in diagnosis.holders].count(diagnosis.function_library.label))
"""


def test_a_leak_check_lists_tensorflows_function_library_once_per_iteration():
    """Its names give the kinds and traces; the holders' counts leave it out, not read it again.
    In a fresh interpreter: TensorFlow is not imported into a test process that ran others."""
    done = subprocess.run([sys.executable, "-c", LISTINGS_SCRIPT], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "LISTINGS 3 TF function library 0", done.stdout
