"""Scenario 2: a deep model's training and inference memory, and what lowers it on a CPU."""

from __future__ import annotations

import pytest

from pytest_tfmem import BudgetExceeded

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
