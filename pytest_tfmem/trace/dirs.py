"""Where traces go: one directory per pytest session, one per traced test, old sessions rotated.

Layout under the trace root (``.tfmem/traces`` by default)::

    .tfmem/
      .gitignore                                  # "*": tfmem's files are not for version control
    .tfmem/traces/
      .gitignore                                  # "*", also in a trace root elsewhere
      2025-01-31_14-05-09.250_4242/               # one pytest session (start time, pid)
        tfmem-session.json                        # marks the folder as ours (rotation)
        tests.test_train.py__test_fit@adam-64/    # one traced test, a TensorBoard run

Test directory names are derived from node ids: readable, free of path separators and of
leading dots, bounded in length, and made unique within the session by a numeric suffix.
Rotation only ever deletes folders holding ``tfmem-session.json``, so a trace root pointed
at a folder with other content never loses that content.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

from pytest_tfmem import files
from pytest_tfmem.files import write_text_atomic

SESSION_MARKER = "tfmem-session.json"
MAX_NAME_LENGTH = 120
_UNSAFE = re.compile(r"[^A-Za-z0-9._\-=+,@]+")
_DOTS = re.compile(r"\.{2,}")


def readable_name(nodeid: str) -> str:
    """A directory name for a test: ``tests/test_fit.py::test_fit[adam-64]`` ->
    ``tests.test_fit.py__test_fit@adam-64``.

    Path separators become dots, ``::`` becomes ``__``, the parameter part's brackets an
    ``@``; every other character outside ``A-Z a-z 0-9 . _ - = + , @`` becomes ``_`` (glob
    characters such as ``[`` would break TensorBoard's profile plugin, which globs run paths).
    Runs of dots collapse (so no ``..``) and leading dots go (no hidden or parent names).
    Names longer than ``MAX_NAME_LENGTH`` keep their start and end a hash of the full id.
    """
    base, bracket, parameters = nodeid.partition("[")
    if bracket:
        base += "@" + parameters.removesuffix("]")
    text = base.replace("::", "__").replace("/", ".").replace("\\", ".")
    text = _DOTS.sub(".", _UNSAFE.sub("_", text)).lstrip("._-@") or "test"
    if len(text) > MAX_NAME_LENGTH:
        digest = hashlib.sha1(nodeid.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        text = f"{text[: MAX_NAME_LENGTH - 11].rstrip('.')}~{digest}"
    return text


def create_unique_dir(parent: Path, name: str) -> Path:
    """Create ``parent/name`` (or ``name-2``, ``name-3``...) atomically; the new directory.

    ``name`` must come from ``readable_name``; the result is checked to lie directly in
    ``parent`` all the same. Safe against other processes creating names at the same time.
    """
    parent.mkdir(parents=True, exist_ok=True)
    resolved_parent = parent.resolve()
    for attempt in range(1, 10_000):
        candidate = parent / (name if attempt == 1 else f"{name}-{attempt}")
        if candidate.resolve().parent != resolved_parent:
            raise ValueError(f"trace directory name {name!r} would leave {parent}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise FileExistsError(f"no free trace directory name for {name!r} in {parent}")


def session_name(started: float, pid: int) -> str:
    """``2025-01-31_14-05-09.250_4242``: sorts by start time, unique per process and session."""
    milliseconds = int(started * 1000) % 1000
    return time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(started)) + f".{milliseconds:03d}_{pid}"


def prepare_root(root: Path) -> None:
    """Create the trace root with a ``.gitignore`` that keeps traces out of version control
    (also in a ``.tfmem`` directory above it, such as the default root's)."""
    files.make_directory(root)
    files.ignore_in_git(root)


def prepare_session(root: Path, name: str, details: dict[str, object]) -> Path:
    """The session directory, created with its marker file on first use (by any process)."""
    prepare_root(root)
    session = root / name
    session.mkdir(exist_ok=True)
    marker = session / SESSION_MARKER
    if not marker.exists():
        write_text_atomic(marker, json.dumps(details, indent=2, sort_keys=True) + "\n")
    return session


def session_dirs(root: Path) -> list[Path]:
    """The session directories under ``root`` (those with a marker file), oldest first."""
    if not root.is_dir():
        return []
    sessions = [path for path in root.iterdir() if (path / SESSION_MARKER).is_file()]
    return sorted(sessions, key=lambda path: path.name)


def traced_tests(session: Path) -> list[Path]:
    return sorted(path for path in session.iterdir() if path.is_dir()) if session.is_dir() else []


def rotate(root: Path, keep: int, current: str | None = None) -> list[Path]:
    """Delete all but the ``keep`` newest session directories; drop ``current`` if empty.

    Returns the directories deleted. Folders without the marker file are never touched.
    """
    removed = []
    if current is not None:
        session = root / current
        if (session / SESSION_MARKER).is_file() and not traced_tests(session):
            shutil.rmtree(session, ignore_errors=True)
            removed.append(session)
    sessions = session_dirs(root)
    for session in sessions[: max(0, len(sessions) - keep)]:
        shutil.rmtree(session, ignore_errors=True)
        removed.append(session)
    return removed


def display_path(path: Path, base: Path) -> str:
    """``path`` relative to ``base`` when inside it (shorter to read and type), else absolute."""
    try:
        return os.path.relpath(path, base) if path.resolve().is_relative_to(base.resolve()) else str(path)
    except ValueError:
        return str(path)
