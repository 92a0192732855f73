"""Pay TensorFlow's and Keras's one-time costs before anything is measured.

The first ``fit`` in a process loads Keras's training machinery (~45 MB here); without a
warm-up, whichever scenario trains first would be charged for it. pytest-tfmem pays the first use
of Keras in the session's processes itself (docs/measurement.md, "First use is not charged"), not
in an isolated test's process nor in ``find_max_batch_size``'s trials: there this does.
"""

from __future__ import annotations

import warnings

import numpy as np


def warm_up_keras() -> None:
    """Import TensorFlow, start its runtime and train a tiny model once (its warnings are no
    scenario's: they are not shown)."""
    import tensorflow as tf

    from pytest_tfmem.frameworks.tensorflow import TensorFlow

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        TensorFlow().start_runtime()
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(np.zeros((8, 4), "float32"), np.zeros((8, 2), "float32"), verbose=0)
        model.predict(np.zeros((8, 4), "float32"), verbose=0)
        tf.keras.backend.clear_session()
