"""The package's map: features meet through the core and tfmem's hooks, never by name.

Read from the source (imports and calls) and from what the ``tfmem`` command really imports.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_tfmem import plugin

PACKAGE = Path(plugin.__file__).parent
ROOT = PACKAGE.parent
FEATURES = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file())
PLUGIN_MODULES = set(plugin.pytest_plugins)


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


PACKAGE_FILES = sorted(path for path in PACKAGE.rglob("*.py") if path != PACKAGE / "plugin.py")


def test_the_features_are_the_expected_subpackages():
    assert FEATURES == ["cli", "core", "explain", "gates", "gpu", "isolate", "journal", "leaks", "probes", "trace", "workers"]
    assert len([path for path in PACKAGE.glob("*.py")]) <= 12  # a short top level


@pytest.mark.parametrize("path", [*PACKAGE_FILES, *sorted((ROOT / "scenarios").glob("*.py"))], ids=module_name)
def test_nothing_imports_the_entry_point(path: Path):
    assert "pytest_tfmem.plugin" not in imported_modules(path)


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=module_name)
def test_a_feature_imports_no_other_features_plugin_module(path: Path):
    own = module_name(path).split(".")[1] if path.parent != PACKAGE else None
    others = {name for name in PLUGIN_MODULES if name.split(".")[1] not in (own, "core")}
    assert not imported_modules(path) & others


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=module_name)
def test_no_plugin_is_looked_up_by_name(path: Path):
    """``pluginmanager.get_plugin("tfmem-...")``: features meet through hooks and the core instead."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        lookup = ("get_plugin", "getplugin", "has_plugin", "hasplugin")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in lookup:
            # only other plugins' (pytest's "capturemanager", pytest-xdist's "dsession"), by literal name
            for arg in node.args:
                assert isinstance(arg, ast.Constant) and not str(arg.value).startswith("tfmem"), ast.unparse(node)


def test_the_tfmem_command_reaches_no_pytest_plugin_module():
    """The CLI reads reports, baselines and the journal with modules that hold no pytest hooks."""
    code = (
        "import json, sys\n"
        "import pytest_tfmem.cli.main, pytest_tfmem.journal.reader\n"
        "print(json.dumps(sorted(name for name in sys.modules if name.startswith('pytest_tfmem'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    loaded = set(json.loads(done.stdout))
    assert "pytest_tfmem.cli.main" in loaded and "pytest_tfmem.journal.format" in loaded
    assert not loaded & (PLUGIN_MODULES | {"pytest_tfmem.plugin", "pytest_tfmem.hookspecs"})
