"""What a process that a test starts or uses books apart from the test: its own start and its first imports.

A notebook's kernel (nbmake starts one for each notebook, nbval one for all its cells) pays its
start, and the first ``import tensorflow`` or ``import keras`` of a notebook, once: 585 MiB before
a cell of the notebook's own work. Such a process keeps its books in a file of a folder the
session names (``FOLDER``, ``<pid>.json``), and the children probe (``probes.children``) leaves
what it booked out of the window that saw it (``ProcessBooks.booked``), as a test's own first
imports are left out of its figure (``probes.imports``).

The process's side is an IPython extension (``load_ipython_extension``: the kernelspecs the
session writes load it with ``--ext``): it books the kernel's size once the kernel has started,
then each outermost first import's kept size (``probes.imports.ImportLedger``), the file written
whole after each booking. Times are ``time.monotonic()``: one clock for every process of the machine
on Linux, so a window knows which bookings fell inside it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FOLDER = "TFMEM_PROCESS_BOOKS"  # the environment variable naming the folder
KERNEL_START = "the kernel's start"


@dataclass(frozen=True)
class Booking:
    """What a process booked apart: ``what`` (``the kernel's start``, ``first import of keras``)."""

    what: str
    bytes: int
    at: float  # time.monotonic() when it ended


class BooksWriter:
    """A process's own books, written whole to ``path`` after each booking."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bookings: list[Booking] = []

    def book(self, what: str, size: int) -> None:
        self.bookings.append(Booking(what, size, time.monotonic()))
        written = self.path.with_name(f".{self.path.name}.new")
        try:  # whole or not at all: the reader never sees half a file
            written.write_text(json.dumps({"pid": os.getpid(), "bookings": [vars(one) for one in self.bookings]}))
            os.replace(written, self.path)
        except OSError:  # a folder gone (the session ended): the process runs on unbooked
            pass

    def import_started(self, module: str) -> None:
        """``probes.imports.ImportListener``: nothing to do until the import is booked."""

    def import_finishing(self, module: str) -> None:
        """``probes.imports.ImportListener``."""

    def import_booked(self, booking: Any) -> None:
        """``probes.imports.ImportListener``: an outermost first import ended; book what it kept."""
        if booking.host_bytes > 0:
            self.book(f"first import of {booking.module}", booking.host_bytes)


_writer: BooksWriter | None = None


def load_ipython_extension(ipython: Any) -> None:
    """In a kernel a session started (``FOLDER`` set): book its start, then its first imports."""
    global _writer
    folder = os.environ.get(FOLDER)
    if not folder or _writer is not None:
        return
    from pytest_tfmem.probes import host
    from pytest_tfmem.probes.imports import ImportLedger

    _writer = BooksWriter(Path(folder) / f"{os.getpid()}.json")
    _writer.book(KERNEL_START, host.current_rss())
    ledger = ImportLedger(host.HostRSS())
    ledger.add_listener(_writer)
    ledger.install()


class ProcessBooks:
    """The books the processes of a session keep, read by the windows that see those processes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @classmethod
    def from_environment(cls) -> ProcessBooks | None:
        folder = os.environ.get(FOLDER)
        return cls(Path(folder)) if folder else None

    def booked_bytes(self, pid: int) -> int:
        """All that process ``pid`` booked apart."""
        return sum(booking.bytes for booking in self._bookings(pid))

    def _bookings(self, pid: int) -> list[Booking]:
        try:
            data = json.loads((self.folder / f"{pid}.json").read_text())
            return [Booking(str(one["what"]), int(one["bytes"]), float(one["at"])) for one in data["bookings"]]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def booked(self, pid: int, since: float, started_in_window: bool) -> list[Booking]:
        """What process ``pid`` booked apart that a window opened at ``since`` (``time.monotonic()``)
        saw: every booking of a process the window started (its start among them), the bookings
        made since the window opened of one running before it."""
        bookings = self._bookings(pid)
        return bookings if started_in_window else [one for one in bookings if one.at >= since]
