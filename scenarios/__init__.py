"""The classic TensorFlow/Keras memory failures, each with a problem and a fix variant.

Every scenario module exposes its variants as plain functions with a size parameter, so they
run outside pytest too; its ``test_*`` module states the plugin's verdict on each variant.
Sizes are small by default; ``TFMEM_SCENARIO_SCALE=4 pytest scenarios`` makes the
size-dependent ones four times larger: the large dataset's and the big batch's problems grow
while their fixes stay flat; the deep model grows as a whole, fixes included (its parameter
count follows the scale), and so do its budgets.

The budgets are measured with Keras 3. Under Keras 2 (``TF_USE_LEGACY_KERAS=1`` with tf-keras)
the scenarios run too; the few claims that hold only for Keras 3 skip there, saying why.
"""

from __future__ import annotations

import os

SCALE_VARIABLE = "TFMEM_SCENARIO_SCALE"


def keras_3() -> bool:
    """Whether ``tf.keras`` is Keras 3 here, rather than tf-keras (Keras 2)."""
    import tensorflow as tf

    return str(getattr(tf.keras, "__version__", "")).startswith("3.")


def scale() -> float:
    """The size factor from ``$TFMEM_SCENARIO_SCALE`` (default 1)."""
    raw = os.environ.get(SCALE_VARIABLE, "1")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= 100:
        raise ValueError(f"invalid {SCALE_VARIABLE} {raw!r}: expected a number above 0 and at most 100, e.g. 1 or 2.5")
    return value
