"""The ``scenarios`` extra holds what the main job needs and nothing else; the ``test`` extra keeps
the rest; no extra but ``test`` names TensorFlow, which the main job gets from
``requirements/tensorflow.txt``. (What each install weighs and takes: ``python -m benchmarks.quick_start``.)"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")

pytestmark = pytest.mark.any_os


def extra(name: str) -> set[str]:
    """The distributions an extra names (``""``: the dependencies), without versions."""
    data = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
    listed = data["project"]["dependencies"] if name == "" else data["project"]["optional-dependencies"][name]
    return {re.split(r"[<>=\[ ;]", requirement, maxsplit=1)[0].lower() for requirement in listed}


TENSORFLOW = {"tensorflow", "tensorflow-cpu", "tensorflow-macos", "tensorflow-intel", "tf-nightly"}


def requirements(path: Path) -> set[str]:
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return {re.split(r"[<>=\[ ;]", line, maxsplit=1)[0].lower() for line in lines if line}


def test_the_scenarios_extra_brings_no_pytorch_no_linter_and_no_plugin_that_changes_a_session():
    light = extra("scenarios")
    assert light == {"numpy", "jax", "pytest-xdist"}
    assert requirements(REPOSITORY / "requirements" / "tensorflow.txt") == {"tensorflow-cpu", "tensorflow"}
    assert "pytest-randomly" in extra("test")  # it shuffles every run of an environment: the tests' only
    assert light <= extra("test")  # the tests need what the main job needs


def test_no_extra_for_a_projects_own_environment_brings_a_second_tensorflow():
    """One that has TensorFlow already, from any wheel, gets no other from an extra
    (tests/test_first_hour.py follows the README's line in such an environment)."""
    data = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
    for name in data["project"]["optional-dependencies"]:
        if name != "test":  # this project's own tests: tf-keras requires the full wheel anyway
            assert not extra(name) & TENSORFLOW, name
    assert not extra("") & TENSORFLOW


# A module the scenarios import -> the distribution that brings it (Keras comes with TensorFlow)
BROUGHT_BY = {"numpy": "numpy", "tensorflow": "tensorflow-cpu", "keras": "tensorflow-cpu", "jax": "jax",
              "pytest": "pytest", "pytest_tfmem": "pytest-tfmem"}
# What a scenario imports only to skip without it (scenarios.md, "Pruning": the prune extra)
OPTIONAL = {"tensorflow_model_optimization", "tf_keras"}


def test_every_module_the_scenarios_import_comes_with_the_scenarios_extra():
    brought = extra("") | extra("scenarios") | requirements(REPOSITORY / "requirements" / "tensorflow.txt") | {"pytest-tfmem"}
    for path in sorted((REPOSITORY / "scenarios").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                top = name.split(".", 1)[0]
                if top in sys.stdlib_module_names or top in OPTIONAL or top == "scenarios":
                    continue
                assert BROUGHT_BY.get(top) in brought, f"{path.name} imports {name}, which the scenarios extra lacks"
