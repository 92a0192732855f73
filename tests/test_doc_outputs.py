"""scripts/doc_outputs.py writes the terminal output a page shows by running the command its
block names: the block is pytest-tfmem's summary from the named line, pytest's own tail left out;
a command that prints no such line leaves the page as it was and fails the script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "doc_outputs.py"


def block(command: str, start: str, body: str = "old output\n") -> str:
    return f"<!-- output: {command}; from: {start} -->\n```\n{body}```\n<!-- output: end -->\n"


def test_a_block_is_written_by_its_command_and_a_bad_one_is_left_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "test_small.py").write_text("import numpy as np\n\ndef test_small():\n    np.ones(2**20)\n")
    run = f"{sys.executable} -m pytest {tmp_path / 'test_small.py'} -p no:cacheprovider --tfmem-budget=1GB"
    page = tmp_path / "page.md"
    good = block(run, "tfmem: peak memory need per test")
    bad = block("echo nothing of ours", "tfmem: peak memory need per test")
    page.write_text(f"# A page\n\n{good}\nprose between\n\n{bad}")

    done = subprocess.run([sys.executable, str(SCRIPT), str(page)], capture_output=True, text=True, timeout=300)

    assert done.returncode == 1 and "printed no line with 'tfmem: peak memory need per test'" in done.stderr
    text = page.read_text()
    written = text.split("```\n", 2)[1]
    assert written.startswith("=") and "tfmem: peak memory need per test" in written.splitlines()[0]
    assert "test_small.py::test_small" in written and "passed" in written
    assert "short test summary" not in written and " passed in " not in written
    assert "prose between" in text and text.endswith(bad)  # the failed block and the prose are untouched
