"""Six tests that each keep 80 MiB, beside a module fixture of 100 MiB: run with
``--tfmem-session-limit=260MiB``, two tests a process (docs/session.md, tests/test_session_limit.py).
"""

import numpy as np
import pytest

KEPT = []


@pytest.fixture(scope="module")
def table():
    return np.ones(100 * 2**20, dtype=np.uint8)  # filled: resident, anonymous


@pytest.mark.parametrize("n", range(6))
def test_grows(table, n):
    KEPT.append(np.ones(80 * 2**20, dtype=np.uint8))
