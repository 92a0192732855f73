"""What ``%%tfmem`` and ``%tfmem_guard`` add to a notebook cell, side by side in one IPython shell.

    python -m benchmarks.magic_cost [--cells 200] [--tensorflow]

A real IPython shell (``IPython.testing.globalipapp``) in a process of its own, with
``%load_ext pytest_tfmem``, runs the same small cell (a 1 MiB NumPy array made and summed)
``--cells`` times plain and ``--cells`` times under ``%%tfmem``, alternating, and prints the
medians and their difference: what the magic costs a cell (its garbage collection, heap trim,
high-water mark reset, readings and printed line). Then the same plain cell with ``%tfmem_guard``
on (its thread started and stopped around each cell), and the kernel's CPU time over two idle
seconds with the guard on, as a share of those seconds. Then the cell with ``%tfmem_auto on`` (the
line printed after each cell) against the same cell plain, in alternating blocks of ten cells.
``--tensorflow`` imports TensorFlow first, as a Keras notebook has, so the collection sees its objects.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence

SHELL = r'''
import contextlib, io, json, statistics, sys, time
from IPython.testing.globalipapp import start_ipython

shell = start_ipython()
if {tensorflow}:
    shell.run_cell("import tensorflow as tf")
shell.run_line_magic("load_ext", "pytest_tfmem")
shell.run_cell("import numpy as np")
cell = "block = np.ones(2**20 // 8)\ntotal = float(block.sum())\n"
plain, measured = [], []
for number in range({cells}):
    for source, times in ((cell, plain), ("%%tfmem\n" + cell, measured)):
        with contextlib.redirect_stdout(io.StringIO()):
            started = time.perf_counter()
            shell.run_cell(source)
            times.append(time.perf_counter() - started)
shell.run_cell("%tfmem_guard")
guarded = []
for number in range({cells}):
    started = time.perf_counter()
    shell.run_cell(cell)
    guarded.append(time.perf_counter() - started)
cpu, wall = time.process_time(), time.perf_counter()
time.sleep(2)
idle = (time.process_time() - cpu) / (time.perf_counter() - wall)
shell.run_cell("%tfmem_guard off")
quiet, auto = [], []
for block in range(max(1, {cells} // 10)):
    for switch, times in (("off", quiet), ("on", auto)):
        with contextlib.redirect_stdout(io.StringIO()):
            shell.run_cell(f"%tfmem_auto {{switch}}")
            for number in range(10):
                started = time.perf_counter()
                shell.run_cell(cell)
                times.append(time.perf_counter() - started)
print(json.dumps({{"plain": statistics.median(plain[5:]), "measured": statistics.median(measured[5:]),
                   "guarded": statistics.median(guarded[5:]), "idle": idle,
                   "quiet": statistics.median(quiet), "auto": statistics.median(auto)}}))
'''


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=200, help="cells of each kind (default 200)")
    parser.add_argument("--tensorflow", action="store_true", help="import TensorFlow in the shell first")
    args = parser.parse_args(argv)
    done = subprocess.run([sys.executable, "-c", SHELL.format(cells=args.cells, tensorflow=args.tensorflow)],
                          capture_output=True, text=True, check=True, timeout=1800)
    medians = json.loads(done.stdout.strip().splitlines()[-1])
    cost = medians["measured"] - medians["plain"]
    shell = "with TensorFlow imported" if args.tensorflow else "NumPy only"
    print(f"%%tfmem on a small cell ({shell}, {args.cells} cells each, medians): plain "
          f"{medians['plain'] * 1000:.2f} ms, measured {medians['measured'] * 1000:.2f} ms, "
          f"the magic costs {cost * 1000:+.2f} ms a cell")
    print(f"%tfmem_guard on: the cell {medians['guarded'] * 1000:.2f} ms "
          f"({(medians['guarded'] - medians['plain']) * 1000:+.2f} ms); the idle kernel's CPU "
          f"{medians['idle'] * 100:.2f}% of two seconds")
    print(f"%tfmem_auto on: the cell {medians['auto'] * 1000:.2f} ms against {medians['quiet'] * 1000:.2f} ms plain "
          f"in the same blocks ({(medians['auto'] - medians['quiet']) * 1000:+.2f} ms a cell, its line printed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
