"""Scenario 4: models built in a loop; the leak check says what grows, and which loop is flat."""

from __future__ import annotations

import pytest

from pytest_tfmem import LeakDetected
from pytest_tfmem.leaks.check import LeakReport, raise_if_leaked

from . import keras_3, looped_models

pytestmark = [pytest.mark.scenario("4. looped models"), pytest.mark.usefixtures("keras")]
# Measured: the leaking loops grow 1.1-7.4 MiB per iteration, the flat ones under 50 KiB.
LEAK_CHECK = {"iterations": 5, "warmup": 2, "max_growth": "256KB"}
leaks = pytest.mark.xfail(strict=True, raises=LeakDetected, reason="memory grows every iteration")


def growing_types(report: LeakReport) -> set[str]:
    return {growth.label.rsplit(".", 1)[-1] for growth in report.diagnosis.types}


def traced_functions_per_iteration(report: LeakReport) -> float:
    library = report.diagnosis.function_library
    return library.per_iteration if library is not None else 0.0


def fit_leaves_traces(report: LeakReport) -> bool:
    """What each model's ``fit`` leaves behind: Keras 3 adds functions to TensorFlow's function
    library (16 per model here); tf-keras (Keras 2) leaves the library alone and keeps a graph
    per model instead, seen as growing ``FuncGraph`` objects."""
    if keras_3():
        return traced_functions_per_iteration(report) >= 8
    return "FuncGraph" in growing_types(report)


@pytest.mark.variant("problem", "no cleanup")
@leaks
def test_problem_no_cleanup(tfmem):
    report = tfmem.leak_check(looped_models.problem_no_cleanup, **LEAK_CHECK)
    assert fit_leaves_traces(report), report.describe()
    raise_if_leaked(report)


@pytest.mark.variant("problem", "models.append(model), then del model")
@leaks
def test_problem_models_kept_in_a_list(tfmem):
    models: list = []
    report = tfmem.leak_check(lambda: looped_models.problem_models_kept_in_a_list(models), **LEAK_CHECK)
    assert {"Sequential", "Dense"} <= growing_types(report), report.describe()  # the models themselves
    raise_if_leaked(report)


@pytest.mark.variant("no help", "del + clear_session() + gc.collect()")
@leaks
def test_no_help_clear_session(tfmem):
    report = tfmem.leak_check(looped_models.no_help_clear_session, **LEAK_CHECK)
    assert "Sequential" not in growing_types(report), report.describe()  # the models are freed ...
    assert fit_leaves_traces(report), report.describe()  # ... what fit traced is not
    raise_if_leaked(report)


@pytest.mark.variant("fix", "fit eagerly (run_eagerly=True) + clear_session()")
def test_fix_fit_eagerly(tfmem):
    tfmem.assert_no_leak(looped_models.fix_fit_eagerly, **LEAK_CHECK)


@pytest.mark.variant("fix", "one compiled model, weights reset each iteration")
def test_fix_reuse_one_model(tfmem):
    tfmem.assert_no_leak(looped_models.ReusedModel().fix_reuse_one_model, **LEAK_CHECK)


def test_clear_session_frees_the_model_but_not_its_fitted_variables():
    try:
        left = looped_models.left_allocated_after_fit()
    except ValueError as error:  # no CPU allocator statistics (oneDNN off)
        pytest.skip(f"TensorFlow's CPU allocator keeps no statistics here: {error}")
    assert left.model_collected
    assert 0.9 * left.training_state <= left.still_allocated <= 1.5 * left.training_state, left
