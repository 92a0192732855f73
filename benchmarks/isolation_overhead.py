"""What ``--tfmem-isolate`` costs per test: plain and TensorFlow tests, forked and spawned.

    python benchmarks/isolation_overhead.py [--tests 6] [--repeats 3] [--output docs/isolation-fork.md]

Runs two workloads as real ``pytest`` sessions: in process, isolated with forks of a template
process (``--tfmem-isolate-start=fork``, the default) and isolated with a fresh interpreter per
test (``--tfmem-isolate-start=spawn``), alternating the order per repetition. Prints the median
wall time and CPU time (user + system, of pytest and every process it started) of each
session, and each isolated session's extra time per test over the session in process. The
fork figure includes the template's start (once per session), spread over the tests. While
the fork sessions run, the template process is read every 0.1 s, as last read before it
ended: its resident memory (RSS) and its proportional share (PSS: pages shared with its
forks counted in part), its start (from its creation to its first fork), its own CPU time
and its forks' (reaped by it), per test. A plain test costs a fork (or a fresh interpreter that imports pytest, its
plugins and the test module); a TF test adds TensorFlow's runtime start in each process, and
when spawned, its import. The machine's load average is printed with the numbers: on a
shared machine the CPU time is the steadier figure.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import machine
from pytest_tfmem.units import format_size

# As in the tests: TensorFlow's CPU allocator keeps statistics only with oneDNN on.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

WORKLOADS = {
    "plain": """
import numpy as np
import pytest

@pytest.mark.parametrize("run", range({tests}))
def test_plain(run):
    assert np.ones(10**6).sum() == 10**6
""",
    "tensorflow": """
import pytest
import tensorflow as tf

@pytest.mark.parametrize("run", range({tests}))
def test_tf(run):
    x = tf.random.uniform((256, 256))
    assert float(tf.reduce_sum(tf.matmul(x, x))) > 0
""",
}
VARIANTS = {
    "in process": [],
    "fork": ["--tfmem-isolate", "--tfmem-isolate-start=fork"],
    "spawn": ["--tfmem-isolate", "--tfmem-isolate-start=spawn"],
}
# --output replaces what lies between this script's markers (``machine.markers``) and keeps the rest of the page.


@dataclass
class Session:
    wall_s: float
    cpu_s: float
    template: TemplateReading | None = None


@dataclass
class TemplateReading:
    rss: int
    pss: int | None
    cpu_s: float  # the template's own user + system time (its forks' not included)
    forks_cpu_s: float  # its forks' user + system time (reaped by the template)
    start_s: float | None  # from its start to its first fork


class TemplateWatcher:
    """Reads the memory of the template process under ``root`` every 0.1 s, from a thread."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.reading: TemplateReading | None = None
        self._first_fork: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _template(self) -> psutil.Process | None:
        """The session's own child: the template (a fork of the session, or a fresh interpreter);
        the tests' processes are its children."""
        try:
            children = psutil.Process(self.root).children()
        except psutil.Error:
            return None
        return children[0] if len(children) == 1 else None

    def _run(self) -> None:
        while not self._done.wait(0.1):
            template = self._template()
            if template is None:
                continue
            try:
                memory = template.memory_full_info()
                cpu = template.cpu_times()
                forks = [fork.create_time() for fork in template.children()]
                if forks and self._first_fork is None:
                    self._first_fork = min(forks)
                start = None if self._first_fork is None else self._first_fork - template.create_time()
            except psutil.Error:
                continue
            self.reading = TemplateReading(
                memory.rss, getattr(memory, "pss", None), cpu.user + cpu.system,
                cpu.children_user + cpu.children_system, start,
            )

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def session(directory: Path, options: list[str]) -> Session:
    """One pytest session: wall and CPU seconds (CPU: user + system of it and its children)."""
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tfmem-budget=4GB", *options],
        cwd=directory,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    watcher = TemplateWatcher(process.pid)
    output, _ = process.communicate()
    elapsed = time.perf_counter() - started
    watcher.stop()
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise SystemExit(f"pytest {' '.join(options)} failed in {directory}:\n{output[-3000:]}")
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return Session(elapsed, cpu, watcher.reading)


def command_seconds(code: str) -> tuple[float, float]:
    """Wall and CPU seconds of ``python -c code``: the yardstick for start-up costs."""
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return elapsed, (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=6, help="tests per workload (default 6)")
    parser.add_argument("--repeats", type=int, default=3, help="sessions per variant; the median is shown (default 3)")
    parser.add_argument("--output", help="also write the table, with the command, into this Markdown page")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    results: dict[tuple[str, str], list[Session]] = {}
    for name, source in WORKLOADS.items():
        with tempfile.TemporaryDirectory(prefix=f"tfmem-isolation-{name}-") as directory:
            path = Path(directory)
            (path / f"test_{name}.py").write_text(source.replace("{tests}", str(args.tests)))
            for repeat in range(args.repeats):
                order = list(VARIANTS) if repeat % 2 == 0 else list(reversed(VARIANTS))
                for variant in order:
                    print(f"[{repeat + 1}/{args.repeats}] {name} {variant}", file=sys.stderr, flush=True)
                    results.setdefault((name, variant), []).append(session(path, VARIANTS[variant]))
    yardsticks = {code: command_seconds(code) for code in ("import pytest", "import tensorflow")}
    load_after = os.getloadavg()[0]

    lines = [
        f"{args.tests} tests per session; wall / CPU seconds, median of {args.repeats}; "
        f"load average {load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} cores",
        "",
        "| workload | in process | isolated, fork | isolated, spawn | extra per test, fork | extra per test, spawn |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in WORKLOADS:
        medians = {
            variant: (statistics.median([s.wall_s for s in results[(name, variant)]]),
                      statistics.median([s.cpu_s for s in results[(name, variant)]]))
            for variant in VARIANTS
        }
        base_wall, base_cpu = medians["in process"]
        cells = [f"{wall:.2f} / {cpu:.2f} s" for wall, cpu in medians.values()]
        extra = [
            f"{(medians[v][0] - base_wall) / args.tests:+.2f} / {(medians[v][1] - base_cpu) / args.tests:+.2f} s"
            for v in ("fork", "spawn")
        ]
        lines.append(f"| {name} | {' | '.join(cells)} | {' | '.join(extra)} |")
    lines += [
        "",
        "The template, once per session (per xdist worker): its memory while it waits, its start until its "
        "first fork (wall) and its own CPU time; and the CPU time of each fork (the test's whole process).",
        "",
        "| workload | template RSS | template PSS | template start, wall | template CPU | CPU per fork |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in WORKLOADS:
        forked = results[(name, "fork")]
        readings = [s.template for s in forked if s.template is not None]
        if not readings:
            lines.append(f"| {name} | - | - | - | - | - |")
            continue
        pss = [r.pss for r in readings if r.pss is not None]
        starts = [r.start_s for r in readings if r.start_s is not None]
        template_cpu = statistics.median(r.cpu_s for r in readings)
        per_fork = statistics.median(r.forks_cpu_s for r in readings) / args.tests
        lines.append(
            f"| {name} | {format_size(int(statistics.median(r.rss for r in readings)))} | "
            f"{format_size(int(statistics.median(pss))) if pss else '-'} | "
            f"{f'{statistics.median(starts):.2f} s' if starts else '-'} | {template_cpu:.2f} s | {per_fork:.2f} s |"
        )
    lines.append("")
    for code, (wall, cpu) in yardsticks.items():
        lines.append(f"For scale, `python -c {code!r}`: {wall:.2f} / {cpu:.2f} s.")
    table = "\n".join(lines)
    print(table)
    if args.output:
        written = f"{machine.written_by('benchmarks/isolation_overhead.py', argv)}.\n\n{table}\n"
        machine.write_section(Path(args.output), "benchmarks/isolation_overhead.py", written,
                              "What an isolated test costs: fork against spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())
