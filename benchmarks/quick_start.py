"""The README's Quick start on a bare machine: each command's install (time, size, what it brings)
and the main job's time, side by side with an earlier commit's main job.

    python -m benchmarks.quick_start [--against 6c9e28c] [--repeat 2] [--output docs/development.md]
                                     [--scenarios-page docs/scenarios.md]
    python -m benchmarks.quick_start --extras [--output docs/development.md] [--readme README.md]

Each extra (``scenarios``: the main job's, ``test``: the tests') is installed into a fresh virtual
environment with ``pip install -e ".[EXTRA]"`` from this checkout, timed, and weighed (``du`` of the
environment; the CUDA libraries, ``nvidia-*``, on their own). Then the main job,
``pytest scenarios -n 2 --tfmem-budget=4GB``, runs ``--repeat`` times in the ``scenarios``
environment, and as many times in the ``test`` environment from a worktree of ``--against`` (the
main job as the README of that commit ran it: its ``test`` extra), alternating, timed from start
to end. Prints the two tables; ``--output`` writes them between this script's markers, and
``--scenarios-page`` the main job's own summary (from its last run here) into the scenarios' page.

``--extras`` weighs instead what the README's line for one's own project installs: the package from
this checkout, not editable, with no extra and with each extra a project may want (``EXTRAS_WEIGHED``),
each into a fresh virtual environment: the packages it adds and their size on disk, less what a
bare environment holds. ``--readme`` writes that table into the README too.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Sequence
from pathlib import Path

from benchmarks import machine
from benchmarks.tables import markdown_table
from pytest_tfmem.units import format_size

REPOSITORY = Path(__file__).resolve().parent.parent
MAIN_JOB = ("scenarios", "-n", "2", "--tfmem-budget=4GB")
EXTRAS = ("scenarios", "test")
# What each extra is installed with: the main job's TensorFlow comes from a requirements file, as
# the README's quick start installs it (no extra names TensorFlow: pyproject.toml).
WITH = {"scenarios": ("-r", "requirements/tensorflow.txt")}
EXTRAS_WEIGHED = {"": "pytest, psutil", "trace": "tensorboard, tensorboard-plugin-profile, xprof, matplotlib",
                  "gpu": "nvidia-ml-py"}
FOR = {"": "budgets, leaks, isolation, gates, notebooks",
       "trace": "TensorBoard traces, the op table of `--tfmem-explain`, `tfmem plot`",
       "gpu": "the NVML views of GPU memory"}


def size_of(path: Path) -> int:
    done = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0])


def site_packages(environment: Path) -> Path:
    return next((environment / "lib").glob("python*/site-packages"))


def install(extra: str, checkout: Path, environment: Path) -> dict[str, object]:
    """A fresh environment with ``checkout`` installed with ``extra``: seconds, bytes, CUDA bytes,
    whether pytest-randomly is in it."""
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    started = time.perf_counter()
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-e", f".[{extra}]", *WITH.get(extra, ())],
                   cwd=checkout, check=True)
    seconds = time.perf_counter() - started
    packages = site_packages(environment)
    cuda = sum(size_of(path) for path in packages.glob("nvidia*"))
    randomly = any(packages.glob("pytest_randomly*"))
    return {"seconds": seconds, "bytes": size_of(environment), "cuda": cuda, "randomly": randomly}


def weigh(extra: str, root: Path) -> tuple[int, int]:
    """What ``pip install "CHECKOUT[EXTRA]"`` adds to a fresh environment: packages, bytes."""
    bare = root / "bare"
    if not bare.exists():
        venv.create(bare, with_pip=True)
    environment = root / (extra or "none")
    venv.create(environment, with_pip=True)
    target = f"{REPOSITORY}[{extra}]" if extra else str(REPOSITORY)
    subprocess.run([str(environment / "bin" / "python"), "-m", "pip", "install", "--quiet", target], check=True,
                   cwd=root)
    before = {path.name for path in site_packages(bare).glob("*.dist-info")}
    added = [path for path in site_packages(environment).glob("*.dist-info") if path.name not in before]
    return len(added), size_of(site_packages(environment)) - size_of(site_packages(bare))


def extras_table(argv: Sequence[str] | None) -> str:
    with tempfile.TemporaryDirectory(prefix="tfmem-extras-") as scratch:
        weighed = {extra: weigh(extra, Path(scratch)) for extra in EXTRAS_WEIGHED}
    rows = [[f"`{extra}`" if extra else "(none)", brings, f"{count} packages, {format_size(size)}", FOR[extra]]
            for (extra, brings), (count, size) in zip(EXTRAS_WEIGHED.items(), weighed.values())]
    return "\n".join([
        *markdown_table(["extra", "brings", "installs", "for"], rows),
        "",
        machine.written_by("-m benchmarks.quick_start", argv) + ": each into a fresh virtual environment, as "
        "`pip install \"/path/to/pytest-tfmem[EXTRA]\"` does, less what a bare environment holds.",
        "",
    ])


def main_job(environment: Path, checkout: Path) -> tuple[float, str]:
    """The main job's seconds from start to end, and what it printed."""
    python = environment / "bin" / "python"
    started = time.perf_counter()
    done = subprocess.run([str(python), "-m", "pytest", *MAIN_JOB, "-p", "no:cacheprovider"], cwd=checkout,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"the main job failed in {checkout}:\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    return seconds, done.stdout


def scenario_summary(output: str) -> str:
    """The main job's scenario summary: from its first heading to the account's end."""
    lines = output.splitlines()
    first = next(i for i, line in enumerate(lines) if "tfmem scenarios: what was caught" in line)
    last = next(i for i, line in enumerate(lines) if line.startswith("=") and " in " in line and "passed" in line)
    return "\n".join(lines[first:last])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default="6c9e28c", help="the commit whose main job this one is compared with")
    parser.add_argument("--repeat", type=int, default=2, help="main job runs each side (default 2)")
    parser.add_argument("--output", type=Path, help="write the tables between this script's markers in the page")
    parser.add_argument("--scenarios-page", type=Path, help="write the main job's summary between this script's "
                        "markers in this page")
    parser.add_argument("--extras", action="store_true", help="weigh what each extra a project may want installs")
    parser.add_argument("--readme", type=Path, help="with --extras: write the table into this README too")
    args = parser.parse_args(argv)
    if args.extras:
        table = extras_table(argv)
        print(table)
        for page in (args.output, args.readme):
            if page is not None:
                machine.write_section(page, "benchmarks/quick_start.py extras", table, "What each extra weighs")
        return 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfmem-quick-start-") as scratch:
        root = Path(scratch)
        installed = {extra: install(extra, REPOSITORY, root / extra) for extra in EXTRAS}
        base = root / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.against], cwd=REPOSITORY, check=True,
                       capture_output=True)
        try:
            # the earlier commit's main job, in an environment of its own test extra
            subprocess.run([str(root / "test" / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps",
                            "-e", "."], cwd=base, check=True)
            now, before, printed = [], [], ""
            for _ in range(args.repeat):
                before.append(main_job(root / "test", base)[0])
                seconds, printed = main_job(root / "scenarios", REPOSITORY)
                now.append(seconds)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPOSITORY, check=False)
    minutes = (time.perf_counter() - started) / 60
    test_seconds = float(installed["test"]["seconds"])  # type: ignore[arg-type]
    rows = []
    for extra, found in installed.items():
        seconds = float(found["seconds"])  # type: ignore[arg-type]
        rows.append([f'`pip install -e ".[{extra}]"`', format_size(int(found["bytes"])),  # type: ignore[call-overload]
                     format_size(int(found["cuda"])) if found["cuda"] else "none",  # type: ignore[call-overload]
                     "yes" if found["randomly"] else "no", f"{seconds / 60:.1f} min", f"{seconds / test_seconds:.2f}x"])
    ratio = statistics.median(now) / statistics.median(before)
    lines = [
        machine.written_by("-m benchmarks.quick_start", argv) + f"; took {minutes:.1f} min.",
        f"Machine: {machine.description()}.",
        "",
        "Each extra installed into a fresh virtual environment from this checkout (the package index is "
        "this machine's: a download from PyPI takes longer):",
        "",
        *markdown_table(["install", "environment", "CUDA libraries", "pytest-randomly", "time", "vs test"], rows),
        "",
        f"The main job, `pytest {' '.join(MAIN_JOB)}`, {args.repeat} runs each, alternating: this checkout in "
        f"the `scenarios` environment, and commit {args.against} in its `test` environment, as its README ran it:",
        "",
        *markdown_table(["main job", "runs", "median", "vs " + args.against], [
            [args.against, ", ".join(f"{value:.1f} s" for value in before), f"{statistics.median(before):.1f} s",
             "1.00x"],
            ["this checkout", ", ".join(f"{value:.1f} s" for value in now), f"{statistics.median(now):.1f} s",
             f"{ratio:.2f}x"],
        ]),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.output is not None:
        machine.write_section(args.output, "benchmarks/quick_start.py", text, "Quick start")
    if args.scenarios_page is not None:
        page = "\n".join([
            machine.written_by("-m benchmarks.quick_start", argv) + ".",
            f"`pytest {' '.join(MAIN_JOB)}` in a fresh environment of the `scenarios` extra, on "
            f"{machine.description()}: {statistics.median(now):.0f} s from start to end (median of {args.repeat}); "
            "its last run printed:",
            "", "```", scenario_summary(printed), "```", "",
        ])
        machine.write_section(args.scenarios_page, "benchmarks/quick_start.py", page, "Scenarios")
    return 0


if __name__ == "__main__":
    sys.exit(main())
