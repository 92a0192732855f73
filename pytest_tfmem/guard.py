"""``%tfmem_guard 6GB``: the kernel watches its own size while a cell runs, and stops the cell
before the machine's OOM killer stops the kernel.

While a cell runs, a thread reads the kernel's size (RSS on Linux) every ``INTERVAL_S``; once it
passes the guard, the cell is stopped where it has reached: ``GuardTripped`` is raised in the
kernel's main thread (``PyThreadState_SetAsyncExc``, delivered between two Python bytecodes), an
``Exception`` with the figures: the size, the guard, what the cell grew from its start. The kernel
and every variable stay; so do those the cell made before it stopped. Between cells the thread
waits on an event, reading nothing: an idle kernel pays nothing.

A guard serves a whole notebook session, not one stop:

- A stopped cell's variables stay, so the kernel may begin the next cell above the guard. Such a
  cell is told so once (not at every cell), and stopped only if it grows past a margin above where
  it began (``above_guard_margin``): a cell is stopped for what it grows, never for the level the
  kernel was at when it began.
- The exception is raised only while the main thread runs the cell's own code (or a library the
  cell called): never inside IPython's machinery, a magic (``%tfmem_guard`` itself) or a hook.
  Where the thread is elsewhere, the guard waits for the next reading.
- The guard knows what the kernel may have (``kernel_limit``): the memory cgroup's limit where one
  holds it (v1 or v2), JupyterHub's ``MEM_LIMIT`` where it is set, else the machine's memory.
  ``%tfmem_guard`` with no size sets the guard that far less a margin (``default_guard``); a size
  above the limit is refused (the OOM killer would come first).

What it cannot stop: one native call that allocates past both the guard and the kernel's limit
(``np.ones`` of 40 GB) runs to its end before Python reads another bytecode; the OOM killer may
take the kernel there. It stops what grows in steps: a fit over epochs, a loop appending batches,
models built in a loop. So while a cell runs the guard also keeps a journal (``KERNELS``, one file
a kernel, written whole at most every ``JOURNAL_EVERY_S``): the cell, the line the main thread is
at, the kernel's size, the guard and the limit. The next ``%load_ext pytest_tfmem`` in the same
folder names a kernel that died with a cell running, the line it was at and the cause it can see
(``dead_kernels``), as ``tfmem last`` does for a pytest session.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from pytest_tfmem import platforms
from pytest_tfmem.files import write_text_atomic
from pytest_tfmem.probes import host
from pytest_tfmem.units import format_compared, format_limit, format_size, parse_size

INTERVAL_S = 0.02  # how often the kernel's size is read while a cell runs
JOURNAL_EVERY_S = 0.5
KERNELS = Path(".tfmem") / "kernels"  # under the kernel's working folder: <pid>.json while a cell runs
# Where a cell's code says it comes from: IPython's shell, ipykernel (its cells' files in the temporary
# folder), and the %tfmem magics.
CELL_FILES = ("<ipython-input", os.path.join(tempfile.gettempdir(), "ipykernel_"), "<tfmem")
# The kernel's machinery: a cell is never stopped while the main thread runs these (a magic, a hook,
# IPython's own bookkeeping), only in the cell's code or a library it called.
MACHINERY = ("IPython", "ipykernel", "traitlets", "tornado", "asyncio", "zmq", "jupyter_client", "pytest_tfmem")
# What ``%tfmem_guard`` with no size keeps free below the kernel's limit, and what a cell that began
# above the guard may grow: a share of the limit (of the guard), at least ``MARGIN_AT_LEAST``.
MARGIN_SHARE = 0.10
MARGIN_AT_LEAST = 64 * 2**20


class GuardTripped(Exception):  # named for what happened, like the other failures
    """The kernel grew past ``%tfmem_guard`` while a cell ran; the cell was stopped there."""

    message = ""

    def __init__(self, *args: object) -> None:  # raised by its class alone: the message rides on it
        super().__init__(*(args or (self.message,)))


@dataclass(frozen=True)
class KernelLimit:
    """What the kernel may have, and where that comes from (``its memory cgroup's limit``...)."""

    bytes: int
    source: str

    def describe(self) -> str:
        return f"{format_size(self.bytes)} ({self.source})"


def kernel_limit() -> KernelLimit:
    """The tightest of the kernel's memory cgroup limit (v1 or v2), JupyterHub's ``MEM_LIMIT``
    (bytes: jupyter-resource-usage shows it, nothing enforces it) and the machine's memory."""
    found = platforms.current().memory_limit()
    cgroup = found.source != "physical memory"  # "cgroup v1 memory.limit_in_bytes (/sys/fs/cgroup/...)"
    source = f"its memory cgroup's limit, {found.source.split(' (', 1)[0]}" if cgroup else "the machine's memory"
    limit = KernelLimit(found.bytes, source)
    hub = os.environ.get("MEM_LIMIT", "").strip()
    if hub.isdigit() and 0 < int(hub) < limit.bytes:
        limit = KernelLimit(int(hub), "JupyterHub's MEM_LIMIT")
    return limit


def margin(size: int) -> int:
    """``MARGIN_SHARE`` of ``size``, at least ``MARGIN_AT_LEAST``."""
    return max(MARGIN_AT_LEAST, int(MARGIN_SHARE * size))


def default_guard(limit: KernelLimit) -> int:
    """``%tfmem_guard`` with no size: the kernel's limit less ``margin`` of it."""
    return limit.bytes - margin(limit.bytes)


def guard_size(words: str, limit: KernelLimit, held: int) -> int:
    """The guard ``%tfmem_guard WORDS`` asks for (``default_guard`` for no words); ``ValueError``
    names a size that is not one, not above what the kernel holds, or above what it may have."""
    if not words:
        size = default_guard(limit)
    else:
        size = parse_size(words, what="guard")
        if size >= limit.bytes:
            raise ValueError(
                f"guard {format_limit(size)} is not below what this kernel may have, {limit.describe()}: the OOM "
                f"killer would stop the kernel before the guard stops a cell; give a smaller size, or "
                f"%tfmem_guard alone for {format_size(default_guard(limit))}")
    if size <= held:
        raise ValueError(f"guard {format_limit(size)} is not above what the kernel holds already, "
                         f"{format_size(held)}: give a larger size")
    return size


def in_cell_code(frame: FrameType | None) -> bool:
    """The thread of ``frame`` runs a cell's own code, or a library the cell called, and no part of
    the kernel's machinery (``MACHINERY``) stands between: a cell's frame is found, walking out,
    before any of the machinery's."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(CELL_FILES):
            return True
        module = str(frame.f_globals.get("__name__", ""))
        if module.split(".", 1)[0] in MACHINERY:
            return False
        frame = frame.f_back
    return False


def cell_line(frame: FrameType | None) -> int | None:
    """The line of the innermost frame of the cell's own code."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(CELL_FILES):
            return frame.f_lineno
        frame = frame.f_back
    return None


def _clear_pending(thread: int) -> None:
    """Take back a ``GuardTripped`` set for ``thread`` that it has not raised yet."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object())


class Guard:
    """One kernel's guard: its size, armed around each cell (``pre_run_cell``/``post_run_cell``) for
    one thread that waits, unread, between cells."""

    def __init__(self, size: int, limit: KernelLimit, main_thread: int, journal: Path) -> None:
        self.size = size
        self.limit = limit
        self.main_thread = main_thread
        self.journal = journal
        self._armed = threading.Event()
        self._lock = threading.Lock()  # a trip and the cell's end never cross
        self._closed = False
        self._cell_start = 0
        self._cell_limit = size  # the size this cell may reach: the guard, or a margin above where it began
        self._told_above = False  # the kernel began a cell above the guard, and was told so
        self._cell: dict[str, Any] = {}
        self._written = 0.0
        threading.Thread(target=self._watch, name="tfmem-guard", daemon=True).start()

    def arm(self, info: Any = None) -> None:
        """A cell starts (IPython's ``pre_run_cell``, with the cell's ``info``): watch it."""
        _clear_pending(self.main_thread)
        self._cell_start = host.current_rss()
        self._cell_limit = self.size
        if self._cell_start >= self.size:
            self._cell_limit = self._cell_start + above_guard_margin(self._cell_start, self.size, self.limit)
            if not self._told_above:
                start, guard = format_compared(self._cell_start, self.size)
                print(f"tfmem guard: the kernel holds {start}, above the guard of {guard}, since a cell kept what it "
                      f"made; a cell is stopped now if it grows more than "
                      f"{format_size(self._cell_limit - self._cell_start)} (to {format_size(self._cell_limit)}); "
                      "%tfmem_guard SIZE sets another guard")
                self._told_above = True
        else:
            self._told_above = False
        source = str(getattr(info, "raw_cell", "") or "")
        self._cell = {"pid": os.getpid(), "cell": source[:4000], "started": time.time(), "guard": self.size,
                      "limit": self.limit.bytes, "limit_source": self.limit.source, "cell_start": self._cell_start}
        self._write_journal(self._cell_start)
        self._written = float("-inf")  # the first reading writes it again, with the line the cell is at
        self._armed.set()

    def disarm(self, *_: object) -> None:
        """The cell ended: stop watching (an idle kernel is not read), and the journal goes."""
        with self._lock:
            self._armed.clear()
        _clear_pending(self.main_thread)
        self.journal.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._armed.set()  # the thread wakes, and ends
        self.journal.unlink(missing_ok=True)

    def _write_journal(self, size: int) -> None:
        """The cell, the line the kernel's main thread is at, its size: written whole (a kill never
        leaves half a file), at most every ``JOURNAL_EVERY_S``."""
        line = cell_line(sys._current_frames().get(self.main_thread))
        try:
            self.journal.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.journal, json.dumps({**self._cell, "line": line, "size": size, "read": time.time()}))
        except OSError:  # a folder that cannot be written: no journal, the guard still guards
            return
        self._written = time.monotonic()

    def _watch(self) -> None:
        while True:
            self._armed.wait()
            if self._closed:
                return
            time.sleep(INTERVAL_S)
            size = host.current_rss()
            with self._lock:
                if self._closed or not self._armed.is_set():
                    continue
                if size > self._cell_limit and in_cell_code(sys._current_frames().get(self.main_thread)):
                    self._armed.clear()  # once a cell
                    self._trip(size)
                elif time.monotonic() - self._written >= JOURNAL_EVERY_S:
                    self._write_journal(size)

    def _trip(self, size: int) -> None:
        reached, limit = format_compared(size, self._cell_limit)
        if self._cell_limit == self.size:
            written = getattr(self.size, "written", "")
            past = f"past the guard of {limit}" + (f" ({written})" if written else "")
        else:
            past = f"past {limit}, the {format_size(self._cell_limit - self._cell_start)} it may grow above the guard"
        message = (
            f"tfmem guard: this cell took the kernel to {reached}, {past} (it grew "
            f"{format_size(size - self._cell_start, signed=True)} since it began); the cell was stopped here, the "
            "kernel and its variables are kept"
        )
        tripped = type("GuardTripped", (GuardTripped,), {"message": message, "__module__": GuardTripped.__module__})
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.main_thread), ctypes.py_object(tripped))


def above_guard_margin(start: int, size: int, limit: KernelLimit) -> int:
    """What a cell that began at ``start``, above the guard ``size``, may grow before it is stopped:
    ``margin`` of the guard, but no more than half of what is left below the kernel's limit."""
    return max(0, min(margin(size), (limit.bytes - start) // 2))


def install(shell: Any, size: int | None, limit: KernelLimit, current: Guard | None) -> Guard | None:
    """Replace the shell's guard (``current``) with one at ``size``, or none (``None``)."""
    if current is not None:
        current.close()
        shell.events.unregister("pre_run_cell", current.arm)
        shell.events.unregister("post_run_cell", current.disarm)
    if size is None:
        return None
    main = threading.main_thread().ident or threading.get_ident()
    guard = Guard(size, limit, main, KERNELS / f"{os.getpid()}.json")
    shell.events.register("pre_run_cell", guard.arm)
    shell.events.register("post_run_cell", guard.disarm)
    return guard


def _cause(entry: dict[str, Any]) -> str:
    """What most likely let the OOM killer come first, from the dead kernel's journal."""
    guard, limit, size = entry.get("guard"), entry.get("limit"), int(entry.get("size", 0))
    if not isinstance(guard, int) or not isinstance(limit, int):
        return ("a kernel that dies this way was most often killed for memory (the OOM killer): a step that allocates "
                "less at once lets %tfmem_guard stop the cell instead")
    source = entry.get("limit_source", "its limit")
    if guard >= limit:
        return (f"its guard, {format_size(guard)}, was not below what the kernel may have, {format_size(limit)} "
                f"({source}), so the OOM killer came first: %tfmem_guard alone sets one below it")
    return (f"a kernel that dies this way was most often killed for memory (the OOM killer): its guard was "
            f"{format_size(guard)} and it may have {format_size(limit)} ({source}), so the step that killed it took "
            f"more than the {format_size(max(0, limit - size))} left at once (one native call, or several between two "
            f"readings {INTERVAL_S * 1000:g} ms apart), past the guard and the limit before the guard could stop it")


def dead_kernels(folder: Path = KERNELS) -> list[str]:
    """What each kernel that died with a guarded cell running was doing, said once: its journal is
    removed as it is read. A journal of a kernel still running is left alone."""
    found = []
    for journal in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            entry = json.loads(journal.read_text())
            pid = int(entry["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if psutil.pid_exists(pid):
            continue
        journal.unlink(missing_ok=True)
        lines = str(entry.get("cell", "")).splitlines()
        number = entry.get("line")
        running = lines[number - 1] if isinstance(number, int) and 0 < number <= len(lines) else ""
        where = f"at its line {number}, `{running.strip()[:80]}`" if running.strip() else (
            f"the cell `{(lines or [''])[0].strip()[:80]}`")
        when = time.strftime("%H:%M:%S", time.localtime(float(entry.get("read", 0))))
        found.append(
            f"tfmem: the last kernel here (pid {pid}) died while running a cell, {where}, holding "
            f"{format_size(int(entry.get('size', 0)))} at its last reading ({when}); {_cause(entry)}"
        )
    return found
