"""Python as on Windows, for pytest-tfmem's own modules: the names Windows' Python lacks are taken
away (os.fork, os.wait4, os.register_at_fork, os.pread, os.sysconf, os.waitid; SIGKILL, SIGBUS,
SIGHUP, SIGUSR1/2, SIGQUIT, SIGCHLD; the fcntl and resource modules), and ``msvcrt``'s file lock
stands in, with its real interface (``locking(fd, mode, nbytes)``), for the one Windows has.

psutil is imported first (its Linux module needs what is taken away; on Windows it has a module of
its own), and its ``Process.kill`` ends a process as on Windows, without naming SIGKILL.
Used as ``PYTHONPATH=tests/simulated/windows`` by tests/test_platforms.py.
"""

import fcntl as _fcntl
import os
import signal
import sys
import types

import psutil

for _name in ("fork", "wait4", "register_at_fork", "pread", "sysconf", "waitid", "forkpty"):
    if hasattr(os, _name):
        delattr(os, _name)
_KILL = signal.SIGKILL
for _name in ("SIGKILL", "SIGBUS", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT", "SIGCHLD"):
    if hasattr(signal, _name):
        delattr(signal, _name)


def _kill(self):
    os.kill(self.pid, _KILL)


psutil.Process.kill = _kill

msvcrt = types.ModuleType("msvcrt")
msvcrt.LK_UNLCK, msvcrt.LK_LOCK, msvcrt.LK_NBLCK = 0, 1, 2


def _locking(descriptor, mode, nbytes):
    if mode == msvcrt.LK_UNLCK:
        _fcntl.lockf(descriptor, _fcntl.LOCK_UN, nbytes)
    else:
        _fcntl.lockf(descriptor, _fcntl.LOCK_EX | (_fcntl.LOCK_NB if mode == msvcrt.LK_NBLCK else 0), nbytes)


msvcrt.locking = _locking
sys.modules["msvcrt"] = msvcrt
sys.modules["fcntl"] = None
sys.modules["resource"] = None
