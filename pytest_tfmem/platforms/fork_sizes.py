"""The size of each fork copy of a process when it started, told by the copy itself.

A fork copy (a process that has not called ``exec``: a ``multiprocessing`` fork worker, a
``ProcessPoolExecutor``'s, Keras's data workers) maps its parent's pages, which its resident size
and high-water mark count: its own figure is what it grew above its size at the fork. Read from
outside, that size is only known once a reading finds the copy, when it may have grown already.
So each copy made by a fork writes its pid and resident size into a page it shares with the
process that set this up, at a slot of its own, right after the fork (``os.register_at_fork``,
where the platform forks at all). The page is anonymous (the process reads it itself: a test's
children), or a file another process maps too (``tfmem run``'s watchdog reads what its script's
forks told).

Nothing here imports the rest of the package: ``tfmem run``'s agent loads it by its path.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable

SLOTS = 1024
_RECORD = struct.Struct("<qq")


class ForkSizes:
    """A shared page of ``(pid, size at the fork)`` slots; ``tell_forks()`` makes this process's
    forks write theirs, as ``resident_size`` reads it."""

    def __init__(self, resident_size: Callable[[], int], path: str | None = None) -> None:
        self.resident_size = resident_size
        length = SLOTS * _RECORD.size
        if path is None:
            self._page = mmap.mmap(-1, length)  # anonymous and shared with forks
        else:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(descriptor).st_size < length:
                    os.ftruncate(descriptor, length)
                self._page = mmap.mmap(descriptor, length)
            finally:
                os.close(descriptor)

    def tell_forks(self) -> ForkSizes:
        """Every fork of this process writes its size here, from now on (a fork hook cannot be
        taken back: call this once a process). Nothing where Python has no fork hooks (Windows)."""
        register = getattr(os, "register_at_fork", None)
        if register is not None:
            register(after_in_child=self._tell)
        return self

    def _tell(self) -> None:
        self.tell(self.resident_size())

    def tell(self, size: int) -> None:
        """Write this process's size at its start: its resident size right after a fork, or, for
        a fork that maps pages it shares again (``file_pages``), the size it will share."""
        pid = os.getpid()
        try:
            _RECORD.pack_into(self._page, (pid % SLOTS) * _RECORD.size, pid, size)
        except (OSError, ValueError):
            pass

    def size(self, pid: int) -> int | None:
        """``pid``'s resident size when it was forked, if it told it."""
        told, size = _RECORD.unpack_from(self._page, (pid % SLOTS) * _RECORD.size)
        return size if told == pid else None


def told_sizes_path(readings: str) -> str:
    """Where ``tfmem run``'s script and its watchdog share the page: beside the agent's readings."""
    return readings + ".forks"
