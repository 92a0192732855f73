"""What a memory figure depends on besides the code: Python, TensorFlow/Keras versions, machine.

Read without importing TensorFlow (package metadata only), so it costs nothing in a
session that does not use it.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import Any

from pytest_tfmem.probes.nvml import Nvml

# Distributions whose version changes memory figures; key in the environment -> distribution.
_PACKAGES = {"tensorflow": "tensorflow", "keras": "keras", "tf_keras": "tf-keras", "numpy": "numpy"}


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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


def current_environment() -> dict[str, Any]:
    """``{"python": "3.11", "platform": "Linux x86_64", "cpu": ..., "cpu_count": 2, "gpus": [],
    "tensorflow": "2.21.0", ...}``."""
    environment: dict[str, Any] = {
        "python": ".".join(platform.python_version_tuple()[:2]),
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpus": _gpu_names(),
    }
    for key, distribution in _PACKAGES.items():
        environment[key] = _version(distribution)
    return environment


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
