"""The release check: what .github/workflows/release.yml runs before it publishes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_release.sh"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def check_release(dist: Path, **environment: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), str(dist)], env={**os.environ, "PYTHON": sys.executable, **environment},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


@pytest.mark.slow  # a build, a fresh virtual environment and installs from the package index: ~40 s
def test_the_release_check_builds_installs_and_runs_the_wheel(tmp_path: Path):
    pytest.importorskip("build")
    pytest.importorskip("twine")
    done = check_release(tmp_path / "dist")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASSED" in done.stdout  # twine check, for both files
    lines = done.stdout.splitlines()
    assert any(line.startswith("test_small.py::test_small ") and line.endswith(" passed") for line in lines)
    assert lines[-1].startswith("check_release: pytest_tfmem-") and lines[-1].endswith("built, checked, installed and run")
    assert sorted(path.suffix for path in (tmp_path / "dist").iterdir()) == [".gz", ".whl"]


def test_a_tag_that_does_not_name_the_version_stops_the_release(tmp_path: Path):
    done = check_release(tmp_path / "dist", RELEASE_TAG="v0.0.0-wrong")
    assert done.returncode == 1
    assert "tag v0.0.0-wrong does not name pyproject.toml's version" in done.stderr
    assert not list((tmp_path / "dist").iterdir())  # stopped before building


def test_the_workflow_publishes_what_the_check_passed_on_tags_only():
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load(WORKFLOW.read_text())
    build, publish = workflow["jobs"]["build"], workflow["jobs"]["publish"]
    assert any("scripts/check_release.sh" in step.get("run", "") for step in build["steps"])
    assert publish["needs"] == "build" and "github.ref_type == 'tag'" in publish["if"]
    assert publish["permissions"] == {"id-token": "write"} and publish["environment"]["name"] == "pypi"
    assert publish["steps"][-1]["uses"].startswith("pypa/gh-action-pypi-publish@")
    assert workflow[True]["push"]["tags"] == ["v*"]  # YAML reads the key ``on`` as True
