"""A memory history recorded for real, for docs/history.md: a git repository of twelve commits, a
pytest session with ``--tfmem-history`` at each, then ``tfmem history`` (terminal and Markdown) and
the page, drawn by a headless Chromium where one is installed.

    python scripts/history_demo.py [--output docs/history.md] [--screenshot docs/history.png]

The suite's tests allocate with NumPy: one steps up at the seventh commit (which no session
measured, so the step is a range), one grows 4% a commit, one doubles at one commit and comes
back, one stays flat with noise.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import machine  # noqa: E402

SUITE = """
import numpy as np


def hold(megabytes):
    block = np.ones(int(megabytes * 2**20) // 8)
    block += 1


def test_step():
    hold({step})


def test_ramp():
    hold({ramp})


def test_blip():
    hold({blip})


def test_flat():
    hold({flat})
"""
STEP_AT, BLIP_AT, COMMITS = 6, 4, 12


def suite_at(number: int, rng: random.Random) -> str:
    """The suite at commit ``number`` (0 to ``COMMITS - 1``); ``rng`` gives the flat test its noise."""
    return SUITE.format(step=40 if number < STEP_AT else 80, ramp=30 * 1.04**number,
                        blip=90 if number == BLIP_AT else 45, flat=50 + rng.uniform(0, 0.5))


def run(command: list[str], folder: Path) -> str:
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, check=True)
    return done.stdout


def record(folder: Path) -> None:
    for command in (["init", "-q"], ["config", "user.email", "ci@example.com"], ["config", "user.name", "CI"]):
        run(["git", *command], folder)
    rng = random.Random(3)
    for number in range(COMMITS):
        (folder / "test_suite.py").write_text(suite_at(number, rng))
        run(["git", "add", "test_suite.py"], folder)
        run(["git", "commit", "-qm", f"commit {number}"], folder)
        if number != STEP_AT:  # not measured: the step lies in a range
            run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                 "--tfmem-history=memory-history.jsonl"], folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", help="write the outputs into this Markdown page, between the script's markers")
    parser.add_argument("--screenshot", help="also save the page as drawn by a headless Chromium (PNG)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tfmem-history-demo-") as directory:
        folder = Path(directory)
        record(folder)
        tfmem = [sys.executable, "-m", "pytest_tfmem.cli.main", "history", "memory-history.jsonl"]
        terminal = run(tfmem, folder)
        markdown = run([*tfmem, "--markdown"], folder)
        run([*tfmem, "--html", "history.html"], folder)
        chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
        if args.screenshot and chromium:
            run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 f"--screenshot={Path(args.screenshot).resolve()}", "--window-size=800,1150",
                 (folder / "history.html").as_uri()], folder)
    text = (
        "```\n$ tfmem history memory-history.jsonl\n" + terminal + "```\n\n"
        "`tfmem history memory-history.jsonl --markdown` (as GitHub shows it):\n\n" + markdown
    )
    print(text)
    if args.output:
        written = f"{machine.written_by('scripts/history_demo.py', argv)}.\n\n{text}"
        machine.write_section(Path(args.output), "scripts/history_demo.py", written, "The memory history")
    return 0


if __name__ == "__main__":
    sys.exit(main())
