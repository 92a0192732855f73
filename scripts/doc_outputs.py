"""The terminal output the docs show, written by the command each block names.

    python scripts/doc_outputs.py [PAGE.md ...]      # every page of docs/ when none is given

A block of a page lies between two comments: the first names the command (run with ``bash`` in
the repository's root) and, after ``from:``, the text of the line the block starts at (the
header of a summary section of pytest-tfmem)::

    <!-- output: pytest benchmarks/workloads/keras_jax.py; from: what the tests left behind -->
    ```
    ...written here...
    ```
    <!-- output: end -->

The block keeps the output from its ``from:`` line to the end of pytest-tfmem's summary (pytest's
short test summary and its last line are left out). A command that fails to start, or whose
output has no such line, leaves the page as it was and is named.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_tfmem.files import write_text_atomic  # noqa: E402

BLOCK = re.compile(r"<!-- output: (?P<command>.+?); from: (?P<start>.+?) -->\n(?P<body>.*?)<!-- output: end -->",
                   re.DOTALL)
# pytest's own lines after pytest-tfmem's summary: where a block ends.
PYTEST_TAIL = re.compile(
    r"^(=+ short test summary info =+|=* ?\d+ (passed|failed|errors?|deselected|skipped|xfailed|xpassed)\b.*)$"
)


def excerpt(output: str, start: str) -> str | None:
    """The lines from the one holding ``start`` to the end of pytest-tfmem's summary, or ``None``."""
    lines = output.splitlines()
    first = next((number for number, line in enumerate(lines) if start in line), None)
    if first is None:
        return None
    kept = []
    for line in lines[first:]:
        if PYTEST_TAIL.match(line):
            break
        kept.append(line)
    return "\n".join(kept).rstrip() + "\n"


def rewrite(page: Path) -> list[str]:
    """Run each block's command and write its output into ``page``; what could not be written."""
    text = page.read_text()
    problems: list[str] = []

    def written(match: re.Match[str]) -> str:
        command, start = match["command"], match["start"]
        print(f"{page.name}: {command}", file=sys.stderr)
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, check=False)
        found = excerpt(done.stdout, start)
        if found is None:
            problems.append(f"{page}: `{command}` (exit {done.returncode}) printed no line with {start!r}")
            return match[0]
        return f"<!-- output: {command}; from: {start} -->\n```\n{found}```\n<!-- output: end -->"

    updated = BLOCK.sub(written, text)
    if updated != text:
        write_text_atomic(page, updated)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path, help="the pages to write (default: every page of docs/)")
    args = parser.parse_args(argv)
    pages = args.pages or sorted((ROOT / "docs").glob("*.md"))
    problems = [problem for page in pages for problem in rewrite(page)]
    for problem in problems:
        print(f"not written: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
