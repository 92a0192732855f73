"""Where and with what a benchmark ran: machine, load, and the versions of every contender."""

from __future__ import annotations

import datetime
import os
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import psutil

from pytest_tfmem import platforms
from pytest_tfmem.files import write_text_atomic
from pytest_tfmem.units import format_size

DISTRIBUTIONS = ("tensorflow", "keras", "numpy", "pytest", "pytest-tfmem", "pytest-memray", "memray", "memory-profiler")


def description() -> str:
    memory = format_size(psutil.virtual_memory().total)
    cpu = platforms.current().cpu_model()
    return f"{os.cpu_count()} cores ({cpu}), {memory} RAM, {platform.system()} {platform.release()}"


def versions() -> str:
    found = [f"python {platform.python_version()}"]
    for name in DISTRIBUTIONS:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def header_lines(
    day: datetime.date, seconds: float, load_before: tuple[float, ...], load_after: tuple[float, ...]
) -> list[str]:
    lines = [
        f"Run on {day.isoformat()}, {description()}; took {seconds / 60:.1f} min.",
        f"Load average (1 min) {load_before[0]:.1f} at the start, {load_after[0]:.1f} at the end.",
        f"Versions: {versions()}.",
    ]
    busy = busy_warning(load_before[0], load_after[0], os.cpu_count() or 1)
    return lines + ([busy] if busy else [])


def busy_warning(load_before: float, load_after: float, cores: int) -> str | None:
    """A line for runs where other processes wanted more cores than the machine has."""
    if max(load_before, load_after) <= cores:
        return None
    return (f"**A busy machine**: the load average exceeded its {cores} cores, so the benchmarks shared the "
            "CPUs with other work and their timings (and the targets on them) are noisy; the memory figures "
            "and counts do not depend on the load.")


def written_by(script: str, argv: Sequence[str] | None) -> str:
    """``Written by `python benchmarks/x.py --output page.md` on 2026-12-01, 2 CPUs, Python 3.11.7``:
    how a generated page names the command that reproduces it (``argv``: the script's arguments,
    ``None`` for its own command line)."""
    command = f"python {script} " + " ".join(argv if argv is not None else sys.argv[1:])
    return (
        f"Written by `{command.strip()}` on {datetime.date.today().isoformat()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )


def markers(script: str) -> tuple[str, str]:
    """The comments a generated part of a Markdown page lies between, named after its script."""
    return f"<!-- {script}: begin -->", f"<!-- {script}: end -->"


def section_of(path: Path, script: str) -> str | None:
    """The part of the page at ``path`` that ``script`` writes, its markers included, or ``None``:
    a script that writes the whole page keeps it."""
    begin, end = markers(script)
    page = path.read_text() if path.exists() else ""
    if begin not in page or end not in page:
        return None
    return begin + page.split(begin, 1)[1].split(end, 1)[0] + end


def write_section(path: Path, script: str, text: str, title: str) -> None:
    """Put ``text`` between ``script``'s markers in the page at ``path`` (the rest of the page is
    kept), at the end of a page without them, or in a page of its own, headed ``title``."""
    begin, end = markers(script)
    page = path.read_text() if path.exists() else ""
    if begin in page and end in page:
        before, rest = page.split(begin, 1)
        after = rest.split(end, 1)[1]
        page = f"{before}{begin}\n{text}{end}{after}"
    elif page:
        page = f"{page.rstrip()}\n\n{begin}\n{text}{end}\n"
    else:
        page = f"# {title}\n\n{begin}\n{text}{end}\n"
    write_text_atomic(path, page)
