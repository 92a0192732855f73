"""How the memory history grows with commits and tests: its file, reading it, finding steps and creep.

    python -m benchmarks.history_scale [--sizes 100x2000,1000x2000] [--output docs/history.md]

For each size (commits x tests) a synthetic history is written as pytest sessions write it (one line
a commit, each test's peak and retained figure; a step in a tenth of the tests, creep in another
tenth, noise everywhere), then timed: appending one more session (what every recording session
pays), reading and folding the whole file (what ``tfmem history`` pays), the last 200 lines only
(what ``--tfmem-history-gate`` reads once per session: 50 commits, up to 4 lines each), and the
steps and creep of every test. Times are the best of three.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import machine
from pytest_tfmem.gates import history
from pytest_tfmem.gates.steps import creep, steps
from pytest_tfmem.units import DEFAULT_MIN_STEP, format_size, parse_tolerance

MIB = 2**20
MIN_STEP = parse_tolerance(DEFAULT_MIN_STEP)
ENVIRONMENT = {"python": "3.11", "platform": "Linux x86_64", "memory": "RSS", "peaks": "exact", "tensorflow": "2.21.0"}


def figure(test: int, commit: int, rng: random.Random) -> int:
    base = (20 + test % 200) * MIB
    if test % 10 == 0 and commit >= 500:
        base = int(base * 1.5)  # a step
    elif test % 10 == 1:
        base = int(base * 1.002**commit)  # creep
    return int(base * (1 + rng.uniform(-0.01, 0.01)))


def write_history(path: Path, commits: int, tests: int) -> None:
    rng = random.Random(0)
    nodeids = [f"tests/test_module_{test // 50:03d}.py::test_case_{test:05d}" for test in range(tests)]
    with open(path, "w", encoding="utf-8") as stream:
        for commit in range(commits):
            sha = f"{commit:040x}"
            parent = f"{commit - 1:040x}" if commit else None
            figures = {nodeid: (figure(test, commit, rng), MIB, {}) for test, nodeid in enumerate(nodeids)}
            commit_date = f"2026-01-01T00:00:00+00:00#{commit:06d}"  # sorts in commit order
            entry = history.session_entry(history.Commit(sha, parent, "main", commit_date, False), ENVIRONMENT,
                                          f"session-{commit}", figures)
            stream.write(entry.to_line())


def best_of_three(work: Callable[[], object]) -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def measure(commits: int, tests: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="tfmem-history-") as directory:
        path = Path(directory) / "history.jsonl"
        write_history(path, commits, tests)
        size = path.stat().st_size
        one = history.session_entry(history.Commit("f" * 40, None, "main", "2027", False), ENVIRONMENT, "extra",
                                    {f"t.py::test_{test}": (MIB, MIB, {}) for test in range(tests)})
        append_s = best_of_three(lambda: history.append_entry(path, one))
        read_s = best_of_three(lambda: history.read_history(path))
        gate_s = best_of_three(lambda: history.read_history(path, last=50 * 4))  # what --tfmem-history-gate reads
        found = history.series(history.read_history(path).entries)

        def detect() -> int:
            moved = 0
            for per_environment in found.values():
                for one_series in per_environment:
                    moved += bool(steps(one_series.points, MIN_STEP)) or creep(one_series.points) is not None
            return moved

        detect_s = best_of_three(detect)
    return {"size": size, "append": append_s, "read": read_s, "gate": gate_s, "detect": detect_s}


def table(results: dict[tuple[int, int], dict[str, float]]) -> str:
    lines = [
        "| commits x tests | file | append a session | read and fold the file | the gate's read (last 200 lines) "
        "| steps and creep of every test |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for (commits, tests), result in results.items():
        lines.append(
            f"| {commits} x {tests} | {format_size(int(result['size']))} | {result['append'] * 1000:.0f} ms | "
            f"{result['read']:.2f} s | {result['gate']:.2f} s | {result['detect']:.2f} s |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100x2000,1000x2000", help="commits x tests, separated by commas")
    parser.add_argument("--output", help="also write the table, with the command, into this Markdown page")
    args = parser.parse_args(argv)
    sizes = [tuple(int(n) for n in size.split("x")) for size in args.sizes.split(",")]
    results = {}
    for commits, tests in sizes:
        print(f"{commits} commits x {tests} tests ...", file=sys.stderr, flush=True)
        results[(commits, tests)] = measure(commits, tests)
    text = table(results)
    print(text, end="")
    if args.output:
        written = f"{machine.written_by('-m benchmarks.history_scale', argv)}.\n\n{text}"
        machine.write_section(Path(args.output), "benchmarks/history_scale.py", written, "The memory history")
    return 0


if __name__ == "__main__":
    sys.exit(main())
