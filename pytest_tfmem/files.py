"""tfmem's files: written atomically, read back checked, kept in ``.tfmem`` out of version control.

``write_text_atomic`` and ``create_text_atomic`` write so that readers see the old content or
the new, never a truncated mix. An output (``Output``: a report, a summary, a chart) is written
only over a file that is already one of its kind: ``overwrite_refusal`` says why another is
not (a test file taken for the path when ``--tfmem-report=PATH`` was typed with a space).
Every path the user names for an output follows one rule before anything runs: after
``overwrite_refusal``, ``prepare_output`` makes its missing directories (as pytest's
``--junitxml`` makes them), or says why it cannot be written. A write that still fails at the end (a full disk) goes to
``.tfmem/unwritten/`` instead (``set_aside``), and says where.
``VersionedJson`` is a JSON file format of tfmem's (baselines, reports): an object that names its
format and version, written atomically and read back with both checked, every problem a
``FileFormatError`` naming the file.

Every place that creates a directory for tfmem's files (the results journal, traces) goes
through ``make_directory``: a ``.tfmem`` directory it creates or finds on the way gets a
``.gitignore`` holding ``*``, as pytest does for ``.pytest_cache``, so ``git status`` stays
clean without an entry in the project's own ``.gitignore``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DIRECTORY = ".tfmem"
GITIGNORE = "# Created by pytest-tfmem automatically.\n*\n"


def _new_file_mode() -> int:
    """The permission bits a file created now gets: ``0o666`` less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def _removed_on_failure(temporary: str) -> Iterator[None]:
    """Remove the temporary file if the block fails (a full disk, an interrupt)."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def _write_temporary(target: Path, chunks: Iterable[str], mode: int) -> str:
    """A temporary file beside ``target`` holding the ``chunks`` one after the other (written as
    they come), flushed to disk, with ``mode``."""
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    with _removed_on_failure(temporary):
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            for chunk in chunks:
                stream.write(chunk)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
    return temporary


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, flush it to disk, then rename it over ``path``.

    If anything fails (a full disk, an interrupt) the old file is left as it was and the
    temporary file is removed. A replaced file keeps its permission bits.
    """
    write_chunks_atomic(path, (text,))


def write_chunks_atomic(path: str | os.PathLike[str], chunks: Iterable[str]) -> None:
    """``write_text_atomic`` of the ``chunks`` joined, each written as it comes: a file of every
    test is never one string in memory."""
    target = Path(path)
    try:
        mode = target.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = _new_file_mode()
    temporary = _write_temporary(target, chunks, mode)
    with _removed_on_failure(temporary):
        os.replace(temporary, target)


def write_file_atomic(path: str | os.PathLike[str], write: Callable[[str], object]) -> None:
    """Let ``write`` write a temporary file beside ``path`` (it gets the file's name: for writers
    that open the file themselves, like matplotlib's ``savefig``), then rename it over ``path``.

    If ``write`` fails the old file is left as it was and the temporary file is removed.
    """
    target = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    with _removed_on_failure(temporary):
        write(temporary)
        os.replace(temporary, target)


def create_text_atomic(path: str | os.PathLike[str], text: str) -> bool:
    """Create ``path`` holding ``text`` unless it exists; True if this call created it.

    The file appears complete or not at all, and an existing file is never replaced, even
    when several processes try at once: the temporary file is hard-linked to ``path``, which
    fails if ``path`` exists. (Where hard links are not supported, it is renamed into place.)
    """
    target = Path(path)
    if target.exists():
        return False
    temporary = _write_temporary(target, (text,), _new_file_mode())
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


class FileFormatError(Exception):
    """A file that cannot be used: the message names the file (``what`` it is) and the problem."""

    what = "tfmem"

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"{self.what} file {str(path)!r}: {problem}")
        self.path = str(path)
        self.problem = problem


@dataclass(frozen=True)
class VersionedJson:
    """A JSON file format: an object with ``"format": name`` and ``"version": version``."""

    name: str  # "pytest-tfmem-baseline"
    version: int
    how_to_make: str  # "create one with --tfmem-save-baseline=PATH", for a missing file
    error: type[FileFormatError]

    @property
    def output(self) -> Output:
        """This format as an output a path option names (``overwrite_refusal``)."""
        return Output(self.error.what, json_format(self.name))

    def write(self, path: str | os.PathLike[str], body: dict[str, Any]) -> None:
        """Write ``body`` with the format's name and version, atomically."""
        data = {"format": self.name, "version": self.version, **body}
        write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")

    def write_streamed(
        self, path: str | os.PathLike[str], body: dict[str, Any], key: str, items: Iterable[dict[str, Any]]
    ) -> None:
        """``write(path, {**body, key: list(items)})``, byte for byte, with the list's items
        encoded and written one at a time as ``items`` yields them: a list of every test's
        record is never held whole (``key`` is a top-level key of the file)."""
        write_chunks_atomic(path, self._streamed_chunks(body, key, items))

    def _streamed_chunks(self, body: dict[str, Any], key: str, items: Iterable[dict[str, Any]]) -> Iterator[str]:
        data = {"format": self.name, "version": self.version, **body, key: []}
        text = json.dumps(data, indent=2, sort_keys=True)
        # At the top level a key is indented by two spaces; deeper ones by more, and newlines in
        # strings are escaped: this is the one place the empty list stands.
        empty = f"\n  {json.dumps(key)}: []"
        before, after = text.split(empty)
        yield f"{before}\n  {json.dumps(key)}: ["
        separator = "\n    "
        for item in items:
            yield separator + json.dumps(item, indent=2, sort_keys=True).replace("\n", "\n    ")
            separator = ",\n    "
        yield ("]" if separator == "\n    " else "\n  ]") + after + "\n"

    def read(self, path: str | os.PathLike[str], *, missing_ok: bool = False) -> dict[str, Any] | None:
        """The file's object, checked by ``parse``; ``None`` for an absent file if ``missing_ok``.

        Raises ``error`` for a missing (unless allowed), unreadable, empty, corrupt or
        wrong-version file.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            if missing_ok:
                return None
            raise self.error(path, f"no such file ({self.how_to_make})") from None
        except UnicodeDecodeError:
            raise self.error(path, f"not a text file (it is not UTF-8): not a pytest-tfmem {self.error.what}") from None
        except OSError as error:
            raise self.error(path, f"cannot be read ({error.strerror or error})") from None
        return self.parse(text, path)

    def parse(self, text: str, path: str | os.PathLike[str]) -> dict[str, Any]:
        """The object in ``text``, once it is JSON of this format and version."""
        what = self.error.what
        if not text.strip():
            raise self.error(path, f"the file is empty: not a pytest-tfmem {what}")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            where = f"line {error.lineno}, column {error.colno}: {error.msg}"
            raise self.error(path, f"not valid JSON ({where})") from None
        if not isinstance(data, dict) or data.get("format") != self.name:
            expected = f'expected a JSON object with "format": "{self.name}"'
            raise self.error(path, f"not a pytest-tfmem {what} ({expected})")
        if data.get("version") != self.version:
            raise self.error(
                path,
                f"{what} format version {data.get('version')!r} is not supported "
                f"(this pytest-tfmem reads version {self.version})",
            )
        return data


# How much of an existing file is read to tell whether it is a tfmem output of a kind.
_HEAD_BYTES = 4096
_IMAGE_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"%PDF-", b"<svg", b"<?xml")


@dataclass(frozen=True)
class Output:
    """A kind of file tfmem writes at a path the user gives, and how one is recognised."""

    name: str  # "JSON report"
    # Whether an existing file is one of this kind; ``None`` where its reader checks it in detail
    # before anything is written (a baseline, which a save merges into).
    recognise: Callable[[Path], bool] | None


def json_format(name: str) -> Callable[[Path], bool]:
    """A ``VersionedJson`` file of the format ``name`` (any version)."""

    def recognise(path: Path) -> bool:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and data.get("format") == name

    return recognise


def first_line(test: Callable[[str], bool]) -> Callable[[Path], bool]:
    """A text file whose first line passes ``test``."""

    def recognise(path: Path) -> bool:
        try:
            with open(path, encoding="utf-8", errors="strict") as stream:
                return test(stream.readline(_HEAD_BYTES).strip())
        except (OSError, ValueError):
            return False

    return recognise


def starts_with(text: str) -> Callable[[Path], bool]:
    """A file that begins with ``text``."""

    def recognise(path: Path) -> bool:
        try:
            with open(path, "rb") as stream:
                return stream.read(len(text.encode())) == text.encode()
        except OSError:
            return False

    return recognise


def _image(path: Path) -> bool:
    try:
        with open(path, "rb") as stream:
            return stream.read(len(_IMAGE_SIGNATURES[0])).startswith(_IMAGE_SIGNATURES)
    except OSError:
        return False


IMAGE = Output("chart (PNG, SVG or PDF)", _image)


def prepare_output(path: Path) -> str | None:
    """Why ``path`` cannot be written (a directory above it that is a file, a directory it would be
    made in that cannot be written to, a read-only file), or ``None`` once its missing directories
    are made."""
    existing = next((parent for parent in path.parents if parent.exists()), None)
    if existing is not None and not existing.is_dir():
        return f"{existing} is a file, not a directory"
    if path.exists() and not os.access(path, os.W_OK):
        return "it is read-only"
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        return f"the directory {existing} cannot be written to"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return f"its directory {path.parent} cannot be made ({error.strerror or error})"
    return None


def set_aside(root: Path, path: Path, write: Callable[[Path], None], kept: str = "") -> str:
    """Write with ``write`` what could not be written at ``path`` to ``.tfmem/unwritten/`` under
    ``root`` (the session's rootdir) instead, by its own name; what to add to the message that says
    so: where it went (and ``kept``, what to do with it), or why it could not go there either."""
    try:
        instead = make_directory(root / DIRECTORY / "unwritten") / path.name
        write(instead)
    except (OSError, FileFormatError) as error:
        return f"; nor to {DIRECTORY}/unwritten/ ({getattr(error, 'strerror', None) or error})"
    return f"; written to {instead} instead{kept}"


def overwrite_refusal(path: Path, kind: Output) -> str | None:
    """Why ``path`` must not be written as ``kind``, or ``None``: a directory, a Python source
    file, or an existing file that is not one of ``kind``."""
    if path.is_dir():
        return "it is a directory"
    if path.suffix in (".py", ".pyi", ".ipynb"):
        return "it is Python source" + (", not a pytest-tfmem " + kind.name if path.exists() else "")
    if path.exists() and kind.recognise is not None and not kind.recognise(path):
        return f"it exists and is not a pytest-tfmem {kind.name}"
    return None
