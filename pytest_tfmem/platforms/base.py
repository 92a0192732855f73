"""What every operating system module offers (``Platform``), and the plain values it hands out.

A platform module needs nothing but the standard library (psutil is imported where a module
uses it, when it first does), and nothing else of pytest-tfmem: ``tfmem run``'s agent loads
it by its path, without the package.
"""

from __future__ import annotations

import signal
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .file_pages import FilePages

# How a peak figure was obtained.
EXACT = "exact"  # a mark the operating system keeps and this process can reset: nothing sampled
EXACT_IF_RAISED = "exact-if-raised"  # a lifetime mark: exact for a window that raised it
SAMPLED = "sampled"  # the highest of readings taken every few milliseconds: a short spike can be missed
METHODS = (EXACT, EXACT_IF_RAISED, SAMPLED)

# What the figures count, by what the operating system calls it.
RSS = "RSS"  # resident set size (Linux's VmRSS/VmHWM, psutil's rss elsewhere)
PHYS_FOOTPRINT = "phys_footprint"  # macOS: dirty memory, compressed and swapped pages included
WORKING_SET = "working set"  # Windows: the process's pages in physical memory

# What sent a signal that ended a process, by the signal's name: the names, not ``signal``'s
# numbers, so that a platform without SIGKILL or SIGBUS (Windows) still reads them.
SIGNAL_CAUSES = {
    "SIGKILL": "likely the kernel's OOM killer (out of memory); SIGKILL cannot be caught",
    "SIGSEGV": "segmentation fault: invalid memory access in native code",
    "SIGABRT": "abort: a native library (or an assertion) called abort()",
    "SIGBUS": "bus error: invalid memory access in native code",
    "SIGTERM": "terminated from outside",
    "SIGINT": "interrupted (Ctrl-C, or SIGINT from outside)",
}


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 64`` for a number this Python does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class Ending:
    """How a process ended, from its return code as ``subprocess`` gives it."""

    signal: str | None  # "SIGKILL": ended by that signal (POSIX); None: it exited
    exit_code: int | None  # its exit status when it exited
    description: str  # "exited with 1", "killed by SIGSEGV", "ended with 0xC0000005 (access violation)"


@dataclass(frozen=True)
class Missing:
    """A feature this platform does not give, and why: the session header's line."""

    feature: str  # "isolation by fork"
    why: str  # "Windows has no fork(); isolated tests start a fresh interpreter"


@dataclass(frozen=True)
class MemoryLimit:
    """The memory limit that applies to this process, and where it comes from."""

    bytes: int
    source: str  # "cgroup v2 memory.max (/sys/fs/cgroup/...)", "physical memory", ...


@dataclass(frozen=True)
class OomKillCount:
    """An ``oom_kill`` count and whose it is: ``this cgroup``'s, or ``the machine``'s."""

    count: int
    scope: str


class ProcessTable(Protocol):
    """The processes below one process, listed as cheaply as the platform allows (a listing may
    keep what it learnt for the next one: one table per reader)."""

    def descendants(self, root: int) -> dict[int, int]:
        """Every process below ``root`` now running: pid -> its parent's pid."""
        ...


class ForkReaper(Protocol):
    """A process's forks, reaped as they end; ``wakeup`` is a descriptor that becomes readable
    when one does."""

    wakeup: int
    forks: set[int]

    def reap(self) -> list[tuple[int, int]]:
        """The forks that ended since the last call: (pid, return code, negative for a signal)."""
        ...

    def leave(self) -> None:
        """In a fork: its own children are reaped as usual again."""
        ...


class Platform(Protocol):
    """One operating system's view of processes and their memory, as pytest-tfmem reads it.

    Sizes are bytes of what ``counts`` names. ``peak_method`` is how this process's own peak is
    read: ``exact`` (a mark reset at each window), ``exact-if-raised`` (a lifetime mark beside a
    sampler) or ``sampled``; ``child_marks`` likewise for another process's mark (``exact`` where
    the kernel keeps one per process, ``sampled`` where only its size can be read).
    """

    name: str  # "Linux", "macOS", "Windows", "portable"
    counts: str
    child_marks: str
    marks_named: str  # what the processes' peaks are, in a summary: "the kernel's high-water marks"
    # Return code of a process this platform's ``kill`` ended.
    killed_returncode: int

    # -- this process
    def current_size(self) -> int: ...

    def peak_method(self) -> str: ...

    def peak_mark(self) -> int | None:
        """This process's mark: since the last ``reset_peak_mark`` (``exact``), or since it
        started (``exact-if-raised``); ``None`` where the platform keeps none."""
        ...

    def reset_peak_mark(self) -> None: ...

    def release_freed_heap(self) -> None:
        """Hand the heap the C allocator holds free back to the operating system, where it can."""
        ...

    def release_action(self) -> str | None:
        """How ``release_freed_heap`` does it (``malloc_trim(0)``), ``None`` where it does nothing."""
        ...

    def swapped_bytes(self) -> int:
        """This process's memory in swap that ``current_size`` does not count."""
        ...

    # -- other processes
    def memory_of(self, pid: int) -> tuple[int, int] | None:
        """Another process's size and mark (its peak so far, or its size where ``child_marks`` is
        ``sampled``); ``None`` once it has ended or is gone."""
        ...

    def process_table(self) -> ProcessTable: ...

    def command_line(self, pid: int) -> list[str] | None:
        """A process's arguments (``[]`` for a kernel thread), ``None`` if it is gone."""
        ...

    def has_children(self) -> bool:
        """Whether this process has a child, running or not yet reaped (as cheap as can be: asked
        as each measured window opens and closes)."""
        ...

    def processes_started(self) -> bytes:
        """A token that changes when any process starts anywhere (Linux: the last pid handed out;
        elsewhere the machine's process ids, hashed): the descendants are listed again when it does."""
        ...

    def kill(self, pid: int) -> None:
        """End a process now (SIGKILL; Windows: TerminateProcess); nothing if it is gone."""
        ...

    def ending(self, returncode: int) -> Ending: ...

    reaps_with_peak: bool  # its wait tells a reaped child's peak: ``wait_with_peak`` can stand in for ``os.waitpid``

    def wait_with_peak(self, pid: int, options: int) -> tuple[int, int, int]:
        """``os.waitpid`` that also tells the reaped child's peak: (pid, status, peak in bytes)."""
        ...

    def returncode(self, status: int) -> int:
        """A wait status as ``subprocess`` gives a return code: negative for a signal."""
        ...

    # -- starting processes
    def fork_missing(self) -> str | None:
        """Why isolated tests cannot start as forks here, or ``None`` where they can."""
        ...

    def fork(self) -> int:
        """``os.fork()``, where ``fork_missing()`` is ``None``."""
        ...

    def fork_reaper(self) -> ForkReaper:
        """Reaps this process's forks as they end, where it can fork."""
        ...

    def resident_file_pages(self) -> FilePages:
        """This process's file-backed pages in memory, which a fork of it maps again before its
        test (``FilePages.map_again``); none where a fork has them mapped already, or cannot be told."""
        ...

    passes_descriptors: bool  # a spawned process can inherit a socket (``pass_fds``)

    def die_with_parent(self, parent_pid: int) -> None:
        """End this process as soon as ``parent_pid`` has ended."""
        ...

    # -- files
    def lock(self, directory: Path) -> AbstractContextManager[object]:
        """An exclusive lock shared by every process writing into ``directory``."""
        ...

    appends_whole_lines: bool  # one write to a file opened for appending lands whole, whatever writes beside it

    # -- the machine
    def cpu_model(self) -> str: ...

    def memory_limit(self) -> MemoryLimit: ...

    def available_memory(self) -> int: ...

    def oom_kill_counter(self) -> OomKillCount | None:
        """The OOM killer's count of kills that this process's memory would be killed under;
        ``None`` where the platform keeps none."""
        ...

    def oom_kills_since(self, before: OomKillCount | None) -> OomKillCount | None: ...

    def missing(self) -> list[Missing]:
        """What this platform does not give that Linux does: the session header's line."""
        ...

    def describe(self) -> str:
        """How figures are read here, in a few words: the session header's line."""
        ...
