"""A batch step whose module maps a file into memory as it is imported (``MAPPED_STEP_FILE``):
in ``find_max_batch_size``'s trial server, file pages that each trial's fork maps again."""

from __future__ import annotations

import mmap
import os

import numpy as np

MiB = 2**20

if os.environ.get("MAPPED_STEP_FILE"):
    with open(os.environ["MAPPED_STEP_FILE"], "rb") as file:
        MAPPED = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    TOUCHED = sum(MAPPED[offset] for offset in range(0, len(MAPPED), mmap.PAGESIZE))  # every page resident


def one_mib_per_sample(batch_size: int) -> None:
    block = np.ones(batch_size * MiB, dtype=np.uint8)  # every page touched
    del block
