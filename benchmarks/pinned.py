"""Processes pinned to one core, and their CPU time once they end: the benchmarks that run a side
with tfmem and one without at once, on one core or each on its own, read each side's user and
system time, its children's included, as ``os.wait4`` gives it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from typing import Any, NamedTuple


def popen(command: Sequence[str], core: int | None, **options: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(command, **options)``, on ``core`` alone (``None``: any core)."""
    pin = None if core is None else lambda: os.sched_setaffinity(0, {core})
    return subprocess.Popen(command, preexec_fn=pin, **options)


class Ended(NamedTuple):
    pid: int
    exit_code: int  # negative: killed by that signal
    cpu_s: float  # user and system time, its own and its waited children's
    peak_bytes: int  # its largest resident size


def wait_any() -> Ended:
    """The next child of this process to end (``os.wait4``); a ``subprocess.Popen`` of it is left
    without its ``returncode``, which the caller sets if it reads it again."""
    pid, status, usage = os.wait4(-1, 0)
    peak_bytes = usage.ru_maxrss * 1024  # KiB on Linux, where the benchmarks pin cores
    return Ended(pid, os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, peak_bytes)
