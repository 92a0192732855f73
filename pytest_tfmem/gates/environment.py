"""What a memory figure depends on besides the code: Python, TensorFlow/Keras versions, machine.

Read without importing TensorFlow (package metadata only), so it costs nothing in a
session that does not use it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from pytest_tfmem import platforms
from pytest_tfmem.platforms.base import RSS
from pytest_tfmem.probes.nvml import Nvml

# The modules whose version changes memory figures (the key in the environment), each with the
# distributions known to provide it, the usual one first: a figure depends on the module, whichever
# wheel brought it (a CPU-only build, Apple's or Intel's, a nightly; a local version such as
# PyTorch's ``+cpu`` or ``+cu121`` is kept, so a change of build is a change of version).
PROVIDERS = {
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-macos", "tensorflow-intel", "tf-nightly",
                   "tf-nightly-cpu", "tensorflow-gpu", "intel-tensorflow", "tensorflow-aarch64", "tensorflow-rocm"),
    "keras": ("keras", "keras-nightly"),
    "tf_keras": ("tf-keras", "tf-keras-nightly"),
    "numpy": ("numpy",),
    "jax": ("jax",),
    "jaxlib": ("jaxlib",),
    "torch": ("torch",),
}


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def _all_providers() -> Mapping[str, list[str]]:
    """Every installed distribution by the modules it provides: a third of a second, so asked only
    for a module that none of its known distributions provides."""
    return metadata.packages_distributions()


def module_version(module: str) -> str | None:
    """The version of the installed distribution that provides ``module`` (``tensorflow-cpu``'s for
    ``tensorflow``), without importing it; ``None`` where the module is not installed. Two
    distributions of one module at different versions are both named (``2.21.0 (tensorflow),
    2.20.0 (tensorflow-cpu)``): which one's files are imported is not told by their metadata."""
    found = {name: version for name in PROVIDERS.get(module, (module,)) if (version := _version(name)) is not None}
    if not found:
        try:
            if importlib.util.find_spec(module) is None:
                return None
        except (ImportError, ValueError):
            return None
        found = {name: version for name in _all_providers().get(module, []) if (version := _version(name))}
    if len(set(found.values())) <= 1:
        return next(iter(found.values()), None)
    return ", ".join(f"{version} ({name})" for name, version in found.items())


def _gpu_names() -> list[str]:
    """GPU names through NVML (the ``gpu`` extra); empty without it, a driver or a GPU."""
    nvml, _ = Nvml.open()
    if nvml is None:
        return []
    try:
        return [device.name for device in nvml.devices()]
    except nvml.error:
        return []
    finally:
        nvml.close()


def memory_environment() -> dict[str, Any]:
    """The operating system and how it reads memory: ``platform``, ``memory`` (what the figures
    count), ``peaks`` (how they are read)."""
    reads = platforms.current()
    return {
        "platform": f"{platform.system()} {platform.machine()}",
        "memory": reads.counts,
        "peaks": reads.peak_method(),
    }


def current_environment() -> dict[str, Any]:
    """``{"python": "3.11", "platform": "Linux x86_64", "memory": "RSS", "peaks": "exact", "cpu": ...,
    "cpu_count": 2, "gpus": [], "tensorflow": "2.21.0", ..., "torch": "2.14.1+cpu"}``: ``memory``
    is what the figures count and ``peaks`` how the platform reads them (``platforms``); each
    framework's version is its module's, whichever distribution provides it (``PROVIDERS``)."""
    environment: dict[str, Any] = {
        "python": ".".join(platform.python_version_tuple()[:2]),
        **memory_environment(),
        "cpu": platforms.current().cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpus": _gpu_names(),
    }
    for module in PROVIDERS:
        environment[module] = module_version(module)
    return environment


def unlike_memory(recorded: dict[str, Any], current: dict[str, Any], *, current_label: str = "here") -> str | None:
    """Why figures recorded in ``recorded`` cannot be compared with those of ``current``: they count
    different things (RSS on Linux, phys_footprint on macOS, the working set on Windows); ``None``
    where they count the same. A baseline from before platforms were named counted Linux's RSS."""
    before, now = recorded.get("memory", RSS), current.get("memory", RSS)
    if before == now:
        return None
    return (
        f"not compared: the baseline's figures count {before} ({_show(recorded.get('platform'))}), those "
        f"{current_label} count {now} ({_show(current.get('platform'))}); save a baseline on this platform"
    )


def environment_differences(
    recorded: dict[str, Any], current: dict[str, Any], *, current_label: str = "here"
) -> list[str]:
    """``["tensorflow 2.20.0 in the baseline, 2.21.0 here", ...]`` for each key that differs."""
    differences = []
    for key in sorted(set(recorded) | set(current)):
        before, now = recorded.get(key), current.get(key)
        if before != now:
            differences.append(f"{key} {_show(before)} in the baseline, {_show(now)} {current_label}")
    return differences


def _show(value: Any) -> str:
    if value is None or value == []:
        return "none"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)
