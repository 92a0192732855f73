"""What ``--tfmem-session-limit`` costs: the start of each replacement process, and the session.

    python benchmarks/replacement_start.py [--repeats 3]

Runs twelve tests that each keep memory in a module-level list, as real ``pytest`` sessions:
plain (80 MiB each, ``--tfmem-session-limit=260MiB``) and in a module that imports TensorFlow
(100 MiB each, ``--tfmem-session-limit=800MB``), each without the limit and with it. Prints
each session's median wall time and, from the sessions with the limit, the summary's line on
the replacement processes (how many, how long each took from the request to being ready for
its first test).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as in the tests

WORKLOADS = {
    "plain": ("", 80, "260MiB"),
    "tensorflow": ("import tensorflow as tf\n", 100, "800MB"),
}
MODULE = """
import numpy as np
import pytest
{imports}
KEPT = []


@pytest.mark.parametrize("n", range(12))
def test_keeps(n):
    KEPT.append(np.ones({mib} * 2**20, dtype=np.uint8))
"""
STARTED = re.compile(r"\d+ replacement process\(es\) started .*")


def session(folder: Path, *args: str) -> tuple[float, str]:
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--tfmem-budget=4GB", *args],
        cwd=folder, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return time.perf_counter() - began, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    for name, (imports, mib, limit) in WORKLOADS.items():
        with tempfile.TemporaryDirectory() as directory:
            folder = Path(directory)
            (folder / "test_keeps.py").write_text(MODULE.format(imports=imports, mib=mib))
            plain, limited, lines = [], [], []
            for _ in range(options.repeats):
                plain.append(session(folder)[0])
                seconds, output = session(folder, f"--tfmem-session-limit={limit}")
                limited.append(seconds)
                lines += STARTED.findall(output)
            print(f"{name}: without the limit {statistics.median(plain):.2f} s, with {limit} "
                  f"{statistics.median(limited):.2f} s (median of {options.repeats})")  # fmt: skip
            for line in lines:
                print(f"  {line}")


if __name__ == "__main__":
    main()
