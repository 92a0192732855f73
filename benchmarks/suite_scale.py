"""What pytest-tfmem costs as a suite grows: time and memory per test at 1 to 100,000 tests.

    python benchmarks/suite_scale.py                      # about 9 minutes on 2 cores
    python benchmarks/suite_scale.py --sizes 1,1000,5000 --frameworks none

Suites of trivial tests (one parametrized function that does nothing), in a module that imports
nothing (``none``) or TensorFlow and Keras (``tensorflow``, the runtime started), each run as a
whole session without the plugin (``-p no:tfmem``) and with ``--tfmem-budget=4GB`` (every test
measured), the two at the same time on one core, as ``benchmarks/suite_overhead.py`` runs its
pairs (its module docstring says why). For each session: its CPU time and its largest resident
size (``os.wait4``), and the size of the results journal it wrote.

Every suite but the largest runs as ``--repeat`` pairs (3 by default), and its row gives the
pair whose extra CPU time is the median, with every pair's extra CPU time beside it: a session's
start (importing TensorFlow) varies by a few tenths of a second, as much as a thousand trivial
tests cost, so one pair says little of the first slope. The largest suite runs once: its
slope is over the most tests, where that variation is a small part.

Each row after a suite's first gives the *slopes* from the row before it: the extra CPU time
and the extra memory of the session with tfmem, per test added. A one-test session's row gives
the fixed start (the plugin's import, its set-up and its summary), on its own, so the slopes
are what each test costs once a session runs, its summaries included. Memory that tfmem keeps
per test shows as a memory slope above zero; a cost per test that grows with the suite's length
shows as a time slope that rises from row to row.

A slope over the first thousand tests carries the variation of two sessions' starts and ends
(a tenth of a second is a tenth of a millisecond a test there), so each row also gives each
session's CPU time per test in its test loop, read inside the session (``benchmarks/gc_clock``:
from the first test's finish to the last's), and the difference (every pair's, where the suite
ran as several): what a test costs at that length of suite, with no start or end in it. Beside
it, how much of each session's figure was garbage collection: without tfmem, Python's own full
collections come where its count of long-lived objects says (each about 0.2 s with TensorFlow
loaded, 0.2 ms a test over a thousand tests); tfmem freezes what survives its young collections
and runs a full one by its own rules (docs/measurement.md, "What measuring costs").
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``pytest_tfmem`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import machine
from benchmarks.suite_overhead import Run, run_pairs, warm_up
from benchmarks.tables import markdown_table
from pytest_tfmem.units import format_size

PRELUDES = {
    "none": "",
    "tensorflow": "import tensorflow as tf\nimport keras\n\ntf.constant(1.0)  # the runtime started\n",
}

MODULE = '''import pytest
{prelude}

@pytest.mark.parametrize("index", range({count}))
def test_trivial(index):
    pass
'''

JOURNAL = Path(".tfmem") / "results.jsonl"
DOCS_PAGE = Path("docs") / "suite-overhead.md"


def write_suite(path: Path, framework: str, count: int) -> Path:
    path.mkdir(parents=True)
    (path / "pytest.ini").write_text("[pytest]\n")
    (path / "test_trivial.py").write_text(MODULE.format(prelude=PRELUDES[framework], count=count))
    return path


def job_name(framework: str, count: int) -> str:
    return f"{framework}-{count}"


def rows(frameworks: list[str], sizes: list[int], pairs: dict[str, list[dict[bool, Run]]],
         journals: dict[str, int]) -> list[list[str]]:
    """One row per suite: its sessions' figures, and the slopes from the row before it."""
    table = []
    for framework in frameworks:
        before: tuple[int, float, int] | None = None  # tests, extra CPU s, extra bytes
        for count in sizes:
            repeats = sorted(pairs[job_name(framework, count)], key=lambda pair: pair[True].cpu_s - pair[False].cpu_s)
            shown = repeats[len(repeats) // 2]
            plain, measured = shown[False], shown[True]
            extra_s, extra_bytes = measured.cpu_s - plain.cpu_s, measured.peak_bytes - plain.peak_bytes
            each = ", ".join(f"{pair[True].cpu_s - pair[False].cpu_s:+.2f}" for pair in repeats)
            extra_cell = f"{extra_s:+.2f} s" + (f" ({each})" if len(repeats) > 1 else "")
            in_loop, collecting = loop_cells(shown, repeats)
            if before is None:
                time_slope = memory_slope = "-"
            else:
                added = count - before[0]
                time_slope = f"{(extra_s - before[1]) / added * 1000:+.2f} ms"
                memory_slope = f"{(extra_bytes - before[2]) / added:+,.0f} B"
            table.append([
                framework, f"{count:,}", f"{plain.cpu_s:.2f} s", f"{measured.cpu_s:.2f} s", extra_cell,
                time_slope, in_loop, collecting, format_size(plain.peak_bytes), format_size(measured.peak_bytes),
                f"{format_size(extra_bytes)}", memory_slope, f"{journals[job_name(framework, count)] / count:,.0f} B",
            ])
            before = (count, extra_s, extra_bytes)
    return table


def per_test_in_loop(run: Run, *, collecting: bool = False) -> float:
    """A session's CPU milliseconds per test in its test loop, or in its collections there."""
    return (run.loop_gc_s if collecting else run.loop_s) / run.loop_tests * 1000


def loop_cells(shown: dict[bool, Run], repeats: list[dict[bool, Run]]) -> tuple[str, str]:
    """The shown pair's CPU time per test in each session's test loop (from the first test's
    finish to the last's) and their difference, with every pair's difference where there were
    several; and the part of each session's figure that was garbage collection. ``-`` for
    one-test sessions, which have no loop."""
    plain, measured = shown[False], shown[True]
    if not plain.loop_tests or not measured.loop_tests:
        return "-", "-"
    without, with_ = per_test_in_loop(plain), per_test_in_loop(measured)
    each = ", ".join(f"{per_test_in_loop(pair[True]) - per_test_in_loop(pair[False]):+.2f}" for pair in repeats)
    in_loop = f"{without:.2f} / {with_:.2f} ms ({with_ - without:+.2f}" + (f"; {each})" if len(repeats) > 1 else ")")
    collecting = (f"{per_test_in_loop(plain, collecting=True):.2f} / "
                  f"{per_test_in_loop(measured, collecting=True):.2f} ms")
    return in_loop, collecting


HEADER = [
    "imports", "tests", "CPU without", "CPU with", "extra CPU (median; each pair)", "extra CPU per test added",
    "CPU per test in the loop, without / with (extra; each pair's)", "of which collecting garbage, without / with",
    "peak without", "peak with", "extra peak", "extra peak per test added", "journal per test",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,1000,10000,100000",
                        help="comma-separated numbers of tests, smallest first (default 1,1000,10000,100000)")
    parser.add_argument("--frameworks", default="none,tensorflow",
                        help=f"comma-separated, of {', '.join(PRELUDES)} (default both)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="pairs of sessions for each suite but the largest, which runs once (default 3)")
    parser.add_argument("--output", help=f"also write the table into this Markdown page (as {DOCS_PAGE})")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat: {args.repeat}; expected a whole number >= 1")
    sizes = sorted(int(size) for size in args.sizes.split(","))
    frameworks = args.frameworks.split(",")
    if not set(frameworks) <= set(PRELUDES):
        parser.error(f"--frameworks: unknown {sorted(set(frameworks) - set(PRELUDES))}; known: {', '.join(PRELUDES)}")
    cores = sorted(os.sched_getaffinity(0))
    jobs = [  # longest first
        job_name(framework, count)
        for count in reversed(sizes)
        for _ in range(1 if count == sizes[-1] else args.repeat)
        for framework in frameworks
    ]
    with tempfile.TemporaryDirectory(prefix="tfmem-suite-scale-") as temporary:
        root = Path(temporary)
        suites = {
            core: {
                side: {
                    job_name(framework, count): write_suite(root / f"core{core}-{side}-{framework}-{count}", framework,
                                                            count)
                    for framework in frameworks for count in sizes
                }
                for side in (False, True)
            }
            for core in cores
        }
        warm_up(root)
        pairs = run_pairs(jobs, suites)
        journals = {
            job: next(
                (suite[True][job] / JOURNAL).stat().st_size
                for suite in suites.values() if (suite[True][job] / JOURNAL).exists()
            )
            for job in set(jobs)
        }
    text = "\n".join(markdown_table(HEADER, rows(frameworks, sizes, pairs, journals))) + "\n"
    print(text)
    if args.output:
        repeated = (f"every suite but the largest ran as {args.repeat} pairs, and its row is the pair with the median "
                    "extra CPU (every pair's in parentheses); " if args.repeat > 1 else "")
        intro = (f"## At scale\n\n{machine.written_by('benchmarks/suite_scale.py', argv)}. Trivial tests, each "
                 f"pair one session without and one with tfmem at the same time on one core; {repeated}the slopes are "
                 "from the row above. See the module docstring of `benchmarks/suite_scale.py`.\n\n")
        machine.write_section(Path(args.output), "suite_scale.py", intro + text, "What measuring every test costs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
