"""First imports are nobody's peak: the ledger's spans, left out of every open window.

The first ``import tensorflow`` in the process costs ~580 MiB; whichever test does it would read
that much more than the same test after another one imported TensorFlow. While a first import
runs (``probes.imports``), the open windows leave it out: its peak and what it kept count in no
view, and the test's section names it instead. When the import loaded a framework in use
(TensorFlow, JAX, PyTorch), its runtime is started and its first use paid inside the span too
(``TfmemManager.prepare_frameworks``, the device configuration hook first, then
``first_uses_due``), as they are before the first test where the framework was loaded earlier,
and its views open for the rest of the window: a test that imports TensorFlow reads what it
reads when another test imported it first. Not where a framework's own code made the import (JAX
imports parts of itself lazily while it compiles): the next test's set-up prepares it then.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from types import FrameType

from pytest_tfmem import frameworks
from pytest_tfmem.core.measure import probes
from pytest_tfmem.probes.imports import FirstImport, ImportLedger
from pytest_tfmem.units import format_size

MIB = 2**20
SECTION_LINES = 5  # the largest first imports named in a test's section; the rest on one line


class LeaveOutFirstImports:
    """The core's listener on the session's ledger (``probes.imports.ImportListener``)."""

    def __init__(self, prepare_frameworks: Callable[[str], object]) -> None:
        self.prepare_frameworks = prepare_frameworks

    def import_started(self, module: str) -> None:
        probes().leave_out_begin()

    def import_finishing(self, module: str) -> None:
        if not frameworks.is_framework_module(importer()):  # not inside a framework's own code (a lazy import)
            self.prepare_frameworks(module)  # once per framework and session

    def import_booked(self, booking: FirstImport) -> None:
        probes().leave_out_end()


# The modules of the import system, and ours, between an import statement and a listener.
_IMPORT_MACHINERY = ("importlib", "_frozen_importlib", "pytest_tfmem.probes.imports", "pytest_tfmem.core.first_imports")


def importer() -> str:
    """The module whose code made the import that is ending: the first frame of the stack outside
    the import system (by module name, or by file name as ``warnings`` tells its frames) and the
    ledger; ``""`` where none is."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__")
        filename = frame.f_code.co_filename
        machinery = "importlib" in filename and "_bootstrap" in filename
        if not machinery and not (isinstance(name, str) and name.startswith(_IMPORT_MACHINERY)):
            return name if isinstance(name, str) else ""
        frame = frame.f_back
    return ""


def remove_inherited_ledgers() -> None:
    """Take out of ``sys.meta_path`` any ledger this process inherited from the one it was forked
    from (an isolation template made from a session that measured): its listeners are that
    session's, and would start TensorFlow's runtime in a process that must fork."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, ImportLedger)]


def _named(booking: FirstImport) -> str:
    raised = " (it raised)" if booking.raised else ""
    return (
        f"first import of {booking.module}{raised}: {format_size(booking.host_bytes, signed=True)}, not charged "
        f"(its peak {format_size(booking.peak_bytes, signed=True)}, {booking.duration_s:.2f} s)"
    )


def section_lines(bookings: Sequence[FirstImport]) -> list[str]:
    """What a test's section says of the first imports its window left out: the largest by name,
    the others on one line where they kept 1 MiB or more together (all are in the JSON report)."""
    large = sorted((b for b in bookings if b.peak_bytes >= MIB), key=lambda b: b.peak_bytes, reverse=True)
    named = large[:SECTION_LINES]
    rest = [b for b in bookings if b not in named]
    lines = [_named(booking) for booking in named]
    kept = sum(b.host_bytes for b in rest)
    if len(large) > len(named) or kept >= MIB:
        lines.append(f"first imports of {len(rest)} more module(s): {format_size(kept, signed=True)}, not charged")
    return lines
