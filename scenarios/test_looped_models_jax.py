"""Scenario 4 on Keras's JAX backend: each model of a new shape compiles new code, which JAX keeps;
``clear_session()`` does not free it, ``jax.clear_caches()`` or one reused model does. Each variant
runs in a process of its own (``looped_models_jax``), measured as a process the test started."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_tfmem import LeakDetected

# Looked up, not imported: the variants run in processes of their own
pytestmark = [
    pytest.mark.scenario("4. looped models (Keras on JAX)"),
    pytest.mark.longest,  # a process of its own each, compiling a model a shape: several seconds
    pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed: JAX variants"),
]
ROOT = Path(__file__).resolve().parent.parent


def run_variant(name: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "scenarios.looped_models_jax", name],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


leaks = pytest.mark.xfail(strict=True, raises=LeakDetected, reason="memory grows every iteration")


def raise_if_leaked(report: dict) -> None:
    """The variant's leak check ran in its own process: its verdict, raised here."""
    if report["leaked"]:
        raise LeakDetected(report["description"])


@pytest.mark.variant("problem", "JAX: a new model shape per iteration")
@leaks
def test_jax_problem_new_shapes(leak_in_a_child):
    report = run_variant("problem_new_shapes")
    leak_in_a_child(report)
    assert "JAX compiled executables" in report["holders"], report["description"]
    raise_if_leaked(report)


@pytest.mark.variant("no help", "JAX: clear_session() + gc.collect()")
@leaks
def test_jax_no_help_clear_session(leak_in_a_child):
    report = run_variant("no_help_clear_session")
    leak_in_a_child(report)
    assert "JAX compiled executables" in report["holders"], report["description"]  # still compiled anew
    raise_if_leaked(report)


@pytest.mark.variant("fix", "JAX: jax.clear_caches() each iteration")
def test_jax_fix_clear_caches(leak_in_a_child):
    report = run_variant("fix_clear_caches")
    leak_in_a_child(report)
    raise_if_leaked(report)


@pytest.mark.variant("fix", "JAX: one model, inputs padded to one shape")
def test_jax_fix_one_model(leak_in_a_child):
    report = run_variant("fix_one_model")
    leak_in_a_child(report)
    raise_if_leaked(report)
