"""docs/notebooks/magics.ipynb, executed for real: its cells run in a fresh ipykernel (nbclient) and
their outputs are written into it, as docs/notebooks.md shows them.

    python scripts/doc_notebook.py [NOTEBOOK]

A cell that raises keeps its error as its output (the budget's ``BudgetExceeded``, the guard's
``GuardTripped``); the cells after it still run, so the notebook shows that the kernel and the
variables live on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "docs" / "notebooks" / "magics.ipynb"
CELLS = (
    "%load_ext pytest_tfmem\nimport numpy as np",
    "%%tfmem\nkept = np.ones(50 * 2**20, dtype=np.uint8)\n"
    "temporary = np.ones(30 * 2**20, dtype=np.uint8)\ndel temporary",
    "%tfmem 100MB line = np.ones(10 * 2**20, dtype=np.uint8)",
    "%%tfmem 20MB\nbig = np.ones(40 * 2**20, dtype=np.uint8)",
    "print(f\"the kernel lives on: kept {kept.nbytes >> 20} MiB, big {big.nbytes >> 20} MiB\")",
    "%tfmem_auto on",
    "temporary = np.ones(50 * 2**20, dtype=np.uint8)\ndel temporary",
    "%tfmem_auto off",
    "%tfmem_guard 500MB",
    "import time\n\nbatches = []\nfor _ in range(100):\n    batches.append(np.ones(20 * 2**20, dtype=np.uint8))\n"
    "    time.sleep(0.01)",
    "print(f\"stopped after {len(batches)} batches; kept {kept.nbytes >> 20} MiB is still here\")",
    "time.sleep(0.2)\nprint(\"a cell that grows nothing runs on\")",
    "del batches",
    "%tfmem_guard",
)


def executed(cells: tuple[str, ...] = CELLS, timeout: int = 300) -> nbformat.NotebookNode:
    """A notebook of ``cells``, run in a fresh python3 kernel, with its outputs."""
    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(book, timeout=timeout, kernel_name="python3", allow_errors=True).execute()
    return book


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", nargs="?", type=Path, default=NOTEBOOK, help=f"where to write it ({NOTEBOOK})")
    args = parser.parse_args(argv)
    args.notebook.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(executed(), str(args.notebook))
    print(f"written: {args.notebook}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
