"""Exclusive locks shared by the processes that write into one directory (the results journal's
first writer of a session): ``flock`` on the directory where ``fcntl`` exists, else
``msvcrt.locking`` on a lock file inside it (Windows)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

LOCK_FILE = ".lock"  # the file ``msvcrt`` locks: Windows locks files, not directories
_RETRY_S = 0.01


@contextmanager
def flock(directory: Path) -> Iterator[None]:
    """``flock(LOCK_EX)`` on the directory itself, released when its descriptor closes."""
    import fcntl

    descriptor = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


@contextmanager
def msvcrt_lock(directory: Path) -> Iterator[None]:
    """``msvcrt.locking`` of the first byte of ``directory/.lock``, tried until it is had
    (``LK_NBLCK`` fails at once while another process holds it; ``LK_LOCK`` gives up after ten
    seconds)."""
    import msvcrt

    descriptor = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                msvcrt.locking(descriptor, msvcrt.LK_NBLCK, 1)  # type: ignore[attr-defined]
                break
            except OSError:
                time.sleep(_RETRY_S)
        try:
            yield
        finally:
            os.lseek(descriptor, 0, os.SEEK_SET)
            msvcrt.locking(descriptor, msvcrt.LK_UNLCK, 1)  # type: ignore[attr-defined]
    finally:
        os.close(descriptor)


def directory_lock(directory: Path) -> AbstractContextManager[None]:
    """``flock`` where this Python has ``fcntl``, else ``msvcrt_lock``."""
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return msvcrt_lock(directory)
    return flock(directory)
