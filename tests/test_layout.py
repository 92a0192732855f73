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
    assert FEATURES == [
        "cli", "core", "explain", "frameworks", "gates", "gpu", "html", "isolate", "journal", "kernels", "leaks",
        "platforms", "probes", "run", "session", "trace", "workers",
    ]
    assert len([path for path in PACKAGE.glob("*.py")]) <= 12  # a short top level


@pytest.mark.parametrize("path", [*PACKAGE_FILES, *sorted((ROOT / "scenarios").glob("*.py"))], ids=module_name)
def test_nothing_imports_the_entry_point(path: Path):
    assert "pytest_tfmem.plugin" not in imported_modules(path)


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=module_name)
def test_a_feature_imports_no_other_features_plugin_module(path: Path):
    own = module_name(path).split(".")[1] if path.parent != PACKAGE else None
    others = {name for name in PLUGIN_MODULES if name.split(".")[1] not in (own, "core")}
    assert not imported_modules(path) & others


# Feature subpackages: each a concern of its own that meets the others only through the core.
# ``core``, ``probes``, ``frameworks`` and ``platforms`` (below every feature) and ``cli`` (the
# command, which reads the files the features write) are no features.
FEATURE_PACKAGES = {"explain", "gates", "gpu", "html", "isolate", "journal", "kernels", "leaks", "run", "session", "trace",
                    "workers"}
# Libraries a feature offers every other part: the journal's file format and its reader.
SHARED_LIBRARIES = {"pytest_tfmem.journal.format", "pytest_tfmem.journal.reader"}
# Imports that go once what they import moves below the features (none left).
NOT_YET_BELOW: set[tuple[str, str]] = set()


def imported_package_modules(path: Path) -> set[str]:
    """The ``pytest_tfmem`` modules ``path`` imports, anywhere in it (``from a import b``: ``a.b``
    if that is a module, else ``a``; a package only where none of its modules is named)."""
    modules = set()
    for name in imported_modules(path):
        if not name.startswith("pytest_tfmem."):
            continue
        parts = name.split(".")
        is_module = ROOT.joinpath(*parts).with_suffix(".py").is_file() or (ROOT.joinpath(*parts) / "__init__.py").is_file()
        modules.add(name if is_module else ".".join(parts[:-1]))
    # ``from pytest_tfmem.leaks import check`` imports the module ``check``, not just its package
    return {name for name in modules if not any(other.startswith(f"{name}.") for other in modules)}


def feature_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[1] in FEATURE_PACKAGES else None


def test_the_feature_packages_are_the_subpackages_besides_core_probes_frameworks_platforms_and_cli():
    assert set(FEATURES) - {"cli", "core", "probes", "frameworks", "platforms"} == FEATURE_PACKAGES


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=module_name)
def test_a_feature_imports_no_other_feature_and_the_core_and_probes_none(path: Path):
    """What two features share lives below both (``core/``, ``probes/``), or travels as a typed
    value (``core/handoffs.py``); the command line and the package's top level may use any."""
    module = module_name(path)
    own = module.split(".")[1] if path.parent != PACKAGE else None
    if own == "cli" or path.parent == PACKAGE:
        return
    crossing = {
        imported
        for imported in imported_package_modules(path)
        if feature_of(imported) not in (None, own) and imported not in SHARED_LIBRARIES
    }
    assert crossing <= {imported for importer, imported in NOT_YET_BELOW if importer == module}, crossing


def test_the_allowed_crossings_still_exist():
    """An entry of ``NOT_YET_BELOW`` goes as soon as its import goes."""
    for importer, imported in NOT_YET_BELOW:
        path = ROOT.joinpath(*importer.split(".")).with_suffix(".py")
        assert imported in imported_package_modules(path), (importer, imported)


@pytest.mark.parametrize("path", sorted((PACKAGE / "probes").glob("*.py")), ids=module_name)
def test_probes_know_nothing_of_pytest_or_the_rest_of_the_package(path: Path):
    imported = imported_modules(path)
    assert not {name for name in imported if name.split(".")[0] in ("pytest", "_pytest", "pluggy")}
    package = imported_package_modules(path)  # the frameworks' and platforms' modules are as low
    assert all(name.startswith(("pytest_tfmem.probes", "pytest_tfmem.frameworks", "pytest_tfmem.platforms"))
               for name in package), package


@pytest.mark.parametrize("path", sorted((PACKAGE / "frameworks").glob("*.py")), ids=module_name)
def test_framework_modules_need_only_the_standard_library_and_each_other(path: Path):
    """``tfmem run``'s agent loads them without the package. A module reaches into its own
    framework's internals only once user code loaded it (``tensorflow.python.eager.context``)."""
    imported = {name.split(".")[0] for name in imported_modules(path)}
    assert imported <= {*sys.stdlib_module_names, "__future__", path.stem}, imported


@pytest.mark.parametrize("path", sorted((PACKAGE / "platforms").glob("*.py")), ids=module_name)
def test_platform_modules_need_only_the_standard_library_and_psutil(path: Path):
    """``tfmem run``'s agent loads them without the package (psutil only where a module reads
    another process through it, imported there)."""
    imported = {name.split(".")[0] for name in imported_modules(path)}
    assert imported <= {*sys.stdlib_module_names, "__future__", "psutil"}, imported


# What only some operating systems have: named in ``platforms/`` alone (the portable fallback and
# each system's module), so that every other module imports and runs on all of them.
SYSTEM_ONLY_ATTRIBUTES = {
    "os": {"fork", "forkpty", "wait4", "waitid", "register_at_fork", "pread", "sysconf", "setsid", "killpg"},
    "signal": {"SIGKILL", "SIGBUS", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGALRM"},
}
SYSTEM_ONLY_MODULES = {"fcntl", "resource", "msvcrt", "termios", "pwd", "grp"}


@pytest.mark.parametrize("path", [p for p in PACKAGE_FILES if p.parent.name != "platforms"], ids=module_name)
def test_only_the_platform_modules_name_what_only_some_systems_have(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    assert not {name.split(".")[0] for name in imported_modules(path)} & SYSTEM_ONLY_MODULES
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            assert node.attr not in SYSTEM_ONLY_ATTRIBUTES.get(node.value.id, ()), f"{path.name}:{node.lineno}: {ast.unparse(node)}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/proc"):
            raise AssertionError(f"{path.name}:{node.lineno}: {node.value!r}")


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=module_name)
def test_pytest_internals_are_reached_only_through_core_pytest_internals(path: Path):
    """``_pytest`` modules and ``_private`` attributes of pytest's objects: see
    ``core/pytest_internals.py`` (and ``tests/test_pytest_internals.py``)."""
    if path == PACKAGE / "core" / "pytest_internals.py":
        return
    tree = ast.parse(path.read_text(), str(path))
    assert not {name for name in imported_modules(path) if name.split(".")[0] == "_pytest"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            assert not node.value.startswith("_pytest"), ast.unparse(node)
        if isinstance(node, ast.Attribute) and node.attr in PYTEST_PRIVATE_ATTRIBUTES:
            raise AssertionError(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "hasattr", "setattr"):
            names = [arg.value for arg in node.args[1:2] if isinstance(arg, ast.Constant)]
            assert not set(names) & PYTEST_PRIVATE_ATTRIBUTES, ast.unparse(node)


# The private attributes of pytest's objects the plugin uses (``core/pytest_internals.py``).
PYTEST_PRIVATE_ATTRIBUTES = {
    "_excinfo",
    "_fixtureinfo",
    "_setupstate",
    "_tmp_path_factory",
    "_basetemp",
    "_given_basetemp",
}


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
