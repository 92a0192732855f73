"""pytest-rerunfailures' attempts: a failed test run again (``--reruns N``, ``@pytest.mark.flaky``).

Every attempt of a test is logged with reports of its own: those of an attempt that is retried
have the outcome ``rerun``, and each report says how many attempts came before it
(``report.rerun``, pytest-rerunfailures' attribute). tfmem keeps one record per test, the last
attempt's, with that count (``core.record_store``), and re-runs a test's body after a memory failure
(``core.rerun``: for a trace, an explanation) on its first memory failure only (``FirstReruns``).
"""

from __future__ import annotations

from typing import Any

import pytest


def attempts_before(report: pytest.TestReport) -> int:
    """How many attempts of the test came before the one ``report`` is of (0 without reruns)."""
    count = getattr(report, "rerun", 0)
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


class FirstReruns:
    """What tfmem's re-run after a memory failure added to each test's record, by node id.

    A later attempt that fails a memory check again is not re-run (its trace, its explanation
    would be the first one's over again): its record gets what the first re-run gave.
    """

    def __init__(self) -> None:
        self._added: dict[str, dict[str, Any]] = {}

    def earlier(self, nodeid: str) -> dict[str, Any] | None:
        """What the test's first re-run added to its record's ``extra``, or ``None`` if it had none."""
        return self._added.get(nodeid)

    def remember(self, nodeid: str, before: dict[str, Any], after: dict[str, Any]) -> None:
        """The re-run turned the record's ``extra`` from ``before`` into ``after``."""
        self._added[nodeid] = {key: value for key, value in after.items() if key not in before}
