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
models built in a loop.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

from pytest_tfmem.probes import host
from pytest_tfmem.units import format_limit, format_size

INTERVAL_S = 0.02  # how often the kernel's size is read while a cell runs


class GuardTripped(Exception):  # noqa: N818  # named for what happened, like the other failures
    """The kernel grew past ``%tfmem_guard`` while a cell ran; the cell was stopped there."""

    message = ""

    def __init__(self, *args: object) -> None:  # raised by its class alone: the message rides on it
        super().__init__(*(args or (self.message,)))


class Guard:
    """One kernel's guard: its limit, armed around each cell (``pre_run_cell``/``post_run_cell``) for
    one thread that waits, unread, between cells."""

    def __init__(self, limit: int, main_thread: int) -> None:
        self.limit = limit
        self.main_thread = main_thread
        self._armed = threading.Event()
        self._lock = threading.Lock()  # a trip and the cell's end never cross
        self._closed = False
        self._cell_start = 0
        threading.Thread(target=self._watch, name="tfmem-guard", daemon=True).start()

    def arm(self, *_: object) -> None:
        """A cell starts: watch it."""
        self._cell_start = host.current_rss()
        self._armed.set()

    def disarm(self, *_: object) -> None:
        """The cell ended: stop watching (an idle kernel is not read)."""
        with self._lock:
            self._armed.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._armed.set()  # the thread wakes, and ends

    def _watch(self) -> None:
        while True:
            self._armed.wait()
            if self._closed:
                return
            time.sleep(INTERVAL_S)
            size = host.current_rss()
            with self._lock:
                if self._closed or not self._armed.is_set() or size <= self.limit:
                    continue
                self._armed.clear()  # once a cell
                self._trip(size)

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
    guard = Guard(limit, threading.main_thread().ident or threading.get_ident())
    shell.events.register("pre_run_cell", guard.arm)
    shell.events.register("post_run_cell", guard.disarm)
    return guard
