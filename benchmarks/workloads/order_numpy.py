"""Order workload (numpy heap): the measured test alone, or after a heavier test.

100 KB arrays live on glibc's heap. The heavier test keeps a small result (as a cache or
a log would), allocated above its arrays: glibc then cannot give the freed arrays back
from the top of the heap and keeps them in its free lists unless trimmed, so the test that
follows reuses that memory without raising RSS.
"""

import numpy as np

ARRAY_BYTES = 10**5
KEPT_RESULTS = []


def allocate_small_arrays(total_bytes, keep_result=False):
    arrays = [np.ones(ARRAY_BYTES, dtype=np.uint8) for _ in range(total_bytes // ARRAY_BYTES)]
    if keep_result:
        KEPT_RESULTS.append(bytearray(64 * 1024))
    del arrays


def test_heavier():
    allocate_small_arrays(600 * 10**6, keep_result=True)


def test_numpy_arrays():
    allocate_small_arrays(300 * 10**6)
