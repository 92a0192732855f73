"""Scenario 5, "Killed": a job whose memory keeps growing until the machine runs out.

Without help the kernel's OOM killer ends it, and pytest with it, with a bare ``Killed``: no
test name, no numbers, no results. Run isolated with a ``kill_at`` limit, tfmem's watchdog
stops the job's own process first and reports it as an ordinary failed test with the memory
timeline; the session goes on. The fix keeps one chunk at a time in memory.
"""

from __future__ import annotations

import time

import numpy as np

MB = 10**6
TOTAL = 2000 * MB  # what the job would hold at the end: more than its kill_at
CHUNK = 50 * MB
WORK_S = 0.05  # per chunk: the watchdog reads every 20 ms, so it sees each chunk at least twice


def problem_hold_everything(total: int = TOTAL, chunk: int = CHUNK) -> float:
    """Read the data chunk by chunk, keeping every chunk: memory grows to ``total``."""
    chunks = []
    for _ in range(total // chunk):
        chunks.append(np.ones(chunk, dtype=np.uint8))  # every page touched
        time.sleep(WORK_S)  # a job does some work per chunk (and the watchdog gets to look)
    return float(sum(int(c[::4096].sum()) for c in chunks))


def fix_one_chunk_at_a_time(total: int = TOTAL, chunk: int = CHUNK) -> float:
    """Reduce each chunk as it comes and drop it: memory stays at one chunk."""
    result = 0.0
    for _ in range(total // chunk):
        block = np.ones(chunk, dtype=np.uint8)
        result += int(block[::4096].sum())
        del block
        time.sleep(WORK_S)
    return result
