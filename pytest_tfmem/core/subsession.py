"""pytest runs the session starts in processes of their own (an isolated test's process, the
isolation template, the workers' probe): the options they do not take over from the session's
command line, how they die with the session, and the excerpt of their output shown when one
ends unexpectedly."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_tfmem import platforms

# Set in every such run whatever the session's command line says (when the option exists):
# it starts no pytest-xdist workers of its own, nobody is at its terminal for a debugger, and
# the session's JUnit XML file is the session's to write.
_NOT_TAKEN_OVER: dict[str, Any] = {
    "numprocesses": None,
    "maxprocesses": None,
    "dist": "no",
    "looponfail": False,
    "usepdb": False,
    "trace": False,
    "xmlpath": None,
}


def override_options(config: pytest.Config, overrides: Mapping[str, Any]) -> None:
    """Set the options no such run takes over, then ``overrides`` (what this kind of run needs),
    skipping those no installed plugin declares; before ``pytest_configure``, so every plugin
    sees them."""
    for name, value in {**_NOT_TAKEN_OVER, **overrides}.items():
        if hasattr(config.option, name):
            setattr(config.option, name, value)


def die_with_parent(parent_pid: int) -> None:
    """End this process when its parent does (Linux: the kernel's ``PR_SET_PDEATHSIG``;
    elsewhere a thread watches the parent), so a process started for the session never outlives
    a session that was killed."""
    platforms.current().die_with_parent(parent_pid)


def output_excerpt(path: Path, lines: int) -> str:
    """The process's last output lines; from a crash, the start of Python's fault report
    (``Fatal Python error``), the failing thread's frames first (the report lists the current
    thread after every other: with a few threads, the first lines would hold only theirs)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    fatal = next((i for i, line in enumerate(text) if "Fatal Python error" in line), None)
    if fatal is None:
        return "\n".join(text[-lines:])
    report = text[fatal:]
    report[0] = report[0][report[0].index("Fatal Python error") :]
    current = next((i for i, line in enumerate(report) if line.startswith("Current thread ")), None)
    if current is not None:
        end = next((i for i in range(current + 1, len(report)) if not report[i].startswith("  ")), len(report))
        first_thread = next(i for i, line in enumerate(report) if line.startswith(("Thread ", "Current thread ")))
        report = [*report[:first_thread], *report[current:end], "", *report[first_thread:current], *report[end:]]
    return "\n".join(report[:lines])
