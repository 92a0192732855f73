"""Traces of failing TensorFlow tests: read by xprof's converter and served by a real TensorBoard.

One pytest session in a fresh interpreter (``keras_run``) is shared by most checks: a passing
Keras test, two failing parametrised variants, and a failing test marked ``trace="off"``.
No tracing option is given: once TensorFlow is loaded, ``on-failure`` is the default.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from trace_helpers import TracedRun, get, read_scalars, run_pytest, tensorboard, wait_for

KERAS_TESTS = """
import numpy as np
import pytest
import tensorflow as tf
import keras

x = np.random.rand(256, 32).astype("float32")
y = np.random.rand(256, 1).astype("float32")


def fit_small_model():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    model.fit(x, y, epochs=1, batch_size=32, verbose=0)


@pytest.mark.tfmem(budget="1GB")
def test_fits_within_budget():
    fit_small_model()


@pytest.mark.parametrize("rows", [1024, 2048])
@pytest.mark.tfmem(budget="8MB")
def test_fit_with_large_input(rows):
    inputs = tf.random.normal((rows, 4096))  # 16 or 32 MiB in TensorFlow's CPU allocator
    fit_small_model()
    assert float(tf.reduce_sum(inputs)) != 0.0


@pytest.mark.tfmem(budget="8MB", trace="off")
def test_over_budget_not_traced():
    assert float(tf.reduce_sum(tf.random.normal((1024, 4096)))) != 0.0
"""
FAILED_VARIANTS = ["test_fit.py__test_fit_with_large_input@1024", "test_fit.py__test_fit_with_large_input@2048"]
MIB = 2**20


@pytest.fixture(scope="module")
def keras_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    run = run_pytest(tmp_path_factory.mktemp("keras"), {"test_fit.py": KERAS_TESTS}, framework=True)
    assert "3 failed, 1 passed" in run.output, run.output
    return run


def xplane_file(directory: Path) -> Path:
    (path,) = directory.glob("plugins/profile/*/*.xplane.pb")
    return path


def test_a_failing_test_leaves_a_profile_that_xprof_reads(keras_run: TracedRun) -> None:
    from xprof.convert import raw_to_tool_data

    path = str(xplane_file(keras_run.session / "test_fit.py__test_fit_with_large_input@2048"))
    tools = raw_to_tool_data.xspace_to_tool_names([path])
    assert "trace_viewer@" in tools  # the (streaming) trace viewer
    assert "memory_profile" in tools

    data, content_type = raw_to_tool_data.xspace_to_tool_data([path], "memory_profile", {})
    assert content_type == "application/json"
    allocators = json.loads(data)["memoryProfilePerAllocator"]
    peak_in_use = max(int(a["profileSummary"]["peakStats"]["peakBytesInUse"]) for a in allocators.values())
    assert peak_in_use >= 32 * MIB  # the test's 2048 x 4096 float32 input

    data, _ = raw_to_tool_data.xspace_to_tool_data([path], "trace_viewer", {})
    names = {event.get("name", "") for event in json.loads(data)["traceEvents"]}
    assert any("RandomStandardNormal" in name for name in names)  # the test's own op


def test_passing_and_untraced_tests_leave_nothing_and_variants_get_their_own_directory(keras_run: TracedRun) -> None:
    assert keras_run.traced() == FAILED_VARIANTS
    for name in FAILED_VARIANTS:
        contents = sorted(p.name for p in (keras_run.session / name).iterdir() if p.is_file())
        assert contents[0].startswith("events.out.tfevents.")
        # output.txt holds what the re-run printed: here TensorFlow's profiler log lines, none
        # where TF_CPP_MIN_LOG_LEVEL silences them (test_trace_without_tensorflow.py checks it)
        assert [name for name in contents[1:] if name != "output.txt"] == ["summary.json", "timeline.png"]


def test_the_failure_report_ends_with_the_directory_and_the_tensorboard_command(keras_run: TracedRun) -> None:
    lines = keras_run.section("test_fit_with_large_input[1024]")
    shown = (keras_run.session / FAILED_VARIANTS[0]).relative_to(keras_run.directory)
    assert lines[0] == (
        "traced: the test was re-run once under the profiler and the memory timeline; "
        "the verdict above is the untraced run's"
    )
    assert lines[1].startswith("traced re-run: peak ")
    assert lines[2].startswith("profile: TensorFlow profiler trace (Profile tab in TensorBoard): plugins/profile/")
    assert lines[3] == (
        "memory timeline: TensorBoard scalars memory/host_rss_mib, memory/tf_CPU:0_mib, memory/budget_mib; "
        f"{shown}/timeline.png"
    )
    assert lines[4:] == [f"trace directory: {shown}", f"open it: tensorboard --logdir {shown}"]


def test_the_verdict_is_the_untraced_run_and_the_traced_peak_is_stated_apart(keras_run: TracedRun) -> None:
    summary = keras_run.summary(FAILED_VARIANTS[1])
    assert summary["traced"] == "re-run once after the failure"
    assert summary["verdict"]["measured_while_tracing"] is False
    assert summary["verdict"]["peak_bytes"] >= 32 * MIB
    traced_tf = next(v for v in summary["traced_run"]["views"] if v["view"] == "tf:CPU:0")
    assert traced_tf["peak"] - traced_tf["start"] >= 32 * MIB
    assert summary["profiler"]["status"] == "captured"
    assert f"peak {summary['verdict']['peak_bytes'] / MIB:.1f} MiB > budget" in keras_run.output


def test_the_timeline_has_host_and_tensorflow_allocator_scalars(keras_run: TracedRun) -> None:
    scalars = read_scalars(keras_run.session / FAILED_VARIANTS[1])
    assert sorted(scalars) == ["memory/budget_mib", "memory/host_rss_mib", "memory/tf_CPU:0_mib"]
    steps = [step for step, _ in scalars["memory/tf_CPU:0_mib"]]
    assert steps == sorted(steps) and steps[0] == 0 and len(steps) > 10  # milliseconds, sampled every 10
    assert max(value for _, value in scalars["memory/tf_CPU:0_mib"]) >= 32  # MiB


@pytest.mark.slow
def test_tensorboard_shows_the_failed_test_in_the_profile_and_scalars_plugins(keras_run: TracedRun, tmp_path: Path) -> None:
    log = tmp_path / "tensorboard.log"
    session = keras_run.session.name
    with tensorboard(keras_run.root, log) as url:
        plugins = wait_for(lambda: get(f"{url}/data/plugins_listing"),
                           lambda p: p["profile"]["enabled"] and p["scalars"]["enabled"], "both plugins active", log)
        assert plugins["profile"]["enabled"] and plugins["scalars"]["enabled"]

        runs = get(f"{url}/data/plugin/profile/runs")
        run = next(r for r in runs if r.startswith(f"{session}/{FAILED_VARIANTS[1]}/"))
        assert len(runs) == 2  # the two failed variants, nothing else
        quoted = urllib.parse.quote(run, safe="")
        assert {"memory_profile", "trace_viewer@"} <= set(get(f"{url}/data/plugin/profile/run_tools?run={quoted}"))
        host = xplane_file(keras_run.session / FAILED_VARIANTS[1]).name.removesuffix(".xplane.pb")
        memory = get(f"{url}/data/plugin/profile/data?run={quoted}&tag=memory_profile&host={host}")
        assert memory["memoryProfilePerAllocator"]

        tb_run = f"{session}/{FAILED_VARIANTS[1]}"
        tags = wait_for(lambda: get(f"{url}/data/plugin/scalars/tags"), lambda t: tb_run in t, "the scalars", log)
        assert set(tags[tb_run]) == {"memory/budget_mib", "memory/host_rss_mib", "memory/tf_CPU:0_mib"}
        points = get(f"{url}/data/plugin/scalars/scalars?run={urllib.parse.quote(tb_run, safe='')}"
                     f"&tag={urllib.parse.quote('memory/tf_CPU:0_mib', safe='')}")
        assert max(value for _, _, value in points) >= 32  # MiB


BUSY_PROFILER_TEST = """
import pytest
import tensorflow as tf


@pytest.fixture
def profiled(tmp_path):
    tf.profiler.experimental.start(str(tmp_path / "user-profile"))  # the user's own profiling session
    yield
    tf.profiler.experimental.stop()


@pytest.mark.tfmem(budget="1MB")
def test_over_budget_while_profiled(profiled):
    assert float(tf.reduce_sum(tf.ones((1024, 1024)))) > 0
"""


@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_a_busy_profiler_is_reported_and_the_timeline_kept(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_busy=BUSY_PROFILER_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)  # the user's profiler stopped cleanly in teardown
    result.stdout.fnmatch_lines(
        ["profile: TensorFlow's profiler was busy (AlreadyExistsError: *); no profiler trace, the memory timeline was kept"]
    )
    (session,) = [p for p in (pytester.path / ".tfmem" / "traces").iterdir() if p.is_dir()]
    directory = session / "test_busy.py__test_over_budget_while_profiled"
    assert not (directory / "plugins").exists()
    assert json.loads((directory / "summary.json").read_text())["profiler"]["status"] == "busy"
    assert "memory/tf_CPU:0_mib" in read_scalars(directory)
    assert (directory / "timeline.png").is_file()


@pytest.mark.slow
def test_xdist_workers_write_into_one_session_directory(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_fit=KERAS_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "-k", "large_input")
    result.assert_outcomes(failed=2)
    (session,) = [p for p in (pytester.path / ".tfmem" / "traces").iterdir() if p.is_dir()]
    assert sorted(p.name for p in session.iterdir() if p.is_dir()) == FAILED_VARIANTS
    result.stdout.fnmatch_lines(["*tfmem: 2 TensorBoard trace(s), 2 of failing tests*",
                                 f"open them: tensorboard --logdir .tfmem/traces/{session.name}"])
