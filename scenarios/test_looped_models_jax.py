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

# Looked up, not imported: the variants run in processes of their own
pytestmark = [
    pytest.mark.scenario("4. looped models"),
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


@pytest.mark.variant("problem", "JAX: a new model shape per iteration")
def test_jax_problem_new_shapes():
    report = run_variant("problem_new_shapes")
    assert report["leaked"] and "JAX compiled executables" in report["holders"], report["description"]


@pytest.mark.variant("no help", "JAX: clear_session() + gc.collect()")
def test_jax_no_help_clear_session():
    report = run_variant("no_help_clear_session")
    assert report["leaked"] and "JAX compiled executables" in report["holders"], report["description"]


@pytest.mark.variant("fix", "JAX: jax.clear_caches() each iteration")
def test_jax_fix_clear_caches():
    report = run_variant("fix_clear_caches")
    assert not report["leaked"], report["description"]


@pytest.mark.variant("fix", "JAX: one model, inputs padded to one shape")
def test_jax_fix_one_model():
    report = run_variant("fix_one_model")
    assert not report["leaked"], report["description"]
