"""Linux: the kernel's exact, resettable high-water mark of RSS, every process's mark in ``/proc``,
``wait4``'s mark of a reaped child, forks, memory cgroups and their OOM-kill counts.

Writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0) resets the peak RSS the kernel keeps
(``VmHWM``) to the current RSS, so the peak of any window is read exactly instead of sampled.
Where that file cannot be written (an older kernel, a sandbox) the mark is a lifetime mark:
exact for a window that raised it, with a sampler beside it (``probes.host``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import TypeVar

from . import cgroups
from .base import EXACT, EXACT_IF_RAISED, RSS, SAMPLED, MemoryLimit, Missing, OomKillCount
from .file_pages import FilePages
from .portable import descendants_from_parents, psutil
from .posix import Posix

CLEAR_REFS = "/proc/self/clear_refs"
_PROC_READ = 8192  # more than /proc/PID/status and statm hold
_LOADAVG = "/proc/loadavg"
_PR_SET_PDEATHSIG = 1
_Parsed = TypeVar("_Parsed")


class OwnProcFile:
    """A file of ``/proc/self``, kept open and read (or written) with one system call: this
    process's RSS is read several times a test, and by samplers every few milliseconds.
    ``/proc/self`` names the process that opened it, so a fork opens its own; a descriptor that
    user code closed is opened again."""

    def __init__(self, path: str, flags: int = os.O_RDONLY) -> None:
        self.path = path
        self.flags = flags
        self._opened = (0, -1)  # (the pid it was opened in, the descriptor)

    def _descriptor(self, again: bool = False) -> int:
        pid, descriptor = self._opened
        if again or pid != os.getpid():
            # A fork's inherited descriptor is left open: its number may have been reused already.
            descriptor = os.open(self.path, self.flags)
            self._opened = (os.getpid(), descriptor)
        return descriptor

    def read(self, parse: Callable[[bytes], _Parsed]) -> _Parsed:
        """``parse`` of the file's content; opened again once if the descriptor fails or reads
        something ``parse`` rejects (``ValueError``, ``IndexError``)."""
        try:
            return parse(os.pread(self._descriptor(), _PROC_READ, 0))
        except (OSError, ValueError, IndexError):
            return parse(os.pread(self._descriptor(again=True), _PROC_READ, 0))

    def write(self, content: bytes) -> None:
        try:
            os.write(self._descriptor(), content)
        except OSError:
            os.write(self._descriptor(again=True), content)


def status_fields(content: bytes, keys: tuple[bytes, ...]) -> dict[bytes, int]:
    """``/proc/PID/status`` fields given in kB (``VmRSS:``, ``VmHWM:``), in bytes; a field the
    process has no line for is left out (a zombie has no memory left to describe)."""
    if not content.startswith(b"Name:"):
        raise ValueError("not a /proc status file")
    found = {}
    for key in keys:
        start = content.find(b"\n" + key)
        if start >= 0:
            found[key] = int(content[start + len(key) + 1 :].split(None, 1)[0]) * 1024
    return found


def _read_status(pid: int, keys: tuple[bytes, ...]) -> dict[bytes, int]:
    with open(f"/proc/{pid}/status", "rb") as status:
        return status_fields(status.read(), keys)


def _parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` (``/proc/PID/stat``'s fourth field), ``None`` if it has gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
        return int(text[text.rindex(b")") + 2 :].split()[1])  # the name, in parentheses, may hold spaces
    except (OSError, ValueError, IndexError):
        return None


class ProcTable:
    """Descendants from ``/proc``: the kernel lists no children, so every process's parent is
    known, and at each listing only the processes not seen at the last one have theirs read (a
    few hundred microseconds, against milliseconds for reading every process's)."""

    def __init__(self) -> None:
        self._parents: dict[int, int] = {}  # pid -> parent pid, of every process seen in /proc

    def descendants(self, root: int) -> dict[int, int]:
        try:
            running = {int(name) for name in os.listdir("/proc") if name.isdigit()}
        except OSError:
            return {}
        self._parents = {pid: parent for pid, parent in self._parents.items() if pid in running}
        for pid in running - self._parents.keys():
            if (parent := _parent_pid(pid)) is not None:
                self._parents[pid] = parent
        return descendants_from_parents(root, self._parents)


def _load_malloc_trim() -> Callable[[int], int] | None:
    import ctypes.util  # here: ``tfmem run``'s agent loads this module into the script's process

    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class Linux(Posix):
    """``/proc``, ``clear_refs``, ``wait4`` in KiB, cgroups (``cgroups``), ``PR_SET_PDEATHSIG``."""

    name = "Linux"
    counts = RSS
    child_marks = EXACT
    marks_named = "the kernel's high-water marks"
    maxrss_unit = 1024

    def __init__(self, clear_refs: str = CLEAR_REFS, status: str = "/proc/self/status") -> None:
        super().__init__()
        self._statm = OwnProcFile("/proc/self/statm")
        self._status = OwnProcFile(status)
        self._clear_refs = OwnProcFile(clear_refs, os.O_WRONLY)
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        self._method: str | None = None
        self._malloc_trim: Callable[[int], int] | None | bool = False  # looked up at the first use

    # -- this process

    def current_size(self) -> int:
        return self._statm.read(_resident_pages) * self._page_size

    def peak_method(self) -> str:
        if self._method is None:
            if self.peak_mark() is None:
                self._method = SAMPLED
            else:
                try:
                    self._clear_refs.write(b"5")
                    self._method = EXACT
                except OSError:
                    self._method = EXACT_IF_RAISED
        return self._method

    def peak_mark(self) -> int | None:
        try:
            return self._status.read(lambda content: status_fields(content, (b"VmHWM:",))).get(b"VmHWM:")
        except (OSError, ValueError):
            return None

    def reset_peak_mark(self) -> None:
        self._clear_refs.write(b"5")

    def _trim(self) -> Callable[[int], int] | None:
        if self._malloc_trim is False:
            self._malloc_trim = _load_malloc_trim()
        return self._malloc_trim  # type: ignore[return-value]

    def release_freed_heap(self) -> None:
        trim = self._trim()
        if trim is not None:
            trim(0)

    def release_action(self) -> str | None:
        return "malloc_trim(0)" if self._trim() is not None else None

    def swapped_bytes(self) -> int:
        try:
            return self._status.read(lambda content: status_fields(content, (b"VmSwap:",))).get(b"VmSwap:", 0)
        except (OSError, ValueError):
            return 0

    # -- other processes

    def memory_of(self, pid: int) -> tuple[int, int] | None:
        try:
            fields = _read_status(pid, (b"VmRSS:", b"VmHWM:"))
        except (OSError, ValueError):
            return None
        if len(fields) < 2 or fields[b"VmRSS:"] == 0:  # a zombie: it has ended, its memory is gone
            return None
        return fields[b"VmRSS:"], fields[b"VmHWM:"]

    def process_table(self) -> ProcTable:
        return ProcTable()

    def command_line(self, pid: int) -> list[str] | None:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                args = cmdline.read().rstrip(b"\0").split(b"\0")
        except OSError:
            return None
        if args != [b""]:
            return [arg.decode(errors="replace") for arg in args]
        try:  # a kernel thread, or a process whose arguments are gone
            with open(f"/proc/{pid}/comm", "rb") as comm:
                return [f"[{comm.read().strip().decode(errors='replace')}]"]
        except OSError:
            return None

    def processes_started(self) -> bytes:
        """The last process id the kernel handed out, anywhere on the machine."""
        try:
            with open(_LOADAVG, "rb") as loadavg:
                return loadavg.read().rsplit(b" ", 1)[-1]
        except OSError:
            return b""

    # -- starting processes

    def fork_missing(self) -> str | None:
        return None if hasattr(os, "fork") else "this Python has no fork()"

    def resident_file_pages(self) -> FilePages:
        """Linux maps a fork's file pages again only as it touches them (``file_pages``)."""
        return FilePages.read()

    def die_with_parent(self, parent_pid: int) -> None:
        """The kernel SIGKILLs this process when its parent dies (``PR_SET_PDEATHSIG``)."""
        import ctypes

        # the C library's symbols are the process's own: ``find_library`` would run ``ldconfig -p``,
        # a process of this one's that a test's tree would count
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before the request took effect
            os._exit(1)

    # -- the machine

    def cpu_model(self) -> str:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
                for line in cpuinfo:
                    key, _, value = line.partition(":")
                    if key.strip() == "model name":
                        return value.strip()
        except OSError:
            pass
        return super().cpu_model()

    def memory_limit(self) -> MemoryLimit:
        return cgroups.applicable_memory_limit(int(psutil().virtual_memory().total))

    def available_memory(self) -> int:
        return cgroups.available_memory(int(psutil().virtual_memory().available))

    def oom_kill_counter(self) -> OomKillCount | None:
        return cgroups.oom_kill_counter()

    def oom_kills_since(self, before: OomKillCount | None) -> OomKillCount | None:
        return cgroups.oom_kills_since(before)

    def missing(self) -> list[Missing]:
        method = self.peak_method()
        if method == EXACT_IF_RAISED:
            return [Missing("a resettable peak", f"{self._clear_refs.path} cannot be written (kernel < 4.0, or a "
                            "sandbox): a test's peak is exact when it raised the process's lifetime mark, "
                            "sampled otherwise")]
        if method == SAMPLED:
            return [Missing("exact peaks", "/proc/self/status has no VmHWM here: every peak is sampled")]
        return []

    def describe(self) -> str:
        return {
            EXACT: "exact peaks from the kernel's high-water mark of RSS (VmHWM), reset per test",
            EXACT_IF_RAISED: "peaks from the kernel's lifetime high-water mark of RSS (VmHWM) where a test "
                             "raised it, sampled every millisecond otherwise",
            SAMPLED: "peaks of RSS sampled every millisecond",
        }[self.peak_method()]


def _resident_pages(content: bytes) -> int:
    return int(content.split()[1])
