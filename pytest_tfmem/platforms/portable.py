"""Any operating system, through psutil and the standard library alone: the fallback every
platform module builds on, and the path ``--tfmem-platform=portable`` forces.

Nothing here keeps a peak: this process's is sampled (``probes.host``), so is every other
process's. Processes start by spawning (no ``fork``), a spawned process inherits no socket, and
nothing counts the OOM killer's kills. psutil is imported at its first use.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from .base import RSS, SAMPLED, Ending, ForkReaper, MemoryLimit, Missing, OomKillCount, ProcessTable, signal_name
from .file_pages import FilePages
from .locks import directory_lock

_PARENT_POLL_S = 0.5


def psutil() -> Any:
    import psutil as module

    return module


class ScannedTable:
    """Descendants found from every process's parent, listed through psutil at each call."""

    def descendants(self, root: int) -> dict[int, int]:
        parents: dict[int, int] = {}
        for process in psutil().process_iter(["ppid"]):
            parent = process.info.get("ppid")
            if isinstance(parent, int):
                parents[process.pid] = parent
        return descendants_from_parents(root, parents)


def descendants_from_parents(root: int, parents: dict[int, int]) -> dict[int, int]:
    """The processes below ``root`` (pid -> parent), given every process's parent."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        if pid != parent:
            children.setdefault(parent, []).append(pid)
    found: dict[int, int] = {}
    pending = list(children.get(root, ()))
    while pending:
        pid = pending.pop()
        if pid not in found:
            found[pid] = parents[pid]
            pending += children.get(pid, ())
    return found


class Portable:
    """psutil's view: sizes read, never a kept peak; a process killed with psutil's ``kill``."""

    name = "portable"
    counts = RSS
    child_marks = SAMPLED
    marks_named = "each process's size, sampled"
    killed_returncode = -9 if os.name == "posix" else 15  # psutil: SIGKILL; TerminateProcess(..., SIGTERM)
    reaps_with_peak = False
    passes_descriptors = False
    appends_whole_lines = os.name == "posix"  # O_APPEND: each write lands at the end, whole

    def __init__(self) -> None:
        self._me: tuple[int, Any] = (0, None)
        self._children_asked: tuple[bytes, bool] = (b"", False)  # (the machine's processes then, the answer)

    def _own_process(self) -> Any:
        pid, process = self._me
        if pid != os.getpid():  # a fork reads itself
            process = psutil().Process()
            self._me = (os.getpid(), process)
        return process

    # -- this process

    def current_size(self) -> int:
        return int(self._own_process().memory_info().rss)

    def peak_method(self) -> str:
        return SAMPLED

    def peak_mark(self) -> int | None:
        return None

    def reset_peak_mark(self) -> None:
        pass

    def release_freed_heap(self) -> None:
        pass

    def release_action(self) -> str | None:
        return None

    def swapped_bytes(self) -> int:
        return 0

    # -- other processes

    def memory_of(self, pid: int) -> tuple[int, int] | None:
        try:
            size = int(psutil().Process(pid).memory_info().rss)
        except (psutil().Error, OSError):
            return None
        return (size, size) if size else None  # a zombie holds no memory: it has ended

    def process_table(self) -> ProcessTable:
        return ScannedTable()

    def command_line(self, pid: int) -> list[str] | None:
        try:
            return list(psutil().Process(pid).cmdline())
        except (psutil().Error, OSError):
            return None

    def has_children(self) -> bool:
        """Asked again only when the machine's processes changed: asking builds every process's
        parent (milliseconds), the list of ids is a tenth of that."""
        processes = self.processes_started()
        asked, answer = self._children_asked
        if processes != asked:
            try:
                answer = bool(self._own_process().children())
            except psutil().Error:
                answer = False
            self._children_asked = (processes, answer)
        return answer

    def processes_started(self) -> bytes:
        """The machine's process ids, hashed: a process started (or ended) anywhere changes it."""
        return b"%x" % hash(frozenset(psutil().pids()))

    def wait_with_peak(self, pid: int, options: int) -> tuple[int, int, int]:
        raise OSError(f"the {self.name} platform's wait tells no peak")

    def returncode(self, status: int) -> int:
        return status

    def kill(self, pid: int) -> None:
        try:
            psutil().Process(pid).kill()
        except psutil().Error:
            pass

    def ending(self, returncode: int) -> Ending:
        if returncode < 0:
            name = signal_name(-returncode)
            return Ending(name, None, f"killed by {name}")
        return Ending(None, returncode, f"exited with {returncode}")

    # -- starting processes

    def fork_missing(self) -> str | None:
        return "the portable platform starts every process by spawning a fresh interpreter"

    def fork(self) -> int:
        raise OSError(self.fork_missing())

    def fork_reaper(self) -> ForkReaper:
        raise OSError(self.fork_missing())

    def resident_file_pages(self) -> FilePages:
        return FilePages()

    def die_with_parent(self, parent_pid: int) -> None:
        def watch() -> None:
            while psutil().pid_exists(parent_pid) and (os.name != "posix" or os.getppid() == parent_pid):
                time.sleep(_PARENT_POLL_S)
            os._exit(1)

        threading.Thread(target=watch, name="tfmem-parent-watch", daemon=True).start()

    # -- files

    def lock(self, directory: Path) -> AbstractContextManager[None]:
        return directory_lock(directory)

    # -- the machine

    def cpu_model(self) -> str:
        import platform

        return platform.processor() or platform.machine()

    def memory_limit(self) -> MemoryLimit:
        return MemoryLimit(int(psutil().virtual_memory().total), "physical memory")

    def available_memory(self) -> int:
        return int(psutil().virtual_memory().available)

    def oom_kill_counter(self) -> OomKillCount | None:
        return None

    def oom_kills_since(self, before: OomKillCount | None) -> OomKillCount | None:
        return None

    def missing(self) -> list[Missing]:
        return [
            Missing("exact peaks", "psutil reads sizes only, so every peak is sampled"),
            Missing("isolation by fork", "tests are isolated in fresh interpreters"),
            Missing("OOM-kill counts", f"nothing counts the OOM killer's kills on {sys.platform} through psutil"),
        ]

    def describe(self) -> str:
        return "peaks sampled every millisecond through psutil (RSS)"
