"""``--tfmem-isolate=auto``: isolate the tests that took an earlier session down.

The crash-safe journal (``journal/``) of the last session tells which tests were running when
its pytest process died (the OOM killer's SIGKILL leaves no other trace), and which tests it
ran isolated whose process was killed. Those tests, and only those, run isolated, under the
watchdog, in the next session with ``--tfmem-isolate=auto``; the others run in process. So a
suite that was killed explains itself on the next run without anyone marking a test.
"""

from __future__ import annotations

from pathlib import Path

from pytest_tfmem.journal.reader import (
    NotAJournal,
    clock,
    read_last_session,
    session_died,
    session_end,
    unfinished_tests,
)
from pytest_tfmem.units import format_size

AUTO = "auto"


def tests_to_isolate(journal: Path) -> tuple[dict[str, str], str]:
    """The tests to isolate (node id -> why), and a line on what the journal said."""
    try:
        header, entries = read_last_session(journal)
    except OSError:
        return {}, f"no journal at {journal} yet: nothing to isolate"
    except NotAJournal as error:
        return {}, f"{error}: nothing to isolate"
    session = f"the session started {clock(header['started'])} (pid {header['pid']})"
    died = session_died(header, entries)
    reasons: dict[str, str] = {}
    if died:
        for start, reading in unfinished_tests(entries).values():
            rss = f", its process tree at {format_size(reading['rss'])}" if reading else ""
            reasons[start["nodeid"]] = f"running when {session} died{rss}"
    for entry in entries:
        if entry.get("event") != "finish":
            continue
        isolated = ((entry.get("record") or {}).get("extra") or {}).get("isolated") or {}
        if isolated.get("death"):
            reasons[entry["nodeid"]] = f"its isolated process was {isolated['death']} in {session}"
    state = "died" if died else "finished" if session_end(entries) is not None else "is still running"
    return reasons, f"{session} {state}; {len(reasons)} test(s) to isolate (journal {journal})"
