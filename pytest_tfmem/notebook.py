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
  (``guard``); ``%tfmem_guard off`` removes it. A kernel killed with a guarded cell running is
  named by the next ``%load_ext pytest_tfmem`` in the same folder.

Bad input (``%%tfmem 2 gigs``) is a one-line usage error that runs nothing.
"""

from __future__ import annotations

import gc
from typing import Any

from pytest_tfmem import guard
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
        f"left behind {format_size(left, signed=True)}"
    ]
    verdict = check_budget(measurement, budget)
    if verdict is not None and not verdict.ok:
        used = what_used(measurement)
        return lines, failure(BudgetExceeded, f"tfmem: {verdict.message}\ntfmem: {WHAT_USED}{used}")
    return lines + ([f"tfmem: {verdict.message}"] if verdict is not None else []), None


GUARD_HELP = """Stop a cell that takes the kernel past a size, before the OOM killer takes the kernel.

    %tfmem_guard 6GB     while a cell runs, the kernel's size is read every 20 ms; past 6 GB
                         the cell stops where it is (GuardTripped), the kernel and its
                         variables stay
    %tfmem_guard off     no guard

One native call that allocates past the guard and the machine's memory at once cannot be stopped
before it returns."""


def guard_limit(line: str) -> int | None:
    """``%tfmem_guard 6GB``: the limit, ``None`` for ``off``; ``ValueError`` names anything else."""
    words = line.strip()
    if words == "off":
        return None
    if not words:
        raise ValueError(f"%tfmem_guard needs a size or off; sizes: {SIZE_FORMS}")
    limit = parse_size(words, what="guard")
    held = host.current_rss()
    if limit <= held:
        raise ValueError(f"guard {words} is not above what the kernel holds already, {format_size(held)}: "
                         "give a larger size")
    return limit


def load_ipython_extension(ipython: Any) -> None:
    from IPython.core.error import UsageError
    from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class

    @magics_class
    class TfmemMagics(Magics):
        kernel_guard: guard.Guard | None = None

        @line_magic
        def tfmem_guard(self, line: str) -> None:
            try:
                limit = guard_limit(line)
            except ValueError as error:
                raise UsageError(f"{error}\n{GUARD_HELP.splitlines()[0]}") from None
            self.kernel_guard = guard.install(self.shell, limit, self.kernel_guard)
            if limit is None:
                print("tfmem guard: off")
                return
            print(f"tfmem guard: a cell that takes the kernel past {format_limit(limit)} is stopped there "
                  f"(it holds {format_size(host.current_rss())} now)")

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
    ipython.register_magics(TfmemMagics)
    for line in guard.dead_kernels():  # a kernel of this folder the OOM killer took with a guarded cell running
        print(line)
