"""``%tfmem_guard 6GB``: the kernel watches its own size while a cell runs, and stops the cell
before the machine's OOM killer stops the kernel.

While a cell runs, a thread reads the kernel's size (RSS on Linux) every ``INTERVAL_S``; once it
passes the guard, the cell is stopped where it has reached: ``GuardTripped`` is raised in the
kernel's main thread (``PyThreadState_SetAsyncExc``, delivered between two Python bytecodes), an
``Exception`` with the figures: the size, the guard, what the cell grew from its start. The kernel
and every variable stay; so do those the cell made before it stopped. Between cells the thread
waits on an event, reading nothing: an idle kernel pays nothing.

What it cannot stop: one native call that allocates past both the guard and the machine's memory
(``np.ones`` of 40 GB) runs to its end before Python reads another bytecode; the OOM killer may
take the kernel there. It stops what grows in steps: a fit over epochs, a loop appending batches,
models built in a loop. So while a cell runs the guard also keeps a journal (``KERNELS``, one file
a kernel, written whole at most every ``JOURNAL_EVERY_S``): the cell, the line the main thread is
at, the kernel's size. The next ``%load_ext pytest_tfmem`` in the same folder names a kernel that
died with a cell running (``dead_kernels``), as ``tfmem last`` does for a pytest session.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from pytest_tfmem.files import write_text_atomic
from pytest_tfmem.probes import host
from pytest_tfmem.units import format_limit, format_size

INTERVAL_S = 0.02  # how often the kernel's size is read while a cell runs
JOURNAL_EVERY_S = 0.5
KERNELS = Path(".tfmem") / "kernels"  # under the kernel's working folder: <pid>.json while a cell runs
# Where a cell's code says it comes from: IPython's shell, ipykernel (its cells' files in the temporary
# folder), and the %tfmem magics.
CELL_FILES = ("<ipython-input", os.path.join(tempfile.gettempdir(), "ipykernel_"), "<tfmem")


class GuardTripped(Exception):  # named for what happened, like the other failures
    """The kernel grew past ``%tfmem_guard`` while a cell ran; the cell was stopped there."""

    message = ""

    def __init__(self, *args: object) -> None:  # raised by its class alone: the message rides on it
        super().__init__(*(args or (self.message,)))


class Guard:
    """One kernel's guard: its limit, armed around each cell (``pre_run_cell``/``post_run_cell``) for
    one thread that waits, unread, between cells."""

    def __init__(self, limit: int, main_thread: int, journal: Path) -> None:
        self.limit = limit
        self.main_thread = main_thread
        self.journal = journal
        self._armed = threading.Event()
        self._lock = threading.Lock()  # a trip and the cell's end never cross
        self._closed = False
        self._cell_start = 0
        self._cell: dict[str, Any] = {}
        self._written = 0.0
        threading.Thread(target=self._watch, name="tfmem-guard", daemon=True).start()

    def arm(self, info: Any = None) -> None:
        """A cell starts (IPython's ``pre_run_cell``, with the cell's ``info``): watch it."""
        self._cell_start = host.current_rss()
        source = str(getattr(info, "raw_cell", "") or "")
        self._cell = {"pid": os.getpid(), "cell": source[:2000], "started": time.time()}
        self._write_journal(self._cell_start)
        self._armed.set()

    def disarm(self, *_: object) -> None:
        """The cell ended: stop watching (an idle kernel is not read), and the journal goes."""
        with self._lock:
            self._armed.clear()
        self.journal.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._armed.set()  # the thread wakes, and ends
        self.journal.unlink(missing_ok=True)

    def _write_journal(self, size: int) -> None:
        """The cell, the line the kernel's main thread is at, its size: written whole (a kill never
        leaves half a file), at most every ``JOURNAL_EVERY_S``."""
        frame = sys._current_frames().get(self.main_thread)
        line = None
        while frame is not None and line is None:  # the innermost frame of the cell's own code
            if frame.f_code.co_filename.startswith(CELL_FILES):
                line = frame.f_lineno
            frame = frame.f_back
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
                if size > self.limit:
                    self._armed.clear()  # once a cell
                    self._trip(size)
                elif time.monotonic() - self._written >= JOURNAL_EVERY_S:
                    self._write_journal(size)

    def _trip(self, size: int) -> None:
        message = (
            f"tfmem guard: the kernel reached {format_size(size)} > guard {format_limit(self.limit)} while this "
            f"cell ran (it grew {format_size(size - self._cell_start, signed=True)} since the cell began); the "
            "cell was stopped here, the kernel and its variables are kept"
        )
        tripped = type("GuardTripped", (GuardTripped,), {"message": message, "__module__": GuardTripped.__module__})
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self.main_thread), ctypes.py_object(tripped))


def install(shell: Any, limit: int | None, current: Guard | None) -> Guard | None:
    """Replace the shell's guard (``current``) with one at ``limit``, or none (``None``)."""
    if current is not None:
        current.close()
        shell.events.unregister("pre_run_cell", current.arm)
        shell.events.unregister("post_run_cell", current.disarm)
    if limit is None:
        return None
    guard = Guard(limit, threading.main_thread().ident or threading.get_ident(), KERNELS / f"{os.getpid()}.json")
    shell.events.register("pre_run_cell", guard.arm)
    shell.events.register("post_run_cell", guard.disarm)
    return guard


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
        first = (str(entry.get("cell", "")).strip().splitlines() or [""])[0][:80]
        line = f", at its line {entry['line']}" if entry.get("line") else ""
        when = time.strftime("%H:%M:%S", time.localtime(float(entry.get("read", 0))))
        found.append(
            f"tfmem: the last kernel here (pid {pid}) died while running the cell `{first}`{line}, holding "
            f"{format_size(int(entry.get('size', 0)))} at its last reading ({when}); a kernel that dies this way was "
            "most often killed for memory (the OOM killer): a step that allocates less at once lets %tfmem_guard "
            "stop the cell instead"
        )
    return found
