"""Benchmark pytest-tfmem against the alternatives; print the results as Markdown.

    python benchmarks/run.py                       # everything (under 10 minutes on 2 cores)
    python benchmarks/run.py --output bench.md     # also write the Markdown to a file
    python benchmarks/run.py --quick --workloads spike,leaks

Every workload is a real pytest run in a fresh process (``benchmarks/workloads``). Each
repetition runs every contender on every selected workload (order independence and
isolation: the first two repetitions only), the contenders' order rotating from one
repetition to the next, so slow spells of a shared machine spread over all of them.
Progress goes to stderr, the tables to stdout.
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
    # Order and isolation figures barely vary between runs while their TensorFlow sessions
    # take most of the time: they run in the first repetitions only.
    slow_repeat: int = 2

    def slow_jobs_in(self, rep: int) -> bool:
        return rep < self.slow_repeat


FULL = Sizes(repeat=3, overhead_tests=3, runs=20, isolation_tests=2)
QUICK = Sizes(repeat=1, overhead_tests=1, runs=2, isolation_tests=1)


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
            for workload, test, _ in tables.ORDER_TESTS:
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


def render(results: tables.Results, sections: tuple[str, ...], sizes: Sizes, command: str, header: list[str]) -> str:
    slow = min(sizes.repeat, sizes.slow_repeat)
    repetitions = f"{sizes.repeat} repetition" + ("s" if sizes.repeat > 1 else "")
    if {"order", "isolation"} & set(sections) and slow < sizes.repeat:
        repetitions += f", {slow} for order independence and isolation"
    lines = [*header, f"Command: `{command}` ({repetitions}).", ""]
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


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="one repetition, 2 spike/leak runs, 1 test per session: "
                             "checks the harness, not the numbers")
    parser.add_argument("--repeat", type=int, help=f"repetitions of every job (default {FULL.repeat})")
    parser.add_argument("--runs", type=int, help=f"spike and leak runs per contender (default {FULL.runs})")
    parser.add_argument("--workloads", default=",".join(SECTIONS),
                        help=f"comma-separated sections to run (default all: {','.join(SECTIONS)})")
    parser.add_argument("--output", type=Path, help="also write the Markdown to this file")
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
        write_text_atomic(arguments.output, markdown + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
