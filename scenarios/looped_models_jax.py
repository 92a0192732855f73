"""Scenario 4 on Keras's JAX backend: a hyperparameter search whose models differ in shape.

JAX compiles each model that lowers to new code and keeps what it compiled until
``jax.clear_caches()``; Keras's ``clear_session()`` frees the models but not that. The backend is
chosen before Keras is imported, so each variant runs as a process of its own:
``python -m scenarios.looped_models_jax VARIANT`` runs a leak check over the variant's loop
and prints its report as JSON (``tfmem`` measures the process it started).
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import sys
from collections.abc import Callable

os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from pytest_tfmem import leak_check  # noqa: E402

SAMPLES = 64
LEAK_CHECK = {"iterations": 4, "warmup": 2, "max_growth": "2MB"}  # the problem grows ~4.6 MiB per iteration
_widths = itertools.count(8)  # each iteration a new width: a new shape, new code to compile


def _fit(width: int) -> keras.Model:
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(16, "relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((SAMPLES, width), "float32"), np.ones((SAMPLES, 1), "float32"), epochs=1, verbose=0)
    return model


def problem_new_shapes() -> None:
    _fit(next(_widths))


def no_help_clear_session() -> None:
    _fit(next(_widths))
    keras.backend.clear_session()
    gc.collect()


def fix_clear_caches() -> None:
    _fit(next(_widths))
    keras.backend.clear_session()
    jax.clear_caches()
    gc.collect()


_reused: list[keras.Model] = []


def fix_one_model() -> None:
    """The widths padded to the largest one: one model, compiled once, trained again."""
    if not _reused:
        _reused.append(_fit(64))
    width = next(_widths)
    features = np.zeros((SAMPLES, 64), "float32")
    features[:, :width] = 1.0
    _reused[0].fit(features, np.ones((SAMPLES, 1), "float32"), epochs=1, verbose=0)


VARIANTS: dict[str, Callable[[], None]] = {
    "problem_new_shapes": problem_new_shapes,
    "no_help_clear_session": no_help_clear_session,
    "fix_clear_caches": fix_clear_caches,
    "fix_one_model": fix_one_model,
}


def main(variant: str) -> None:
    report = leak_check(VARIANTS[variant], **LEAK_CHECK)  # type: ignore[arg-type]
    print(json.dumps({
        "leaked": report.leaked,
        "per_iteration": report.growth_per_iteration,
        "holders": [growth.label for growth in report.diagnosis.holders],
        "description": report.describe(),
    }))


if __name__ == "__main__":
    main(sys.argv[1])
