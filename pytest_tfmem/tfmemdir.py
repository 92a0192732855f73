"""The ``.tfmem`` directory, where tfmem keeps its files in a project, out of version control.

Every place that creates a directory for tfmem's files (the results journal, traces) goes
through ``make_directory``: a ``.tfmem`` directory it creates or finds on the way gets a
``.gitignore`` holding ``*``, as pytest does for ``.pytest_cache``, so ``git status`` stays
clean without an entry in the project's own ``.gitignore``.
"""

from __future__ import annotations

from pathlib import Path

from pytest_tfmem.atomic import create_text_atomic

DIRECTORY = ".tfmem"
GITIGNORE = "# Created by pytest-tfmem automatically.\n*\n"


def ignore_in_git(directory: Path) -> bool:
    """Write ``directory/.gitignore`` holding ``*`` unless it exists (atomically); True if written."""
    return create_text_atomic(directory / ".gitignore", GITIGNORE)


def make_directory(path: Path) -> Path:
    """Create ``path`` and its parents; each ``.tfmem`` directory in ``path`` gets its ``.gitignore``."""
    path.mkdir(parents=True, exist_ok=True)
    for directory in (path, *path.parents):
        if directory.name == DIRECTORY:
            ignore_in_git(directory)
    return path
