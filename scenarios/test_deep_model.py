"""Scenario 2: a deep model's training and inference memory, and what lowers it on a CPU."""

from __future__ import annotations

import importlib.util
import os

import pytest

from pytest_tfmem import BudgetExceeded
from pytest_tfmem.units import parse_size

from . import deep_model, keras_3, scale

pytestmark = [pytest.mark.scenario("2. deep model: training"), pytest.mark.usefixtures("keras")]
# Measured at scale 1 (host and TF memory held at once counted together, so the same in any
# order): float32 + Adam ~250-260 MB, mixed precision ~310-330 MB; bfloat16 weights ~180-190 MB,
# the other fixes 60-110 MB.
TRAINING_BUDGET = f"{210 * scale()}MB"
# Keras float32 model loaded + one batch ~75-105 MB; int8 TensorFlow Lite ~32 MB.
INFERENCE_BUDGET = f"{50 * scale()}MB"
no_saving = pytest.mark.xfail(strict=True, raises=BudgetExceeded, reason="no memory saved on CPU")
# On TensorFlow 2.21 a fitted model's weights and optimizer state stay allocated after the test
# (scenario 4 measures it): the biggest variants run in their own process so the suite's stays small.
# A fresh process also pays first-use costs that a warmed-up one does not: ~35-50 MB more.
isolated = pytest.mark.tfmem(isolate=True, budget=TRAINING_BUDGET)
PRUNING_PACKAGES = ("tensorflow_model_optimization", "tf_keras")


@pytest.mark.variant("problem", "float32 weights, Adam")
@isolated
@pytest.mark.xfail(strict=True, raises=BudgetExceeded, reason="weights + gradients + 2 Adam slots")
def test_problem_float32_adam():
    deep_model.problem_float32_adam()


@pytest.mark.variant("fix", "a third of the width (1/9 of the parameters)")
@pytest.mark.tfmem(budget=TRAINING_BUDGET)
def test_fix_fewer_parameters():
    deep_model.fix_fewer_parameters()


@pytest.mark.variant("fix", "bfloat16 weights (less precision)")
@pytest.mark.tfmem(budget=TRAINING_BUDGET)
def test_fix_bfloat16_weights():
    deep_model.fix_bfloat16_weights()


@pytest.mark.variant("fix", "SGD: no per-weight optimizer state")
@pytest.mark.tfmem(budget=TRAINING_BUDGET)
@pytest.mark.skipif(not keras_3(), reason="Keras 3 only: with tf-keras an SGD step peaks at ~180-190 MiB, "
                    "within 10% of the budget (Adam ~235 MiB): the saving is measured with Keras 3")
def test_fix_stateless_optimizer():
    deep_model.fix_stateless_optimizer()


@pytest.fixture
def pruning(keras, tmp_path) -> deep_model.SavedSize:
    """tensorflow-model-optimization with tf-keras, warmed up as Keras is (set-up is not charged);
    returns the size of the dense model's file, for comparison."""
    try:
        deep_model.pruning_api()
    except ImportError as error:
        pytest.skip(f"pruning needs tensorflow-model-optimization and tf-keras (Keras 2): {error}")
    deep_model.warm_up_pruning(tmp_path)
    return deep_model.save_dense(tmp_path / "dense.h5")


@pytest.mark.variant("measured", f"pruning wrappers, {deep_model.PRUNED_SPARSITY:.0%} sparsity (tf-keras)")
@pytest.mark.tfmem(isolate=True)
@pytest.mark.skipif(any(importlib.util.find_spec(name) is None for name in PRUNING_PACKAGES),
                    reason="pruning needs tensorflow-model-optimization and tf-keras (Keras 2)")
@pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file:UserWarning")
def test_measured_pruning_wrappers(tfmem, measured_variant, pruning, tmp_path):
    """Isolated, like the problem it stands beside; a fix or no help as its numbers say."""
    pruned = deep_model.train_pruned()
    training_peak = tfmem.peak()
    stripped = deep_model.strip_pruning(pruned)
    size = deep_model.saved_size(tmp_path / "pruned.h5", stripped)
    role, reason, note = deep_model.pruning_advice(training_peak, parse_size(TRAINING_BUDGET), size, pruning)
    measured_variant.decide(role, reason)
    measured_variant.note(note)
    assert deep_model.zero_share(stripped) == pytest.approx(deep_model.PRUNED_SPARSITY, abs=0.01)


def test_pruning_advice_follows_the_numbers():
    budget, mib = parse_size(TRAINING_BUDGET), 2**20
    dense = deep_model.SavedSize(plain=50 * mib, compressed=47 * mib)
    over = deep_model.pruning_advice(budget + 1, budget, deep_model.SavedSize(50 * mib, 28 * mib), dense)
    assert over[:2] == ("no help", "over budget")
    assert over[2].endswith("(0.60x the dense file's gzip): smaller only compressed (to ship); as large on disk")
    under = deep_model.pruning_advice(budget, budget, deep_model.SavedSize(20 * mib, 18 * mib), dense)
    assert under[:2] == ("fix", "under budget") and under[2].endswith(": smaller on disk and compressed")
    same = deep_model.pruning_advice(budget, budget, deep_model.SavedSize(50 * mib, 46 * mib), dense)
    assert same[2].endswith(": no smaller, even compressed")


@pytest.mark.skipif(any(importlib.util.find_spec(name) is None for name in PRUNING_PACKAGES),
                    reason="pruning needs tensorflow-model-optimization and tf-keras (Keras 2)")
def test_pruning_api_keeps_the_keras_of_this_process_and_of_its_children(monkeypatch: pytest.MonkeyPatch):
    import tensorflow as tf

    monkeypatch.delenv(deep_model.LEGACY_KERAS_VARIABLE, raising=False)
    was_keras_3 = keras_3()
    pruning, keras = deep_model.pruning_api()
    assert deep_model.LEGACY_KERAS_VARIABLE not in os.environ  # importing tfmot set it to 1
    assert keras_3() == was_keras_3
    assert keras.__name__.startswith("tf_keras") or keras is tf.keras
    assert callable(pruning.prune_low_magnitude)


@pytest.mark.variant("no help", "mixed_float16 (keeps float32 weights)")
@isolated
@no_saving
def test_no_help_mixed_float16():
    deep_model.no_help_mixed_float16()


@pytest.mark.variant("no help", "mixed_bfloat16 (keeps float32 weights)")
@isolated
@no_saving
def test_no_help_mixed_bfloat16():
    deep_model.no_help_mixed_bfloat16()


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory):
    return deep_model.save_for_inference(tmp_path_factory.mktemp("deep_model"))


@pytest.mark.scenario("2. deep model: inference")
@pytest.mark.variant("problem", "float32 Keras model, predict")
@pytest.mark.tfmem(budget=INFERENCE_BUDGET)
@pytest.mark.xfail(strict=True, raises=BudgetExceeded, reason="float32 weights and Keras's predict machinery")
def test_problem_float32_inference(saved_model):
    deep_model.problem_float32_inference(saved_model[0])


@pytest.mark.scenario("2. deep model: inference")
@pytest.mark.variant("fix", "int8 TensorFlow Lite (post-training quantization)")
@pytest.mark.tfmem(budget=INFERENCE_BUDGET)
@pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated:UserWarning")
def test_fix_quantized_inference(saved_model):
    deep_model.fix_quantized_inference(saved_model[1])
