"""The IPython extension: ``%load_ext pytest_tfmem`` in IPython or a Jupyter notebook.

- ``%%tfmem`` measures a cell as a test's window is measured (``core.measure.Monitor``): its exact
  peak above where it started (the kernel's high-water mark, reset for the cell), what it left
  behind once its young garbage was collected, and the frameworks' views (TensorFlow's allocators,
  JAX's and PyTorch's devices) where they are loaded.
- ``%%tfmem 2GB`` also holds the cell to that budget: over it, the cell ends in one error
  (``BudgetExceeded``, an ``Exception`` here) with the figures and what used the memory. The
  cell's variables stay as the cell left them; the kernel is untouched.
- ``%tfmem STATEMENT`` (``%tfmem 2GB STATEMENT``) does the same for one line, as ``%memit`` does.
- ``%tfmem_guard 6GB`` stops a cell that takes the kernel past 6 GB where it has reached
  (``guard``); ``%tfmem_guard`` alone sets the guard below what the kernel may have (its memory
  cgroup's limit, JupyterHub's ``MEM_LIMIT``, the machine's memory); ``%tfmem_guard off`` removes
  it. A kernel killed with a guarded cell running is named by the next ``%load_ext pytest_tfmem``
  in the same folder.
- ``%tfmem_auto on`` prints one line after every cell: its peak, what it kept, the kernel's size
  against its limit (``cell_report``); ``%tfmem_auto off``.

A budget's failure is shown as the cell's error, without tfmem's frames (IPython's
``_render_traceback_``).

Bad input (``%%tfmem 2 gigs``) is a one-line usage error that runs nothing.
"""

from __future__ import annotations

import gc
from typing import Any

from pytest_tfmem import cell_report, guard
from pytest_tfmem.core.measure import Monitor
from pytest_tfmem.core.retained import read_collected_level
from pytest_tfmem.core.verdict import WHAT_USED, check_budget, describe_views, what_used
from pytest_tfmem.errors import BudgetExceeded, TfmemFailure, failure
from pytest_tfmem.probes import host
from pytest_tfmem.units import SIZE_FORMS, format_limit, format_size, parse_size

HELP = """Measure a cell (%%tfmem) or a line (%tfmem STATEMENT), optionally against a budget.

    %%tfmem              the cell's peak, what it left behind, the frameworks' views
    %%tfmem 2GB          the same, and the cell fails (BudgetExceeded) over 2 GB
    %tfmem x = f()       one line; %tfmem 2GB x = f() with a budget

peak: the most memory the cell needed above where it started, exact (the kernel's high-water
mark of this process, reset for the cell; TensorFlow's allocators where TensorFlow is loaded);
left behind: the process after the cell, its young garbage collected and freed heap handed
back, less before it (what its variables and caches keep)."""


def refuse_options(first: str) -> None:
    """The magics take no option: ``--budget=2GB`` or ``-q`` is named, not run as code."""
    if first.startswith("-"):
        raise ValueError(f"unknown option {first!r}: %tfmem takes a budget (2GB) and a statement, %%tfmem a budget")


def split_budget(line: str) -> tuple[int | None, str]:
    """``'2GB x = f()'`` -> (budget, statement): a first word that is no number is the statement's.
    Raises ``ValueError`` naming a first word that is a number but no size (``2`` in ``2 x = 1``),
    or an option."""
    first, _, rest = line.strip().partition(" ")
    refuse_options(first)
    if not first or not first[0].isdigit():
        return None, line.strip()
    return parse_size(first, what="budget"), rest.strip()


def cell_budget(line: str) -> int | None:
    """``%%tfmem 2GB``: the line is the budget, or nothing (``ValueError`` names it whole)."""
    refuse_options(line.strip())
    return parse_size(line.strip(), what="budget") if line.strip() else None


def collect_young() -> None:
    """Python's two younger generations: what the kernel made since its last collection. A full
    collection walks every object a notebook holds (33 ms a cell in a bare IPython shell here,
    ``python -m benchmarks.magic_cost``); garbage in the oldest generation is held, never reused
    unseen, so no figure reads low for it."""
    gc.collect(1)


def measure(run: Any, budget: int | None) -> tuple[list[str], TfmemFailure | None]:
    """Run ``run()`` in a window: the lines to print, and the budget's failure (an ``Exception``
    here) where it was over."""
    collect_young()
    before = read_collected_level()
    loaded = cell_report.loaded_frameworks()
    monitor = Monitor(release_first=False)
    monitor.start()
    try:
        run()
    finally:
        measurement = monitor.stop()
    collect_young()
    left = read_collected_level().held - before.held
    lines = [
        f"tfmem: peak {format_size(measurement.peak)} ({describe_views(measurement)}); "
        f"left behind {format_size(left, signed=True)}{cell_report.first_imports_note(loaded)}"
    ]
    verdict = check_budget(measurement, budget)
    if verdict is not None and not verdict.ok:
        used = what_used(measurement)
        over = failure(BudgetExceeded, f"tfmem: {verdict.message}\ntfmem: {WHAT_USED}{used}")
        return lines, shown_without_frames(over)
    return lines + ([f"tfmem: {verdict.message}"] if verdict is not None else []), None


def shown_without_frames(error: TfmemFailure) -> TfmemFailure:
    """IPython shows ``error`` as the cell's error, its class and message alone: the frames it was
    raised from are tfmem's, which say nothing of the cell (IPython asks ``_render_traceback_``)."""
    text = f"{type(error).__name__}: {error}".splitlines()
    error._render_traceback_ = lambda: text
    return error


GUARD_HELP = """Stop a cell that takes the kernel past a size, before the OOM killer takes the kernel.

    %tfmem_guard 6GB     while a cell runs, the kernel's size is read every 20 ms; past 6 GB
                         the cell stops where it is (GuardTripped), the kernel and its
                         variables stay
    %tfmem_guard         the same, below what the kernel may have: its memory cgroup's limit,
                         JupyterHub's MEM_LIMIT or the machine's memory, less a tenth of it
    %tfmem_guard off     no guard

A cell that begins above the guard (a stopped cell's variables stay) may grow by a margin the
guard names, no more. One native call that allocates past the guard and the kernel's limit at once
cannot be stopped before it returns."""

AUTO_HELP = """One line after every cell: its peak, what it kept, the kernel's size against its limit.

    %tfmem_auto on       tfmem: peak +190.7 MiB, kept +0.4 MiB; the kernel 1.21 GiB of 23.4 GiB (...)
    %tfmem_auto off

peak: the cell's exact peak above where it began (the kernel's high-water mark, reset for the
cell); kept: the kernel's size after the cell less before. Nothing is collected or handed back
first, to keep it under a millisecond: after a large free, a cell may reuse memory the kernel still
holds and read low (%%tfmem hands freed memory back before it measures)."""


def guard_limit(line: str, limit: guard.KernelLimit) -> int | None:
    """``%tfmem_guard 6GB``: the guard's size, ``None`` for ``off``; ``ValueError`` names anything else."""
    words = line.strip()
    if words == "off":
        return None
    return guard.guard_size(words, limit, host.current_rss())


def auto_on(line: str) -> bool:
    """``%tfmem_auto on`` / ``off``; ``ValueError`` names anything else."""
    words = line.strip()
    if words not in ("on", "off"):
        raise ValueError(f"%tfmem_auto takes on or off, not {words!r}")
    return words == "on"


def load_ipython_extension(ipython: Any) -> None:
    from IPython.core.error import UsageError
    from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class

    @magics_class
    class TfmemMagics(Magics):
        kernel_guard: guard.Guard | None = None
        report: cell_report.CellReport | None = None

        @line_magic
        def tfmem_guard(self, line: str) -> None:
            limit = guard.kernel_limit()
            try:
                size = guard_limit(line, limit)
            except ValueError as error:
                raise UsageError(f"{error}\n{GUARD_HELP.splitlines()[0]}") from None
            self.kernel_guard = guard.install(self.shell, size, limit, self.kernel_guard)
            if size is None:
                print("tfmem guard: off")
                return
            below = (f"{limit.describe()} less a margin of {format_size(limit.bytes - size)}" if not line.strip()
                     else f"the kernel may have {limit.describe()}")
            print(f"tfmem guard: a cell that takes the kernel past {format_limit(size)} is stopped there ({below}; "
                  f"it holds {format_size(host.current_rss())} now)")

        @line_magic
        def tfmem_auto(self, line: str) -> None:
            try:
                on = auto_on(line)
            except ValueError as error:
                raise UsageError(f"{error}\n{AUTO_HELP.splitlines()[0]}") from None
            self.report = cell_report.install(self.shell, on, self.report)
            print(f"tfmem auto: {'a line after every cell' if on else 'off'}")

        @line_cell_magic
        def tfmem(self, line: str, cell: str | None = None) -> None:
            __tracebackhide__ = True  # IPython shows the cell's error, not tfmem's frames
            try:
                budget, source = (cell_budget(line), cell) if cell is not None else split_budget(line)
            except ValueError as error:
                raise UsageError(f"{error}\n{HELP.splitlines()[0]}") from None
            if not source.strip():
                raise UsageError(f"%tfmem needs a statement (or use %%tfmem for a cell); budgets: {SIZE_FORMS}")
            assert self.shell is not None
            namespace = self.shell.user_ns
            code = compile(source, "<tfmem cell>" if cell is not None else "<tfmem line>", "exec")
            lines, over = measure(lambda: exec(code, namespace), budget)
            if over is not None:
                raise over
            print("\n".join(lines))

    TfmemMagics.tfmem.__doc__ = HELP
    TfmemMagics.tfmem_guard.__doc__ = GUARD_HELP
    TfmemMagics.tfmem_auto.__doc__ = AUTO_HELP
    ipython.register_magics(TfmemMagics)
    for line in guard.dead_kernels():  # a kernel of this folder the OOM killer took with a guarded cell running
        print(line)
