"""pytest-rerunfailures' attempts: a failed test run again (``--reruns N``, ``@pytest.mark.flaky``).

Every attempt of a test is logged with reports of its own: those of an attempt that is retried
have the outcome ``rerun``, and each report says how many attempts came before it
(``report.rerun``, pytest-rerunfailures' attribute). tfmem keeps one record per test, the last
attempt's, with that count (``gather``), and re-runs a test's body after a memory failure
(``core.rerun``: for a trace, an explanation) on its first memory failure only (``FirstReruns``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_tfmem.core.record import TestRecord


def attempts_before(report: pytest.TestReport) -> int:
    """How many attempts of the test came before the one ``report`` is of (0 without reruns)."""
    count = getattr(report, "rerun", 0)
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


def gather(records: list[TestRecord], record: TestRecord, gathered: set[str]) -> None:
    """Add ``record`` to ``records``; a later attempt's record replaces the earlier attempts'.
    ``gathered`` holds the node ids added so far (it spares a test's first attempt, nearly every
    record, a look through all the others).

    Earlier attempts are those ``record`` counts, and those retried (outcome ``rerun``): a
    report tfmem makes itself for an isolated test whose process died has no count.
    """
    if record.nodeid not in gathered:
        gathered.add(record.nodeid)
        records.append(record)
        return
    earlier = [r for r in records if r.nodeid == record.nodeid and (record.reruns or r.outcome == "rerun")]
    if earlier:
        record.reruns = max(record.reruns, len(earlier))
        records[:] = [r for r in records if not any(r is attempt for attempt in earlier)]
    records.append(record)


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
