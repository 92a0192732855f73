"""``%tfmem_auto on``: one short line after every cell, what ``%%tfmem`` says at a fraction of its cost.

    tfmem: peak +190.7 MiB, kept +0.4 MiB; the kernel 1.21 GiB of 23.4 GiB (the machine's memory)

Before a cell (IPython's ``pre_run_cell``) the kernel's peak mark is reset and its size read; after
it (``post_run_cell``) both are read again: the cell's exact peak above where it began, what it
kept (its size after, less before: nothing is collected or handed back, so freed memory the
allocator keeps still counts), and the kernel's size against what it may have
(``guard.kernel_limit``). A cell that imported a framework for the first time in the kernel says
so: its figures carry that framework's start (``first import of tensorflow, keras``). Three reads
of ``/proc`` and one write: about a tenth of a millisecond a cell (``python -m benchmarks.magic_cost``).
"""

from __future__ import annotations

import sys
from typing import Any

from pytest_tfmem import frameworks, platforms
from pytest_tfmem.guard import KernelLimit, kernel_limit
from pytest_tfmem.probes import host
from pytest_tfmem.units import format_compared, format_size

# The modules whose first import in a cell is said: the frameworks, and Keras.
FIRST_IMPORTS = tuple(sorted({framework.module for framework in frameworks.KNOWN} | {"keras", "tf_keras"}))


def loaded_frameworks() -> set[str]:
    """The frameworks (``FIRST_IMPORTS``) imported in the kernel so far."""
    return {name for name in FIRST_IMPORTS if name in sys.modules}


def first_imports_note(before: set[str]) -> str:
    """``; first import of tensorflow, keras in this cell: ...`` for those imported since ``before``."""
    imported = sorted(loaded_frameworks() - before)
    if not imported:
        return ""
    return f"; first import of {', '.join(imported)} in this cell: its start is in these figures"


class CellReport:
    """The line after each cell; registered on the shell's events by ``install``."""

    def __init__(self, limit: KernelLimit) -> None:
        self.limit = limit
        self._platform = platforms.current()
        self._start: int | None = None  # the kernel's size as the cell began; None before the first
        self._loaded: set[str] = set()

    def before(self, *_: object) -> None:
        self._loaded = loaded_frameworks()
        self._platform.reset_peak_mark()
        self._start = host.current_rss()

    def after(self, *_: object) -> None:
        if self._start is not None:  # not the cell that turned the report on: its start was not read
            print(self.line(self._start))
            self._start = None

    def line(self, start: int) -> str:
        now = host.current_rss()
        peak = max(now, self._platform.peak_mark() or now)
        size, limit = format_compared(now, self.limit.bytes)
        grew, kept = format_size(peak - start, signed=True), format_size(now - start, signed=True)
        text = f"tfmem: peak {grew}, kept {kept}; the kernel {size} of {limit} ({self.limit.source})"
        return text + first_imports_note(self._loaded)


def install(shell: Any, on: bool, current: CellReport | None) -> CellReport | None:
    """Replace the shell's report (``current``) with one, or none."""
    if current is not None:
        shell.events.unregister("pre_run_cell", current.before)
        shell.events.unregister("post_run_cell", current.after)
    if not on:
        return None
    report = CellReport(kernel_limit())
    shell.events.register("pre_run_cell", report.before)
    shell.events.register("post_run_cell", report.after)
    return report
