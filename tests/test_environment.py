"""The environment names each framework by the module it provides, whichever distribution brought
it; a change of version (a local build tag included) starts another series of the history."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from pytest_tfmem.gates import environment
from pytest_tfmem.gates.history import series_key, series_label


def installed(folder: Path, name: str, version: str, *, provides: str | None = None) -> None:
    """A distribution's metadata as pip installs it (``NAME-VERSION.dist-info``), and the package
    it provides where named."""
    info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if provides is not None:
        (info / "top_level.txt").write_text(f"{provides}\n")
        (folder / provides).mkdir()
        (folder / provides / "__init__.py").write_text("")


def test_tensorflow_is_named_whichever_wheel_provides_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tensorflow = metadata.version("tensorflow")  # this environment's: the full wheel
    assert environment.current_environment()["tensorflow"] == tensorflow
    installed(tmp_path, "tf-nightly", "2.99.0.dev1")  # a second wheel of the same module, another version
    monkeypatch.syspath_prepend(str(tmp_path))
    assert environment.module_version("tensorflow") == f"{tensorflow} (tensorflow), 2.99.0.dev1 (tf-nightly)"
    assert set(environment.PROVIDERS["tensorflow"]) >= {
        "tensorflow", "tensorflow-cpu", "tensorflow-macos", "tensorflow-intel", "tf-nightly"}


def test_a_module_no_known_wheel_provides_is_found_through_every_distributions_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed(tmp_path, "tfmemdemo-gpu", "1.2.3", provides="tfmemdemo")
    monkeypatch.syspath_prepend(str(tmp_path))
    environment._all_providers.cache_clear()
    try:
        assert environment.module_version("tfmemdemo") == "1.2.3"
        assert environment.module_version("tfmemdemo_absent") is None
    finally:
        environment._all_providers.cache_clear()


def test_a_change_of_build_is_another_series_and_a_framework_not_installed_changes_none() -> None:
    before = {"python": "3.11", "platform": "Linux x86_64", "tensorflow": "2.21.0", "torch": "2.14.1+cpu"}
    assert series_key(before) != series_key({**before, "torch": "2.14.1+cu121"})
    # a line written before the environment named JAX and PyTorch, or on a machine without them
    assert series_key({**before, "torch": None, "jax": None}) == series_key(
        {"python": "3.11", "platform": "Linux x86_64", "tensorflow": "2.21.0"})
    assert series_label(before) == "Python 3.11, Linux x86_64 (RSS), tensorflow 2.21.0, torch 2.14.1+cpu"
