"""Where a measured test's time goes: the trivial TensorFlow suite under ``cProfile``, by module.

    python benchmarks/per_test_profile.py                 # about half a minute
    python benchmarks/per_test_profile.py --tests 300 --output profile.md

One session of ``benchmarks/suite_overhead.py``'s ``trivial-tf`` suite (tests that do nothing, in a
module that imports TensorFlow and Keras) runs with ``--tfmem-budget=4GB``, its test loop under
``cProfile`` (``benchmarks/profile_loop.py``). For
each of pytest-tfmem's modules it adds the time spent in its own functions and, for each call they
make outside the package (the standard library, ``/proc`` reads, ``gc``, ``json``), that call's
whole time, or its own time alone where it calls back into the package (pluggy reaching a hook,
``contextlib`` entering a step: what they reach is counted where it is).
The session's start and end (imports, the summary) are not profiled, and of the test loop only
functions called at least once per test count (a first test's one-time work is not per-test
time). The profiler slows Python code more than system calls: read the shares, not the
microseconds. Background threads (the journal's readings, the children watch) are not profiled;
``suite_overhead.py`` measures them with everything else.
"""

from __future__ import annotations

import argparse
import collections
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``pytest_tfmem`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import machine
from benchmarks.suite_overhead import TRIVIAL_MODULE, session_command, session_environment
from pytest_tfmem.files import write_text_atomic

PACKAGE = os.sep + "pytest_tfmem" + os.sep


def component(path: str) -> str | None:
    """``core/record.py`` for a file of the package, else ``None``."""
    return path.split(PACKAGE, 1)[1] if PACKAGE in path else None


def reentering(stats: pstats.Stats) -> set[tuple[str, int, str]]:
    """Functions outside the package whose calls reach back into it (``contextlib`` entering a
    step, a generator resumed by ``next``): their whole time would count the package twice."""
    callers_of = {function: set(entry[4]) for function, entry in stats.stats.items()}  # type: ignore[attr-defined]
    found: set[tuple[str, int, str]] = set()
    pending = [function for function in callers_of if component(function[0]) is not None]
    while pending:
        for caller in callers_of.get(pending.pop(), ()):
            if component(caller[0]) is None and caller not in found:
                found.add(caller)
                pending.append(caller)
    return found


def per_test_times(stats: pstats.Stats, tests: int) -> dict[str, float]:
    """Seconds per module of the package, over the functions called at least ``tests`` times."""
    spent: collections.Counter[str] = collections.Counter()
    reenter = reentering(stats)
    for function, (_, calls, own, _, callers) in stats.stats.items():  # type: ignore[attr-defined]
        owner = component(function[0])
        if owner is not None:
            if calls >= tests:
                spent[owner] += own
            continue
        for (caller_path, _, _), (_, caller_calls, edge_own, edge_cumulative) in callers.items():
            caller = component(caller_path)
            if caller is not None and caller_calls >= tests:
                spent[caller] += edge_own if function in reenter else edge_cumulative
    return dict(spent)


def profile_table(tests: int, top: int, warmed_up: bool = False) -> str:
    """The Markdown table: one profiled session of ``tests`` trivial tests, the ``top`` modules.
    ``warmed_up``: a session run before compiled and cached the modules (else one is run first)."""
    with tempfile.TemporaryDirectory(prefix="tfmem-per-test-profile-") as temporary:
        suite = Path(temporary) / "suite"
        suite.mkdir()
        (suite / "pytest.ini").write_text("[pytest]\n")
        (suite / "test_trivial.py").write_text(TRIVIAL_MODULE.format(count=tests))
        environment = {**session_environment(suite), "PROFILE_LOOP_FILE": str(suite / "profile.out")}
        command = session_command(with_plugin=True)
        profiled = [*command, "-p", "benchmarks.profile_loop"]
        for run in ([profiled] if warmed_up else [command, profiled]):  # a first run caches compiled modules
            subprocess.run(run, cwd=suite, env=environment, stdout=subprocess.DEVNULL, check=False)
        stats = pstats.Stats(str(suite / "profile.out"))
    spent = per_test_times(stats, tests)
    total = sum(spent.values())
    lines = [
        "| module | per test (profiled) | share |",
        "|---|---:|---:|",
        *(
            f"| `{name}` | {seconds / tests * 1e6:.0f} us | {seconds / total:.0%} |"
            for name, seconds in sorted(spent.items(), key=lambda item: -item[1])[:top]
        ),
        f"| all of pytest-tfmem | {total / tests * 1e6:.0f} us | 100% |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=300, help="trivial tests in the session (default 300)")
    parser.add_argument("--top", type=int, default=12, help="modules listed (default 12)")
    parser.add_argument("--output", help="also write the table, with the command and the machine, to this file")
    args = parser.parse_args(argv)
    table = profile_table(args.tests, args.top)
    print(table)
    if args.output:
        heading = (
            f"{machine.written_by('benchmarks/per_test_profile.py', argv)}: the `trivial-tf` suite "
            f"({args.tests} tests) under `cProfile`; see the module docstring of `benchmarks/per_test_profile.py`.\n\n"
        )
        write_text_atomic(args.output, heading + table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
