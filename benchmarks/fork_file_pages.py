"""What a small Keras fit adds to RSS in the process that imported Keras and in forks of it, by kind.

    KERAS_BACKEND=torch python -m benchmarks.fork_file_pages

The process imports Keras (and its backend) and forks twice, as tfmem's isolation template does;
each fork and then the process start the backend's runtime with one tiny computation (tfmem books
that apart) and run the same fit, each printing the growth of ``VmRSS`` and of its parts,
``RssAnon`` (memory the process wrote) and ``RssFile`` (pages of files it mapped, library code
among them). Linux does not copy a fork the page table entries of file mappings that were never
written, so a plain fork maps again each library page it runs, although the page is in the page
cache and shared: its ``RssFile`` grows by what the parent had mapped already. That is what a test
isolated in a fork counted beyond what it counts in process; the second fork first maps again the
file pages its parent had in memory (``pytest_tfmem.platforms.file_pages``), as tfmem's isolated
forks now do, and grows as the parent does (docs/isolation.md, "The figures of a forked test").
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

import numpy as np

from pytest_tfmem.platforms.file_pages import FilePages

FIELDS = ("VmRSS", "RssAnon", "RssFile")


def resident() -> dict[str, int]:
    """``VmRSS`` and its parts, in bytes."""
    found = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key = line.split(":", 1)[0]
            if key in FIELDS:
                found[key] = int(line.split()[1]) * 1024
    return found


def fit(keras: Any) -> None:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((16, 8), "float32"), np.ones((16, 4), "float32"), epochs=1, verbose=0)


def growth_of_a_fit(keras: Any) -> dict[str, int]:
    keras.ops.sum(keras.ops.ones((8, 8)) @ keras.ops.ones((8, 8)))  # the runtime's start, not the fit's
    before = resident()
    fit(keras)
    after = resident()
    return {key: after[key] - before[key] for key in FIELDS}


def growth_in_a_fork(keras: Any, file_pages: FilePages | None) -> dict[str, int]:
    """The growth of a fit in a fork of this process, which first maps ``file_pages`` again if given."""
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reading)
        if file_pages is not None:
            file_pages.map_again()
        os.write(writing, json.dumps(growth_of_a_fit(keras)).encode())
        os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as pipe:
        growth = json.loads(pipe.read())
    os.waitpid(pid, 0)
    return growth


def main() -> None:
    keras = importlib.import_module("keras")
    figures = {
        "fork": growth_in_a_fork(keras, None),
        "fork_mapped_again": growth_in_a_fork(keras, FilePages.read()),
        "parent": growth_of_a_fit(keras),
    }
    print(json.dumps({"backend": keras.backend.backend(), **figures}))
    for name, growth in figures.items():
        print(f"{name:17}  " + "  ".join(f"{key} +{growth[key] / 2**20:.1f} MiB" for key in FIELDS))


if __name__ == "__main__":
    main()
