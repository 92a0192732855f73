"""tfmem's account of a pytest-xdist worker that died while running a test.

xdist reports such a test as ``worker 'gw1' crashed while running 'test_x.py::test_y'``. The
controller knows more: how the worker's process ended (its exit status: ``SIGKILL`` is what
the kernel's OOM killer sends), whether the memory cgroup's ``oom_kill`` count rose meanwhile
(the OOM killer did it, not ``kill -9`` or a CI timeout), and the test's last memory
readings, which the worker wrote to the session's journal before it died.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_tfmem import platforms
from pytest_tfmem.journal.format import read_journal
from pytest_tfmem.journal.reader import last_reading_line, unfinished_tests
from pytest_tfmem.probes import system
from pytest_tfmem.probes.watchdog import describe_signal
from pytest_tfmem.units import format_size

# How long to wait for a crashed worker's process to be reaped, to read its exit status.
REAP_TIMEOUT_S = 5.0


def worker_returncode(node: Any) -> int | None:
    """The exit status of an xdist worker's process (negative: the signal that ended it), if
    it can be read: execnet keeps the ``subprocess.Popen`` of a local worker (no public API)."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if not isinstance(popen, subprocess.Popen):
        return None
    try:
        return popen.wait(timeout=REAP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None


def journal_readings(path: Path, session: str, worker: str, nodeid: str) -> tuple[dict, dict | None] | None:
    """The journal's ``start`` entry of the test on that worker and its last ``reading``."""
    try:
        entries = read_journal(path)
    except OSError:
        return None
    ours = [entry for entry in entries if entry.get("session") == session and entry.get("event") != "session"]
    return unfinished_tests(ours).get((worker, nodeid))


def _oom_kills() -> int | None:
    counter = system.oom_kill_counter()
    return None if counter is None else counter.count


class OomKillCounter:
    """Attributes rises of the cgroup's ``oom_kill`` count to the workers that died: a kill not
    yet attributed (two workers killed at once) stays for the next crashed worker."""

    def __init__(self) -> None:
        self._last = _oom_kills()
        self._unattributed = 0

    def kills_for_crash(self) -> int | None:
        """OOM kills since the session began not yet attributed to a crashed worker; ``None``
        if the count cannot be read."""
        now = _oom_kills()
        if now is None or self._last is None:
            return None
        self._unattributed += max(0, now - self._last)
        self._last = now
        return self._unattributed

    def attribute(self) -> None:
        self._unattributed = max(0, self._unattributed - 1)


@dataclass(frozen=True)
class CrashAccount:
    worker: str
    returncode: int | None
    oom_kills: int | None  # unattributed OOM kills in this cgroup when the crash was seen
    readings: tuple[dict, dict | None] | None  # the journal's start entry and last reading
    limit: system.MemoryLimit

    @property
    def signal(self) -> str | None:
        """The signal that ended the worker (``SIGKILL``), ``None`` if it exited or is not known."""
        return None if self.returncode is None else platforms.current().ending(self.returncode).signal

    def lines(self) -> list[str]:
        sig = self.signal
        if sig is not None:
            head = f"tfmem: worker {self.worker}'s process was {describe_signal(sig, self.oom_kills)}"
        elif self.returncode is not None:
            head = f"tfmem: worker {self.worker}'s process exited with code {self.returncode} during the test"
        else:
            head = f"tfmem: worker {self.worker}'s exit status could not be read"
        lines = [head]
        if self.readings is not None:
            start, reading = self.readings
            lines.append(last_reading_line(start, reading))
        else:
            lines.append("no memory readings of the test in the journal")
        lines.append(f"memory limit: {format_size(self.limit.bytes)} ({self.limit.source})")
        return lines
