"""Benchmark pytest-tfmem against the alternatives; print the results as Markdown.

    python benchmarks/run.py                                  # everything (under 10 minutes on 2 cores)
    python benchmarks/run.py --output docs/benchmarks.md      # also write the page docs/ links to
    python benchmarks/run.py --quick --workloads spike,leaks

Every workload is a real pytest run in a fresh process (``benchmarks/workloads``). Each
repetition runs every contender on every selected workload (order independence and
isolation: the first two repetitions only), the contenders' order rotating from one
repetition to the next, so slow spells of a shared machine spread over all of them.
Progress goes to stderr, the tables to stdout. ``--output`` writes them as a page of their own
(title, the command and the machine, the tables, then how each section was measured), atomically,
so a run that fails or is interrupted leaves the old page as it was.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``pytest_tfmem`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import machine, tables

# TensorFlow's pooling CPU allocator (oneDNN) is its default on some x86 CPUs and not on others
# (AMD EPYC): on, every machine measures the same TensorFlow, with the pool that hides memory.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
from benchmarks.contenders import (
    ISOLATION_CONTENDERS,
    LEAK_CONTENDERS,
    MEASURING_CONTENDERS,
    PEAK_CONTENDERS,
    Contender,
)
from benchmarks.runner import Job, Runner, WorkloadError
from pytest_tfmem.files import write_text_atomic

SECTIONS = ("overhead", "spike", "order", "leaks", "isolation")


@dataclass(frozen=True)
class Sizes:
    repeat: int  # repetitions of the overhead, spike and leak jobs
    overhead_tests: int  # tests per overhead process
    runs: int  # spike and leak runs per contender, spread over the repetitions
    isolation_tests: int  # tests per isolation session
    order_tests: int = len(tables.ORDER_TESTS)  # the first so many of the order section's tests
    # Order and isolation figures barely vary between runs while their TensorFlow sessions
    # take most of the time: they run in the first repetitions only.
    slow_repeat: int = 2

    def slow_jobs_in(self, rep: int) -> bool:
        return rep < self.slow_repeat


FULL = Sizes(repeat=3, overhead_tests=3, runs=20, isolation_tests=2)
# The order section's NumPy test alone: its TensorFlow tests' sessions took 2 of its 2.5 minutes.
QUICK = Sizes(repeat=1, overhead_tests=1, runs=2, isolation_tests=1, order_tests=1)


def _rotated(contenders: tuple[Contender, ...], rep: int) -> tuple[Contender, ...]:
    shift = rep % len(contenders)
    return contenders[shift:] + contenders[:shift]


def _share(total: int, rep: int, repeat: int) -> int:
    """How many of ``total`` runs repetition ``rep`` does."""
    return total // repeat + (1 if rep < total % repeat else 0)


def plan(sections: tuple[str, ...], sizes: Sizes) -> list[tuple[int, Job | tuple[str, str]]]:
    """Jobs in execution order, with their repetition; ``(workload, test)`` is a reference run."""
    steps: list[tuple[int, Job | tuple[str, str]]] = []
    for rep in range(sizes.repeat):
        runs = (("TFMEM_BENCH_RUNS", str(_share(sizes.runs, rep, sizes.repeat))),)
        if "overhead" in sections:
            tests = (("TFMEM_BENCH_TESTS", str(sizes.overhead_tests)),)
            for workload, _ in tables.OVERHEAD_WORKLOADS:
                steps += [(rep, Job("overhead", workload, c, sizes=tests)) for c in _rotated(PEAK_CONTENDERS, rep)]
        if "spike" in sections and runs[0][1] != "0":
            steps += [(rep, Job("spike", "spike.py", c, sizes=runs)) for c in _rotated(MEASURING_CONTENDERS, rep)]
        if "order" in sections and sizes.slow_jobs_in(rep):
            for workload, test, _ in tables.ORDER_TESTS[: sizes.order_tests]:
                steps.append((rep, (workload, test)))
                for contender in _rotated(MEASURING_CONTENDERS, rep):
                    steps.append((rep, Job("order", workload, contender, "alone", ("-k", test))))
                    steps.append((rep, Job("order", workload, contender, "after a heavier test")))
        if "leaks" in sections and runs[0][1] != "0":
            steps += [(rep, Job("leaks", "leaks.py", c, sizes=runs)) for c in _rotated(LEAK_CONTENDERS, rep)]
        if "isolation" in sections and sizes.slow_jobs_in(rep):
            tests = (("TFMEM_BENCH_TESTS", str(sizes.isolation_tests)),)
            for workload, _ in tables.ISOLATION_WORKLOADS:
                steps += [
                    (rep, Job("isolation", workload, c, sizes=tests)) for c in _rotated(ISOLATION_CONTENDERS, rep)
                ]
    return steps


def run_all(steps: list[tuple[int, Job | tuple[str, str]]], repeat: int) -> tables.Results:
    runner = Runner()
    results = tables.Results([], {})
    started = time.perf_counter()
    try:
        for number, (rep, step) in enumerate(steps, 1):
            what = step.describe() if isinstance(step, Job) else f"reference: {step[0]}::{step[1]} in a fresh process"
            print(f"[{number:3}/{len(steps)} {time.perf_counter() - started:6.0f} s] rep {rep + 1}/{repeat} {what}",
                  file=sys.stderr, flush=True)
            if isinstance(step, Job):
                results.jobs.append(runner.run(step))
            else:
                results.references.setdefault(step, []).append(runner.reference_peak(*step))
    finally:
        runner.close()
    return results


def smaller_than_default(sections: tuple[str, ...], sizes: Sizes) -> bool:
    """Whether the sections run rest on fewer repetitions or runs than a default run gives them."""
    repeated = {"overhead", "spike", "leaks"} & set(sections) and sizes.repeat < FULL.repeat
    fewer_runs = {"spike", "leaks"} & set(sections) and sizes.runs < FULL.runs
    slow = {"order", "isolation"} & set(sections) and min(sizes.repeat, sizes.slow_repeat) < FULL.slow_repeat
    return bool(repeated or fewer_runs or slow or _fewer_order_tests(sections, sizes))


def _fewer_order_tests(sections: tuple[str, ...], sizes: Sizes) -> bool:
    return "order" in sections and sizes.order_tests < FULL.order_tests


def render(results: tables.Results, sections: tuple[str, ...], sizes: Sizes, command: str, header: list[str]) -> str:
    slow = min(sizes.repeat, sizes.slow_repeat)
    repetitions = f"{sizes.repeat} repetition" + ("s" if sizes.repeat > 1 else "")
    if {"order", "isolation"} & set(sections) and slow < sizes.repeat:
        repetitions += f", {slow} for order independence and isolation"
    lines = [*header, f"Command: `{command}` ({repetitions})."]
    if smaller_than_default(sections, sizes):
        order = (f"; order independence for {sizes.order_tests} of its {FULL.order_tests} tests"
                 if _fewer_order_tests(sections, sizes) else "")
        lines.append(f"A smaller run than the default ({FULL.repeat} repetitions, {FULL.runs} spike and leak runs per "
                     f"contender; here {sizes.repeat} and {sizes.runs}{order}): its medians and counts rest on "
                     "fewer runs.")
    lines.append("")
    titles = {
        "overhead": ("**Overhead**: test time (call phase start to report ready; imports, collection and "
                     "fixtures excluded), median, and change against no plugin."),
        "spike": ("**Spike capture**: a 250 MB array living 5 ms; a run counts when the reported peak is at "
                  f"least {tables.SPIKE_CAUGHT / 1e6:.0f} MB."),
        "order": ("**Order independence**: the test's peak alone and after a heavier test (medians), and the "
                  "relative error against its peak alone in a fresh interpreter."),
        "leaks": ("**Leak sensitivity**: runs flagged as leaking, of the runs made; each run is 3 warm-up and 10 "
                  "measured iterations of the step."),
        "isolation": "**Isolation cost**: whole pytest sessions (median), in-process against `--tfmem-isolate`.",
    }
    renderers = {"overhead": tables.overhead_section, "spike": tables.spike_section, "order": tables.order_section,
                 "leaks": tables.leak_section, "isolation": tables.isolation_section}
    for section in SECTIONS:
        if section in sections:
            lines += [titles[section], "", *renderers[section](results), ""]
    targets = tables.target_lines(results)
    if targets:
        lines += ["**Targets**", "", *targets, ""]
    return "\n".join(lines)


PAGE_TITLE = "# Benchmarks: pytest-tfmem and the alternatives"
PAGE_NOTE = (
    "Written by `benchmarks/run.py`; do not edit it by hand: run the command named below again "
    '(after `pip install -e ".[bench]"`) to refresh it. The figures are this machine\'s, on the day named; '
    "how each section measures is at the end."
)
METHOD_INTRO = """\
Every workload (`benchmarks/workloads/`) is a real pytest session in a fresh process, started
from a scratch directory with an empty `pytest.ini` and plugin auto-loading off, so each process
holds exactly one contender's plugin. Each repetition runs every contender, in an order that
rotates from one repetition to the next, so a slow spell of a shared machine spreads over all of
them. TensorFlow runs with oneDNN on (`TF_ENABLE_ONEDNN_OPTS=1`), as in the project's tests.

| contender | switched on by | its peak figure |
|---|---|---|
| no plugin | nothing | none |
| pytest-tfmem | `--tfmem-budget=64GB`, a budget never reached: every test measured, none failed \
| the test's record (`tfmem_peak_bytes`) |
| pytest-memray `limit_memory` | `@pytest.mark.limit_memory("64 GB")` on every test \
| the peak memray recorded for the test, which `limit_memory` compares with its limit |
| memory_profiler 0.1 s / 0.01 s | the test body run inside `memory_usage((body, (), kwargs), \
interval=..., max_usage=True, max_iterations=1)`, as pytest-monitor does (0.1 s is its default) \
| largest RSS sample minus the RSS before the call |"""
METHOD = {
    "overhead": """\
**Overhead.** Test time runs from the start of the call phase to the moment its report is
ready: what a tool does before and after the body counts (pytest-memray reads its capture file
at report time); imports, collection and fixtures do not. CPU time is user + system time over
the same span, of the process and the children it waited for (memory_profiler's sampler). The
cost pytest-tfmem adds is per test, not proportional to it, so a short test shows it as a larger
share. The contenders' sessions run one after another, a few tests each, so on a shared machine
these times move by tens of percent from run to run; `benchmarks/suite_overhead.py` runs whole
suites without and with pytest-tfmem at once on one core, and its ratios are the cost to go by
([suite-overhead.md](suite-overhead.md)).""",
    "spike": """\
**Spike.** `np.ones(250 MB)` held 5 ms, once per test. A run counts when the reported peak is
at least 225 MB. Filling 250 MB takes longer than the 5 ms the array lives, longer still on a
loaded machine, so how often a sampler catches it varies from run to run.""",
    "order": """\
**Order independence.** A NumPy test (300 MB of 100 KB arrays), a TensorFlow test (300 MB of
tensors) and a mixed test (the NumPy data held while the tensors are made) run alone, and after
a heavier test (600 MB) in the same session. The heavier NumPy test keeps a 64 KB result,
allocated above its arrays as a cache or a log would be, so glibc cannot hand the freed arrays
back from the top of its heap. The reference is the test function run once in a fresh
interpreter by `benchmarks/reference.py` (TensorFlow's runtime started first), read from the
kernel's high-water mark: no pytest and no pytest-tfmem code. What tells the tools apart: after
a heavier test, the memory a test needs is already resident, so RSS sampling sees little of it,
and TensorFlow serves the tensors from its pool without a new allocation, which allocation
tracking (pytest-memray, counting bytes allocated, touched or not) does not see either. Runs in
the first two repetitions only: its figures barely vary and its TensorFlow sessions take most of
the time.""",
    "leaks": """\
**Leaks.** A loop step does temporary work (a 2 MB scratch array, small Python objects) and,
when leaking, keeps a small object holding 0.25, 0.5, 1 or 2 MB in a module-level list. Every
check runs the step 3 times to warm up, then 10 times: `tfmem.assert_no_leak(step,
iterations=10, warmup=3, max_growth=...)` at the default `"1MB"` (growth up to 1 MB per
iteration passes by design) and at `"100KB"`; pytest-memray's `@pytest.mark.limit_leaks("1 MB")`
(the value its documentation shows; it judges bytes left allocated per allocation site over the
whole test, warm-up included) around the same 13 calls; and TensorFlow's object-count approach
written by hand (its `assert_no_new_pyobjects_executing_eagerly` does not run under pytest):
count gc-tracked objects by type after the warm-up and after the loop, fail if any type grew.
Counting objects sees only objects the collector tracks (a list of NumPy arrays grows unseen).
Time to verdict is the test time of the check.""",
    "isolation": """\
**Isolation.** Two small tests per session, the whole `pytest` process timed, in process and
with `--tfmem-isolate`: each isolated test runs in a fork of the session's template process (a
TensorFlow test starts TF's runtime again), and the template's start is paid once per session.
Runs in the first two repetitions only.""",
}


def page(tables_markdown: str, sections: tuple[str, ...]) -> str:
    """What ``--output`` writes: the title, how the page is made, the tables, then how each section measures."""
    method = [METHOD_INTRO, *(METHOD[section] for section in SECTIONS if section in sections)]
    return "\n\n".join([PAGE_TITLE, PAGE_NOTE, tables_markdown.rstrip(), "## How it measures", *method]) + "\n"


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="one repetition, 2 spike/leak runs, 1 test per session, the order section's "
                             "NumPy test only: checks the harness, not the numbers")
    parser.add_argument("--repeat", type=int, help=f"repetitions of every job (default {FULL.repeat})")
    parser.add_argument("--runs", type=int, help=f"spike and leak runs per contender (default {FULL.runs})")
    parser.add_argument("--workloads", default=",".join(SECTIONS),
                        help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})")
    parser.add_argument("--output", type=Path,
                        help="also write the results as a Markdown page to this file (atomically), "
                             "e.g. docs/benchmarks.md")
    arguments = parser.parse_args(argv)
    sections = tuple(s.strip() for s in arguments.workloads.split(",") if s.strip())
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        parser.error(f"--workloads: unknown section(s) {', '.join(unknown) or '(none given)'}; "
                     f"accepted: {', '.join(SECTIONS)}")
    for name in ("repeat", "runs"):
        value = getattr(arguments, name)
        if value is not None and value < 1:
            parser.error(f"--{name}: expected a whole number >= 1, got {value}")
    arguments.sections = sections
    return arguments


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(sys.argv[1:] if argv is None else argv)
    base = QUICK if arguments.quick else FULL
    sizes = Sizes(
        repeat=arguments.repeat or base.repeat,
        overhead_tests=base.overhead_tests,
        runs=arguments.runs or base.runs,
        isolation_tests=base.isolation_tests,
        order_tests=base.order_tests,
    )
    command = "python benchmarks/run.py " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    load_before = os.getloadavg()
    started = time.perf_counter()
    try:
        results = run_all(plan(arguments.sections, sizes), sizes.repeat)
    except WorkloadError as error:
        print(f"benchmarks: {error}", file=sys.stderr)
        return 1
    header = machine.header_lines(datetime.date.today(), time.perf_counter() - started, load_before, os.getloadavg())
    markdown = render(results, arguments.sections, sizes, command.strip(), header)
    print(markdown)
    if arguments.output:
        write_text_atomic(arguments.output, page(markdown, arguments.sections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
