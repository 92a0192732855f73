"""Order workload (TensorFlow): the measured test alone, or after a heavier TF test.

TensorFlow's allocator pools freed memory and never returns it, so a TF test that follows
a heavier one is served from the pool without raising RSS.
"""

import tensorflow as tf

TENSOR_ELEMENTS = 2_500_000  # 10 MB of float32


def allocate_tensors(total_bytes):
    tensors = [tf.ones((TENSOR_ELEMENTS,)) for _ in range(total_bytes // (4 * TENSOR_ELEMENTS))]
    del tensors


def test_heavier():
    allocate_tensors(600 * 10**6)


def test_tf_tensors():
    allocate_tensors(300 * 10**6)
