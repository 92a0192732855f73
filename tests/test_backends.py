"""Keras 3 on JAX, measured like TensorFlow: runtime start booked apart, what holds the memory,
clean-up, leak checks and traces, on real pytest runs with ``KERAS_BACKEND=jax`` (TensorFlow is
installed here, and must stay unimported). Each run forks from a process that imported Keras on
its backend (tests/forked_sessions.py).
PyTorch's CPU case runs where PyTorch is installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import urllib.parse
from pathlib import Path

import forked_sessions
import pytest
from conftest import WARM_UP
from report_helpers import Run
from trace_helpers import get, tensorboard, wait_for

# Looked up, not imported: a framework loaded in this process would change the other tests' defaults
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="JAX is not installed (the test extra installs it)"
)

MIB = 2**20

SUITE = """
    import sys
    import time

    import jax.numpy as jnp
    import keras
    import numpy as np
    import pytest

    KEPT = []


    def fit(width):
        model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(4)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(np.ones((16, width), "float32"), np.ones((16, 4), "float32"), epochs=1, verbose=0)
        return model


    def test_sum():
        assert float(jnp.arange(1000.0).sum()) == 499500.0


    def test_keeps_models_of_new_shapes():
        KEPT.extend(fit(width) for width in range(10, 18))


    def test_same_model_in_a_loop_does_not_leak(tfmem):
        tfmem.assert_no_leak(lambda: fit(8), iterations=6, warmup=5, max_growth="1MB")


    def test_new_shapes_in_a_loop_leak_jax_executables(tfmem):
        widths = iter(range(20, 200))
        report = tfmem.leak_check(lambda: fit(next(widths)), iterations=6, warmup=2, max_growth="100KB")
        assert report.leaked
        assert "JAX compiled executables" in [growth.label for growth in report.diagnosis.holders]


    @pytest.mark.tfmem(budget="20MB")
    def test_over_budget():
        block = jnp.ones((48 * 2**20 // 4,), "float32").block_until_ready()
        time.sleep(0.3)  # long enough for the trace's sampled timeline to see it
        del block


    def test_tensorflow_was_never_imported():
        assert "tensorflow" not in sys.modules
"""

# ``{arrays}``: the backend's array module (``jax.numpy``, ``torch``), which the tests name
ORDER = """
    import unittest

    import {arrays} as arrays
    import keras
    import numpy as np


    def test_sum():
        assert float(arrays.arange(1000.0).sum()) == 499500.0


    def test_fit():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        model.compile(optimizer="adam", loss="mse")
        model.fit(np.ones((16, 8), "float32"), np.ones((16, 4), "float32"), epochs=1, verbose=0)


    class TestCase(unittest.TestCase):
        def test_mean(self):
            self.assertEqual(float(arrays.ones(1000).mean()), 1.0)
"""
ORDERS = {
    "sum first": ["test_order.py::test_sum", "test_order.py::test_fit", "test_order.py::TestCase::test_mean"],
    "fit first": ["test_order.py::test_fit", "test_order.py::TestCase::test_mean", "test_order.py::test_sum"],
}


def _run(folder: Path, *args: str, quiet: bool = False, backend: str = "jax") -> Run:
    """A session of its own, forked from a process that imported Keras on ``backend``."""
    environment = {**os.environ, "KERAS_BACKEND": backend}
    if quiet:  # glibc gives each thread that allocates an arena of its own, and which of XLA's
        # threads allocate depends on scheduling and differs in a fork: 0-14 MiB of a 45 MiB fit
        # on a busy machine that has nothing to do with which test started JAX's runtime. One
        # arena and XLA's CPU work on one thread keep the runs comparable.
        environment.update(MALLOC_ARENA_MAX="1", XLA_FLAGS="--xla_cpu_multi_thread_eigen=false")
    done = forked_sessions.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", *WARM_UP, *args,
         "--tfmem-report=report.json"],
        cwd=folder, env=environment, timeout=600, merged=True,
    )  # fmt: skip
    return Run(folder, done.returncode, done.stdout, json.loads((folder / "report.json").read_text()))


def _assert_the_same_in_process(test: str, figures: dict[str, float], floor: float) -> None:
    """In process, the framework's first use (Keras's first fit: about 10 MiB) is paid before the
    first test, whichever test comes first; an isolated test's process pays it in its test
    (docs/measurement.md), so its figure may be that much higher."""
    in_process = [figure for order, figure in figures.items() if order != "isolated"]
    assert max(in_process) - min(in_process) <= max(floor, 0.1 * max(in_process)), (test, figures)
    assert figures["isolated"] <= max(in_process) + 16 * MIB, (test, figures)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every run of this module: the order suite in two orders, isolated and under pytest-xdist,
    then the suite with and without clean-up, one at a time (each reads its own process: runs
    beside it would add their noise)."""
    plans = {
        "suite": ("test_suite.py", "--tfmem-budget=1GB", "--tfmem-stayed-threshold=1MB"),
        "cleared": ("test_suite.py", "--tfmem-budget=1GB", "--tfmem-clear-session", "-k", "not leak"),
        **{order: (*nodeids, "--tfmem-budget=1GB") for order, nodeids in ORDERS.items()},
        "isolated": (*ORDERS["sum first"], "--tfmem-budget=1GB", "--tfmem-isolate"),
        "xdist": (*ORDERS["fit first"], "--tfmem-budget=1GB", "-n", "2"),
    }
    done = {}
    for name, args in plans.items():
        folder = tmp_path_factory.mktemp(name.replace(" ", "_"))
        (folder / "test_suite.py").write_text(textwrap.dedent(SUITE))
        (folder / "test_order.py").write_text(textwrap.dedent(ORDER).format(arrays="jax.numpy"))
        done[name] = _run(folder, *args, quiet=name not in ("suite", "cleared"))
    return done


def test_the_session_header_names_the_keras_backend(runs: dict[str, Run]):
    assert "tfmem: Keras backend jax (the loaded Keras)" in runs["suite"].output  # said once Keras is loaded


def test_keras_on_jax_never_imports_tensorflow_and_leak_checks_name_jax_executables(runs: dict[str, Run]):
    suite = runs["suite"]
    outcomes = {test["nodeid"].split("::")[-1]: test["outcome"] for test in suite.report["tests"]}
    assert outcomes == {
        "test_sum": "passed",
        "test_keeps_models_of_new_shapes": "passed",
        "test_same_model_in_a_loop_does_not_leak": "passed",  # the same code: executables reused
        "test_new_shapes_in_a_loop_leak_jax_executables": "passed",  # asserts the leak and its name
        "test_over_budget": "failed",
        "test_tensorflow_was_never_imported": "passed",
    }, suite.output


def test_jax_runtime_start_is_booked_apart_whichever_test_uses_jax_first(runs: dict[str, Run]):
    for name in ("test_sum", "test_fit", "test_mean"):
        figures = {order: runs[order].peak(name) for order in (*ORDERS, "isolated", "xdist")}
        print(name, {order: round(figure / MIB, 1) for order, figure in figures.items()})
        _assert_the_same_in_process(name, figures, floor=10 * MIB)  # JAX's compiles vary by 10-20%
    assert "JAX's runtime start" in runs["sum first"].output


def test_what_a_jax_test_kept_names_its_executables_and_says_how_much_is_named(runs: dict[str, Run]):
    kept = runs["suite"].entry("test_keeps_models_of_new_shapes")["retained"]
    stayed = kept["stayed"]
    named = next(line for line in stayed if line.startswith("named "))
    assert stayed[-1] == named and "; the rest is native memory (JAX compiled executables +" in named, stayed
    retained_mib = kept["bytes"] / MIB
    assert retained_mib > 10 and f" of {retained_mib:.1f} MiB" in named, (retained_mib, named)
    assert "most of it is native memory" in runs["suite"].output
    assert "--tfmem-session-limit=SIZE" in runs["suite"].output


def test_clear_session_clears_jax_caches_and_says_what_it_gave_back(runs: dict[str, Run]):
    plain, cleared = runs["suite"].report["session"], runs["cleared"].report["session"]
    assert cleared["cleared_bytes"] > 0, runs["cleared"].output
    # the same tests without the leak checks: the process grew less with JAX's caches cleared
    kept = {t["nodeid"]: t["retained_bytes"] for t in runs["suite"].report["tests"]}
    kept_cleared = {t["nodeid"]: t["retained_bytes"] for t in runs["cleared"].report["tests"]}
    test = "test_suite.py::test_keeps_models_of_new_shapes"
    assert kept_cleared[test] < kept[test] - 5 * MIB, (kept_cleared[test], kept[test])
    assert plain["cleared_bytes"] is None
    after_each = "  after each test: keras.backend.clear_session(), jax.clear_caches() (each function JAX compiled is"
    assert after_each in runs["cleared"].output


def test_a_jax_test_over_budget_is_traced_with_jax_profiler(runs: dict[str, Run]):
    suite = runs["suite"]
    (summary_path,) = (suite.folder / ".tfmem" / "traces").glob("*/test_suite.py__test_over_budget/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["profiler"]["status"] == "captured", summary["profiler"]
    assert summary["profiler"]["message"] == "JAX profiler trace (Profile tab in TensorBoard)"
    assert list(summary_path.parent.glob("plugins/profile/*/*.xplane.pb"))


TORCH_SUITE = """
    import pytest
    import torch

    KEPT = []


    def test_matmul():
        assert float((torch.ones(64, 64) @ torch.ones(64, 64)).sum()) == 64.0**3


    def test_keeps_a_tensor():
        KEPT.append(torch.ones(40 * 2**20 // 4))


    @pytest.mark.tfmem(budget="20MB")
    def test_over_budget():
        block = torch.ones(48 * 2**20 // 4)
        del block
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed (its CPU tests run where it is)")
def test_pytorch_on_cpu_runtime_start_tensors_kept_and_its_profiler(tmp_path: Path):
    (tmp_path / "test_torch.py").write_text(textwrap.dedent(TORCH_SUITE))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "test_torch.py",
         "--tfmem-budget=1GB", "--tfmem-report=report.json"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 1, output  # the test over budget
    assert "PyTorch's runtime start" in output
    report = json.loads((tmp_path / "report.json").read_text())
    kept = next(t for t in report["tests"] if t["nodeid"].endswith("test_keeps_a_tensor"))["retained"]
    assert kept["stayed"][0] == "list 'KEPT' (global of test_torch) +1 item: Tensor 40.0 MiB", kept["stayed"]
    assert kept["stayed"][-1].startswith("named 40.0 of "), kept["stayed"]
    (summary_path,) = (tmp_path / ".tfmem" / "traces").glob("*/test_torch.py__test_over_budget/summary.json")
    profiler = json.loads(summary_path.read_text())["profiler"]
    assert profiler["status"] == "captured" and profiler["message"].startswith("PyTorch profiler trace"), profiler
    (trace,) = summary_path.parent.glob("*.pt.trace.json")
    memory = [event for event in json.loads(trace.read_text())["traceEvents"] if event.get("name") == "[memory]"]
    assert max(event["args"]["Bytes"] for event in memory) == 48 * MIB  # the test's block, allocated


JAX_SCRIPT = """
import os

os.environ["KERAS_BACKEND"] = "jax"

import jax.numpy as jnp
import keras
import numpy as np

jnp.ones(1).block_until_ready()  # JAX's runtime starts here
data = np.ones((400, 2**20 // 4), dtype=np.float32)  # 400 MiB of data held in NumPy
model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(16), keras.layers.Dense(1)])
model.compile("adam", "mse")
model.fit(data[:256, :1024], data[:256, :1], epochs=1, batch_size=64, verbose=0)
print("trained")
"""


def test_tfmem_run_of_a_keras_on_jax_script_names_jax_and_advises_streaming(tmp_path: Path):
    (tmp_path / "train.py").write_text(JAX_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest_tfmem.cli.main", "run", "--report", "run.json", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout == "trained\n", done.stderr
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["runtimes"] == ["JAX"] and report["device_peaks"] == {}  # JAX keeps no CPU figures
    assert report["host_share"] >= 400 * MIB
    assert "  JAX started; host share (NumPy, Python, libraries, their arrays) " in done.stderr
    (advice,) = report["advice"]
    assert "taken after JAX started; stream it in batches with a keras.utils.PyDataset or tf.data" in advice


@pytest.mark.slow
def test_tensorboard_shows_the_jax_trace_in_its_profile_plugin(runs: dict[str, Run], tmp_path: Path):
    """A real TensorBoard on loopback opens the JAX test's trace: the profile plugin lists its
    run with the trace viewer and JAX's own tools (its compiled HLO modules), and the memory
    timeline is in the scalars."""
    root = runs["suite"].folder / ".tfmem" / "traces"
    (session,) = [path.name for path in root.iterdir() if path.is_dir()]
    log = tmp_path / "tensorboard.log"
    with tensorboard(root, log) as url:
        wait_for(lambda: get(f"{url}/data/plugins_listing"),
                 lambda p: p["profile"]["enabled"] and p["scalars"]["enabled"], "both plugins active", log)  # fmt: skip
        (run,) = get(f"{url}/data/plugin/profile/runs")
        assert run.startswith(f"{session}/test_suite.py__test_over_budget/")
        tools = set(get(f"{url}/data/plugin/profile/run_tools?run={urllib.parse.quote(run, safe='')}"))
        assert {"trace_viewer@", "memory_profile", "hlo_stats"} <= tools, tools
        tb_run = f"{session}/test_suite.py__test_over_budget"
        tags = wait_for(lambda: get(f"{url}/data/plugin/scalars/tags"), lambda t: tb_run in t, "the scalars", log)
        assert {"memory/host_rss_mib", "memory/budget_mib"} <= set(tags[tb_run])
        points = get(f"{url}/data/plugin/scalars/scalars?run={urllib.parse.quote(tb_run, safe='')}"
                     f"&tag={urllib.parse.quote('memory/host_rss_mib', safe='')}")
        assert max(value for _, _, value in points) - min(value for _, _, value in points) >= 40  # the 48 MiB block


DEVICE_OOM = """
    import jax.numpy as jnp


    def test_asks_jax_for_four_tebibytes():
        jnp.ones((2**42,), dtype=jnp.uint8).block_until_ready()
"""


def test_a_jax_device_out_of_memory_error_fails_as_device_out_of_memory(tmp_path: Path):
    """A real one: JAX's CPU client refuses 4 TiB with ``RESOURCE_EXHAUSTED``."""
    (tmp_path / "test_oom.py").write_text(textwrap.dedent(DEVICE_OOM))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_oom.py", "--tfmem-budget=1GB",
         "--tfmem-trace=off"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert "tfmem: out of memory on an unknown device: JAX's allocator could not allocate 4096.0 GiB" in lines, done.stdout
    assert "JAX: RESOURCE_EXHAUSTED: Out of memory allocating 4398046511104 bytes." in lines
    assert "FAILED test_oom.py::test_asks_jax_for_four_tebibytes - tfmem: " in done.stdout


@pytest.mark.longest  # four sessions one after the other
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed (its CPU tests run where it is)")
def test_keras_on_pytorch_runtime_start_is_booked_apart_whichever_test_uses_it_first_in_process_isolated_and_under_xdist(
    tmp_path: Path,
):
    (tmp_path / "test_order.py").write_text(textwrap.dedent(ORDER).format(arrays="torch"))
    plans = {
        "sum first": (*ORDERS["sum first"], "--tfmem-budget=1GB"),
        "fit first": (*ORDERS["fit first"], "--tfmem-budget=1GB"),
        "xdist": (*ORDERS["sum first"], "--tfmem-budget=1GB", "-n", "2"),
        # Isolated in forks, which map the session's library pages again before the test, as a
        # fresh interpreter has them (docs/isolation.md, "The figures of a forked test").
        "isolated": (*ORDERS["fit first"], "--tfmem-budget=1GB", "--tfmem-isolate"),
    }
    peaks: dict[str, dict[str, float]] = {}
    for name, args in plans.items():
        run = _run(tmp_path, *args, quiet=True, backend="torch")
        assert run.returncode == 0, run.output[-3000:]
        if name in ("sum first", "fit first"):  # booked to the session's account, in process
            booked = [b["name"] for t in run.report["tests"] if t["retained"] for b in t["retained"]["bookings"]]
            assert "PyTorch's runtime start" in booked, booked
        for test in ("test_sum", "test_fit", "test_mean"):
            peaks.setdefault(test, {})[name] = run.peak(test)
    for test, figures in peaks.items():
        print(test, {order: round(figure / MIB, 1) for order, figure in figures.items()})
        _assert_the_same_in_process(test, figures, floor=2 * MIB)
