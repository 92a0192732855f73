"""Scenario 3: peak grows with the batch size; a smaller batch fits; the finder says how small."""

from __future__ import annotations

import math

import pytest

from pytest_tfmem import BudgetExceeded, find_max_batch_size

from . import big_batch
from .warmup import warm_up_keras

pytestmark = [pytest.mark.scenario("3. big batch"), pytest.mark.usefixtures("keras")]
MB = 10**6
# Measured at scale 1: ~1.1 MB per image; batch 32 ~40-55 MB, batch 128 ~140-180 MB.
BUDGET = "100MB"


@pytest.mark.variant("problem", f"batch of {big_batch.PROBLEM_BATCH}")
@pytest.mark.tfmem(budget=BUDGET)
@pytest.mark.xfail(strict=True, raises=BudgetExceeded, reason="activations and their gradients per sample")
def test_problem_big_batch():
    big_batch.problem_big_batch()


@pytest.mark.variant("fix", f"batch of {big_batch.FIX_BATCH}")
@pytest.mark.tfmem(budget=BUDGET)
def test_fix_small_batch():
    big_batch.fix_small_batch()


def test_peak_grows_roughly_linearly_with_batch_size(tfmem):
    big_batch.train_step(16)  # this model's first-use costs, whatever ran before in this process
    # The lower of two steps each: TensorFlow's inter-op threads may run ops side by side and hold
    # more at once now and then (a step of 128 read 261 MB once, against 150-175 MB otherwise).
    peaks = {}
    for batch_size in (32, 64, 128):
        readings = []
        for _ in range(2):
            with tfmem.measure() as measured:
                big_batch.train_step(batch_size)
            readings.append(measured.peak)
        peaks[batch_size] = min(readings)
    first_slope = (peaks[64] - peaks[32]) / 32
    second_slope = (peaks[128] - peaks[64]) / 64
    numbers = {batch: f"{peak / MB:.0f} MB" for batch, peak in peaks.items()}
    assert first_slope > 0.5 * MB and second_slope > 0.5 * MB, numbers
    assert 0.5 < second_slope / first_slope < 2, numbers  # linear: 1; quadratic: 3


@pytest.mark.longest  # each trial a fresh interpreter that imports TensorFlow
def test_find_max_batch_size_lands_between_the_fix_and_the_problem():
    # from the fix's batch to the problem's, in steps of the fix's: two trials, each a fresh interpreter
    low, high = big_batch.FIX_BATCH, big_batch.PROBLEM_BATCH
    resolution = big_batch.FIX_BATCH
    report = find_max_batch_size(big_batch.train_step, BUDGET, low=low, high=high, resolution=resolution,
                                 setup=warm_up_keras)
    print(report)
    assert report.batch_size is not None, str(report)
    assert big_batch.FIX_BATCH <= report.batch_size < big_batch.PROBLEM_BATCH, str(report)
    assert len(report.trials) <= math.log2((high - low) / resolution) + 2, str(report)
