"""What Linux and macOS share: signals, ``wait4``'s peak of a reaped child, ``fork`` and the
reaping of forks, ``flock``, and ``waitid``'s cheap question whether this process has children."""

from __future__ import annotations

import os
import signal
from contextlib import AbstractContextManager
from pathlib import Path

from .locks import flock
from .portable import Portable


class ForkReaper:
    """A process's forks, reaped as they end: SIGCHLD writes to a pipe (``wakeup``) that the
    process's loop waits on beside its other work, so that several forks can run at once (the
    isolation template's: an isolated test beside the replacement process running the
    session's other tests)."""

    def __init__(self) -> None:
        self.wakeup, self._wakeup_writer = os.pipe()
        os.set_blocking(self.wakeup, False)
        os.set_blocking(self._wakeup_writer, False)
        signal.set_wakeup_fd(self._wakeup_writer)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # a handler: the signal reaches the pipe
        self.forks: set[int] = set()

    def reap(self) -> list[tuple[int, int]]:
        """The forks that ended since the last call: (pid, exit status, negative for a signal)."""
        try:
            while os.read(self.wakeup, 512):
                pass
        except BlockingIOError:
            pass
        ended = []
        for pid in list(self.forks):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                self.forks.discard(pid)
                ended.append((pid, os.waitstatus_to_exitcode(status)))
        return ended

    def leave(self) -> None:
        """In a fork: this process's children are its own again, with SIGCHLD as usual."""
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(self.wakeup)
        os.close(self._wakeup_writer)


class Posix(Portable):
    """SIGKILL, ``wait4`` and ``flock``; the sizes and marks are each system's own."""

    killed_returncode = -signal.SIGKILL
    passes_descriptors = True
    appends_whole_lines = True
    reaps_with_peak = True
    maxrss_unit = 1024  # bytes in a unit of ``ru_maxrss``: KiB on Linux, bytes on macOS

    def has_children(self) -> bool:
        if not hasattr(os, "waitid"):  # macOS before Python 3.13
            return super().has_children()
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        except OSError:
            return True
        return True

    def wait_with_peak(self, pid: int, options: int) -> tuple[int, int, int]:
        reaped, status, usage = os.wait4(pid, options)
        return reaped, status, usage.ru_maxrss * self.maxrss_unit

    def returncode(self, status: int) -> int:
        """A ``wait`` status as ``subprocess`` gives it: negative for a signal."""
        return os.waitstatus_to_exitcode(status)

    def kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def fork(self) -> int:
        return os.fork()

    def fork_reaper(self) -> ForkReaper:
        return ForkReaper()

    def lock(self, directory: Path) -> AbstractContextManager[None]:
        return flock(directory)
