"""Order workload (NumPy data and TensorFlow tensors held at once): alone, or after a heavier
TF test.

After the heavier test, TensorFlow serves the tensors from its pool without raising RSS, so
host RSS sees only the NumPy data and the allocator only the tensors; the test needs both.
"""

import numpy as np
import tensorflow as tf

TENSOR_ELEMENTS = 2_500_000  # 10 MB of float32


def make_tensors(total_bytes):
    return [tf.ones((TENSOR_ELEMENTS,)) for _ in range(total_bytes // (4 * TENSOR_ELEMENTS))]


def test_heavier():
    tensors = make_tensors(600 * 10**6)
    del tensors


def test_mixed():
    data = np.ones(300 * 10**6, dtype=np.uint8)  # held while the tensors are made
    tensors = make_tensors(300 * 10**6)
    del tensors, data
