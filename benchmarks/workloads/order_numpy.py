"""Order workload (numpy heap): the measured test alone, or after a heavier test.

100 KB arrays live on glibc's heap; freed, they stay in its arenas unless trimmed, so a
test that follows a heavier one can reuse that memory without raising RSS.
"""

import numpy as np

ARRAY_BYTES = 10**5


def allocate_small_arrays(total_bytes):
    arrays = [np.ones(ARRAY_BYTES, dtype=np.uint8) for _ in range(total_bytes // ARRAY_BYTES)]
    del arrays


def test_heavier():
    allocate_small_arrays(600 * 10**6)


def test_numpy_arrays():
    allocate_small_arrays(300 * 10**6)
