"""Pay TensorFlow's and Keras's one-time costs before anything is measured.

The first ``fit`` in a process loads Keras's training machinery (~45 MB here); without a
warm-up, whichever scenario trains first would be charged for it.
"""

from __future__ import annotations

import numpy as np


def warm_up_keras() -> None:
    """Import TensorFlow, start its runtime and train a tiny model once."""
    import tensorflow as tf

    from pytest_tfmem.frameworks.tensorflow import TensorFlow

    TensorFlow().start_runtime()
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.zeros((8, 4), "float32"), np.zeros((8, 2), "float32"), verbose=0)
    model.predict(np.zeros((8, 4), "float32"), verbose=0)
    tf.keras.backend.clear_session()
