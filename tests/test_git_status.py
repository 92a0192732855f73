"""tfmem's files stay out of version control: every ``.tfmem`` directory ignores itself."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_tfmem import files
from pytest_tfmem.files import create_text_atomic
from pytest_tfmem.trace import dirs as tracedirs


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_measured_and_a_traced_session_leave_git_status_clean(pytester: pytest.Pytester):
    git(pytester.path, "init", "-q")
    pytester.makepyfile(test_suite="def test_one():\n    assert sum(range(3)) == 3\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB").assert_outcomes(passed=1)
    assert (pytester.path / ".tfmem" / "results.jsonl").is_file()
    traced = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB", "--tfmem-trace=always")
    traced.assert_outcomes(passed=1)
    assert tracedirs.session_dirs(pytester.path / ".tfmem" / "traces")

    status = git(pytester.path, "status", "--porcelain", "--untracked-files=all")
    assert ".tfmem" not in status
    assert "test_suite.py" in status  # git does see the rest
    assert (pytester.path / ".tfmem" / ".gitignore").read_text() == "# Created by pytest-tfmem automatically.\n*\n"


def test_every_tfmem_directory_on_the_way_gets_its_gitignore_once(tmp_path: Path):
    deep = files.make_directory(tmp_path / ".tfmem" / "traces" / "session")
    assert deep.is_dir()
    assert (tmp_path / ".tfmem" / ".gitignore").read_text() == files.GITIGNORE
    assert not (deep / ".gitignore").exists() and not (tmp_path / ".gitignore").exists()
    # One that exists is never replaced: a user may have written their own.
    (tmp_path / ".tfmem" / ".gitignore").write_text("!keep-me\n")
    files.make_directory(tmp_path / ".tfmem")
    assert (tmp_path / ".tfmem" / ".gitignore").read_text() == "!keep-me\n"
    # Elsewhere nothing is ignored unless asked (a trace root asks for its own).
    assert files.make_directory(tmp_path / "ci" / "results") == tmp_path / "ci" / "results"
    assert not list(tmp_path.joinpath("ci").rglob(".gitignore"))


def test_create_text_atomic_creates_once_and_leaves_no_temporary_file(tmp_path: Path):
    target = tmp_path / "file"
    assert create_text_atomic(target, "first\n") is True
    assert create_text_atomic(target, "second\n") is False
    assert target.read_text() == "first\n"
    assert [path.name for path in tmp_path.iterdir()] == ["file"]
