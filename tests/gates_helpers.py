"""Helpers for the CI-gate tests: a generated test suite whose allocations are set per test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

MB = 10**6
# ``tfmem: peak 114.4 MiB vs baseline 76.3 MiB (+49.9% > 10%)``
REGRESSION_LINE = re.compile(
    r"tfmem: peak (?P<now>[\d.]+) MiB vs baseline (?P<before>[\d.]+) MiB \((?P<change>[+-][\d.]+)% > (?P<tolerance>[^)]+)\)"
)


def suite_source(megabytes: dict[str, int], decorators: dict[str, str] | None = None) -> str:
    """A test module: ``test_<name>`` fills ``megabytes[name]`` MB of float64 with numpy, then frees it."""
    decorators = decorators or {}
    lines = ["import numpy as np", "import pytest", ""]
    for name, size in megabytes.items():
        if name in decorators:
            lines.append(decorators[name])
        lines += [f"def test_{name}():", f"    block = np.ones({size * MB} // 8)", "    del block", "", ""]
    return "\n".join(lines)


def write_suite(pytester: pytest.Pytester, megabytes: dict[str, int], decorators: dict[str, str] | None = None) -> None:
    pytester.makepyfile(test_suite=suite_source(megabytes, decorators))


def run(pytester: pytest.Pytester, *args: str, fresh_process: bool = False) -> pytest.RunResult:
    """pytest on the generated suite: in this process (fast), or in a fresh interpreter.

    numpy blocks this size are mapped and unmapped whole, so in-process figures are exact too.
    """
    if fresh_process:
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    return pytester.runpytest("-p", "no:cacheprovider", *args)


def outcomes(report: dict) -> dict[str, str]:
    return {test["nodeid"]: test["outcome"] for test in report["tests"]}


def load(path: Path) -> dict:
    return json.loads(path.read_text())
