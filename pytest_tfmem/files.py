"""tfmem's files: written atomically, kept in a ``.tfmem`` directory out of version control.

``write_text_atomic`` and ``create_text_atomic`` write so that readers see the old content or
the new, never a truncated mix. Every place that creates a directory for tfmem's files (the
results journal, traces) goes through ``make_directory``: a ``.tfmem`` directory it creates or
finds on the way gets a ``.gitignore`` holding ``*``, as pytest does for ``.pytest_cache``, so
``git status`` stays clean without an entry in the project's own ``.gitignore``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

DIRECTORY = ".tfmem"
GITIGNORE = "# Created by pytest-tfmem automatically.\n*\n"


def _new_file_mode() -> int:
    """The permission bits a file created now gets: ``0o666`` less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _write_temporary(target: Path, text: str, mode: int) -> str:
    """A temporary file beside ``target`` holding ``text``, flushed to disk, with ``mode``."""
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return temporary


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, flush it to disk, then rename it over ``path``.

    If anything fails (a full disk, an interrupt) the old file is left as it was and the
    temporary file is removed. A replaced file keeps its permission bits.
    """
    target = Path(path)
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = _new_file_mode()
    temporary = _write_temporary(target, text, mode)
    try:
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def create_text_atomic(path: str | os.PathLike[str], text: str) -> bool:
    """Create ``path`` holding ``text`` unless it exists; True if this call created it.

    The file appears complete or not at all, and an existing file is never replaced, even
    when several processes try at once: the temporary file is hard-linked to ``path``, which
    fails if ``path`` exists. (Where hard links are not supported, it is renamed into place.)
    """
    target = Path(path)
    if target.exists():
        return False
    temporary = _write_temporary(target, text, _new_file_mode())
    try:
        try:
            os.link(temporary, target)
        except FileExistsError:
            return False
        except OSError:  # no hard links on this file system
            if target.exists():
                return False
            os.replace(temporary, target)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


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
