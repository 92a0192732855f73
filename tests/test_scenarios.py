"""The scenario suite guards itself: a broken fix or a problem that is no longer caught fails it.

Each test copies ``scenarios/`` into a temporary directory, breaks one thing in the copy the way
a user's change would, and runs pytest on it in a fresh interpreter. The inner runs inherit
``TF_USE_LEGACY_KERAS``: under Keras 2 (tf-keras) the expectations are Keras 2's.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
NO_CACHE = ("-p", "no:cacheprovider", "--tfmem-trace=off")
# TensorFlow's own reading of the variable: tf.keras is then tf-keras in the inner runs.
KERAS_2 = os.environ.get("TF_USE_LEGACY_KERAS") in ("true", "True", "1")
JAX = importlib.util.find_spec("jax") is not None
PRUNING = all(importlib.util.find_spec(name) is not None for name in ("tensorflow_model_optimization", "tf_keras"))
MiB = 2**20


def copy_scenarios(pytester: pytest.Pytester) -> Path:
    target = pytester.path / "scenarios"
    shutil.copytree(SCENARIOS, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def edit(path: Path, old: str, new: str) -> None:
    """Replace the one occurrence of ``old``: fails loudly if the scenario changed shape."""
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name} no longer contains exactly one {old!r}"
    path.write_text(text.replace(old, new))


@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_a_fix_that_no_longer_streams_fails_the_suite(pytester: pytest.Pytester):
    copy = copy_scenarios(pytester)
    edit(copy / "large_dataset.py", "return train_one_epoch(streamed_dataset(directory, samples))",
         "return train_one_epoch(in_memory_dataset(directory, samples))")

    result = pytester.runpytest_subprocess("scenarios/test_large_dataset.py", "-k", "test_problem or test_fix",
                                          *NO_CACHE)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=1, xfailed=1)
    result.stdout.fnmatch_lines([
        "*tfmem scenarios: what was caught, and what fixed it*",
        "1. large dataset: caught * (over budget, *); fixed by streamed from shard files (from_generator) (FAILED: over budget, *)",
        "*each variant side by side*",
        "*",
        "1. large dataset",
        "  problem: numpy arrays + from_tensor_slices * caught: over budget",
        "  fix: streamed from shard files (from_generator) * FAILED: over budget",
    ])
    result.stdout.fnmatch_lines(["tfmem: peak * > budget 120MB (114.4 MiB) (host RSS *"])


@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_a_problem_that_is_no_longer_caught_fails_the_suite(pytester: pytest.Pytester):
    copy = copy_scenarios(pytester)
    edit(copy / "test_large_dataset.py", 'BUDGET = "120MB"', 'BUDGET = "4GB"')

    result = pytester.runpytest_subprocess("scenarios/test_large_dataset.py", "-k", "test_problem", *NO_CACHE)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "  problem: numpy arrays + from_tensor_slices * NOT CAUGHT",
    ])
    result.stdout.fnmatch_lines(["[[]XPASS(strict)[]] the whole dataset is in memory, twice"])


@pytest.mark.slow
@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_a_loop_fix_without_its_essential_line_fails_the_suite(pytester: pytest.Pytester):
    copy = copy_scenarios(pytester)
    edit(copy / "looped_models.py", "model = _build_and_fit(samples, run_eagerly=True)",
         "model = _build_and_fit(samples)")

    result = pytester.runpytest_subprocess("scenarios/test_looped_models.py", "-k", "fit_eagerly", *NO_CACHE)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "  fix: fit eagerly (run_eagerly=True) + clear_session() * FAILED: leak",
    ])
    # What each model's fit leaves behind: Keras 3 grows TensorFlow's function library; tf-keras
    # keeps a graph per model instead.
    diagnosis = "  growing types * FuncGraph*" if KERAS_2 else "  TF function library * +*"
    result.stdout.fnmatch_lines(["tfmem: leak: +* per iteration > max_growth 250.0 KiB *", diagnosis])


def test_a_bad_scale_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    copy_scenarios(pytester)
    monkeypatch.setenv("TFMEM_SCENARIO_SCALE", "huge")

    result = pytester.runpytest_subprocess("scenarios", "--collect-only", *NO_CACHE)

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*invalid TFMEM_SCENARIO_SCALE 'huge': expected a number above 0 and at most 100*"])


@pytest.mark.longest
@pytest.mark.slow
def test_the_scenario_suite_passes_a_4GB_budget_and_prints_all_five_scenarios(pytester: pytest.Pytester):
    copy_scenarios(pytester)

    # The README's first command: two pytest-xdist workers; the table keeps its order.
    result = pytester.runpytest_subprocess("scenarios", "-n", "2", "--tfmem-budget=4GB", "-rs", *NO_CACHE)

    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    # No TensorFlow log line among the progress dots: the suite sets TF_CPP_MIN_LOG_LEVEL (the
    # environment here has none of its own)
    assert "E0000" not in result.stderr.str() and "cuInit" not in result.stdout.str()
    # Pruning is a fix or no help as its numbers say: "fix: under budget" or "no help: over budget".
    pruning = ["*: pruning wrappers, 50% sparsity (tf-keras) * budget (isolated)"] if PRUNING else []
    # The JAX variants side by side among themselves: their peaks are whole processes they started.
    jax = ["4. looped models (Keras on JAX)", "*caught: leak", "*passed", "*no help: leak"] if JAX else []
    result.stdout.fnmatch_lines([
        # first, a line a scenario: what caught its problems, what its fixes needed
        "*tfmem scenarios: what was caught, and what fixed it*",
        "1. large dataset: caught numpy arrays + from_tensor_slices (over budget, * MiB); fixed by * (* MiB, 0.*x)",
        "2. deep model: inference: caught * (over budget, * MiB); fixed by *",
        "2. deep model: training: caught * (over budget (isolated), * MiB); fixed by *",
        "3. big batch: caught batch of 128 (over budget, * MiB); fixed by batch of 32 (* MiB, 0.*x)",
        "4. looped models: caught no cleanup (leak, +* MiB per iteration); caught *; fixed by *",
        "5. killed: caught * (killed at kill_at (isolated), * MiB); fixed by one 50 MB chunk at a time (isolated, * MiB, 0.*x)",
        "*each variant side by side*",
        "scenario / variant * peak * vs problem * leak/iter * outcome",
        "1. large dataset", "*caught: over budget", "*passed",
        "2. deep model: inference", "*caught: over budget", "*passed",
        "2. deep model: training", "*caught: over budget (isolated)",
        "  fix: a third of the width *passed", "  fix: bfloat16 weights *passed", *pruning,
        "  no help: mixed_float16 *no help: over budget (isolated)",
        "3. big batch", "*caught: over budget", "*passed",
        "4. looped models", "*caught: leak", "*passed", "*no help: leak", *jax,
        "5. killed", "*caught: killed at kill_at (isolated)", "*passed (isolated)",
    ])
    if PRUNING:
        result.stdout.fnmatch_lines([
            "2. deep model: training: pruning: training peak * MiB (*x the budget); stripped model saved * MiB"
            " (*x the dense model's file), gzip * MiB (*x the dense file's gzip): *",
        ])
    if KERAS_2:
        result.stdout.fnmatch_lines(["SKIPPED *test_deep_model.py:*: Keras 3 only: with tf-keras an SGD step *"])


# At each scale: the large dataset's and the big batch's problem and fix, and one deep-model fix.
SCALED = ("test_problem_whole_dataset_in_memory", "test_fix_streamed_from_files", "test_problem_big_batch",
          "test_fix_small_batch", "test_fix_bfloat16_weights")


@pytest.mark.slow
@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_at_twice_the_scale_the_problems_grow_the_fixes_stay_flat_and_the_deep_model_grows(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, run_subprocess_records
):
    copy_scenarios(pytester)
    peaks: dict[tuple[str, str], int] = {}
    for scale in ("1", "2"):
        monkeypatch.setenv("TFMEM_SCENARIO_SCALE", scale)
        result, records = run_subprocess_records(
            "scenarios/test_large_dataset.py", "scenarios/test_big_batch.py", "scenarios/test_deep_model.py",
            "-k", " or ".join(SCALED), "--tfmem-trace=off",
        )
        # Both scales: the problems are still caught by budgets that the fixes still meet.
        result.assert_outcomes(passed=3, xfailed=2)
        for name in SCALED:
            peaks[name, scale] = records[name].measurement.peak
    numbers = {f"{name} x{scale}": f"{peak / MiB:.1f} MiB" for (name, scale), peak in peaks.items()}

    def growth(name: str) -> int:
        return peaks[name, "2"] - peaks[name, "1"]

    for problem, fix in (("test_problem_whole_dataset_in_memory", "test_fix_streamed_from_files"),
                         ("test_problem_big_batch", "test_fix_small_batch")):
        assert peaks[problem, "2"] > 1.5 * peaks[problem, "1"], numbers
        assert growth(fix) < 0.25 * growth(problem), numbers
    # The deep model's width follows the square root of the scale: its parameters, and so its
    # fixes' peaks, follow the scale itself.
    assert peaks["test_fix_bfloat16_weights", "2"] > 1.5 * peaks["test_fix_bfloat16_weights", "1"], numbers
