"""``--tfmem-isolate=auto``: isolate the tests that took an earlier session down.

The crash-safe journal (``journal/``) of the last session tells which tests were running when
its pytest process died (the OOM killer's SIGKILL leaves no other trace), and which tests it
ran isolated whose process was killed. Those tests, and only those, run isolated, under the
watchdog, in the next session with ``--tfmem-isolate=auto``; the others run in process. So a
suite that was killed explains itself on the next run without anyone marking a test.
"""

from __future__ import annotations

from pathlib import Path

from pytest_tfmem.units import format_size

AUTO = "auto"


def tests_to_isolate(journal: Path) -> tuple[dict[str, str], str]:
    """The tests to isolate (node id -> why), and a line on what the journal said."""
    # Imported here: importing the journal's plugin module before pytest registers it (after
    # this feature's) would keep pytest from rewriting its asserts, and pytest warns about that.
    from pytest_tfmem.journal.reader import NotAJournal, clock, read_last_session

    try:
        last = read_last_session(journal)
    except OSError:
        return {}, f"no journal at {journal} yet: nothing to isolate"
    except NotAJournal as error:
        return {}, f"{error}: nothing to isolate"
    header = last.header
    session = f"the session started {clock(header['started'])} (pid {header['pid']})"
    reasons: dict[str, str] = {}
    if last.died:
        for key, start in last.running.items():
            reading = last.readings.get(key)
            rss = f", its process tree at {format_size(reading['rss'])}" if reading else ""
            reasons[start["nodeid"]] = f"running when {session} died{rss}"
    for entry in last.finished:
        isolated = ((entry.get("record") or {}).get("extra") or {}).get("isolated") or {}
        if isolated.get("death"):
            reasons[entry["nodeid"]] = f"its isolated process was {isolated['death']} in {session}"
    if last.died:
        state = "died"
    elif last.alive:
        state = "is still running"
    else:
        state = "finished"
    return reasons, f"{session} {state}; {len(reasons)} test(s) to isolate (journal {journal})"
