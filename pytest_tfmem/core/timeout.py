"""Tests stopped by pytest-timeout's signal method keep the figures measured until the stop.

pytest-timeout's ``signal`` method calls ``pytest.fail("Timeout (>Ns) from pytest-timeout.")``
from its SIGALRM handler, inside the test's call: the measurement window closes as for any
failure, so the record holds the test's memory up to that point. Its ``thread`` method ends the
process (``os._exit``) instead: only the results journal's last reading is left (``tfmem last``).
"""

from __future__ import annotations

import re

import pytest

_TIMEOUT_MESSAGE = re.compile(r"^Timeout \(>(?P<seconds>[^)]+)s\) from pytest-timeout")


def timeout_note(error: BaseException | None) -> str | None:
    """What the test's section says when pytest-timeout stopped it; ``None`` otherwise."""
    if not isinstance(error, pytest.fail.Exception):
        return None
    found = _TIMEOUT_MESSAGE.match(str(error.msg))
    if found is None:
        return None
    return (
        f"stopped by pytest-timeout after {found['seconds']} s: the figures are the test's until then, "
        "not what it would have needed to finish; not re-run"
    )
