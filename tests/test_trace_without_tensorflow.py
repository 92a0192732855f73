"""Traces of failing tests, options and rotation, on tests that do not load TensorFlow.

Without TensorFlow a trace holds the memory timeline
(TensorBoard scalars, ``timeline.png``, ``summary.json``) and says that no profiler ran.
The TensorFlow profiler part is covered by ``test_trace_tensorflow.py``.
"""

from __future__ import annotations

import os
import shlex

import matplotlib.figure  # noqa: F401  # loaded here once: in-process pytester runs unload what they import
import pytest
import tensorboard.plugins.scalar.metadata
import tensorboard.summary.writer.record_writer  # noqa: F401  # (same reason, both)
from trace_helpers import TracedRun, read_scalars, run_pytest

from pytest_tfmem.trace import dirs as tracedirs

NUMPY_TESTS = """
import time

import numpy as np
import pytest

def hold(megabytes):
    block = np.ones(megabytes * 2**20 // 8)
    time.sleep(0.1)  # long enough for the timeline sampler to see the block
    return float(block.sum())

@pytest.mark.tfmem(budget="200MB")
def test_passes():
    hold(10)

@pytest.mark.parametrize("megabytes", [40, 60])
@pytest.mark.tfmem(budget="20MB")
def test_over_budget(megabytes):
    print("allocating", megabytes)
    hold(megabytes)

@pytest.mark.tfmem(budget="20MB", trace="off")
def test_over_budget_not_traced():
    hold(40)

@pytest.mark.tfmem(budget="200MB", trace="always")
def test_passes_traced():
    hold(10)

@pytest.mark.xfail(strict=True)
@pytest.mark.tfmem(budget="20MB")
def test_expected_to_fail():
    hold(40)
"""


def only_session(root):
    sessions = tracedirs.session_dirs(root)
    assert len(sessions) == 1, sessions
    return sessions[0]


@pytest.fixture(scope="module")
def numpy_run(tmp_path_factory: pytest.TempPathFactory) -> TracedRun:
    """One session shared by the checks below: passing, failing, untraced, always-traced, xfail."""
    run = run_pytest(tmp_path_factory.mktemp("numpy"), {"test_numpy.py": NUMPY_TESTS}, "--tfmem-trace=on-failure")
    assert "3 failed, 2 passed, 1 xfailed" in run.output, run.output
    return run


def test_only_failing_tests_and_always_traced_tests_leave_a_directory(numpy_run: TracedRun) -> None:
    assert numpy_run.traced() == [
        "test_numpy.py__test_over_budget@40",
        "test_numpy.py__test_over_budget@60",
        "test_numpy.py__test_passes_traced",
    ]


def test_the_failure_report_ends_with_the_directory_and_the_tensorboard_command(numpy_run: TracedRun) -> None:
    shown = (numpy_run.session / "test_numpy.py__test_over_budget@40").relative_to(numpy_run.directory)
    lines = numpy_run.section("test_over_budget[40]")
    assert lines[0].startswith("traced: the test was re-run once")
    assert lines[2] == "profile: no framework is loaded (TensorFlow, JAX, PyTorch): no profiler trace"
    assert lines[-2] == f"trace directory: {shown}"
    assert lines[-1] == f"open it: tensorboard --logdir {shown}"
    assert f"open them: tensorboard --logdir {numpy_run.session.relative_to(numpy_run.directory)}" in numpy_run.output


def test_the_summary_keeps_the_verdict_and_the_traced_run_apart(numpy_run: TracedRun) -> None:
    directory = numpy_run.session / "test_numpy.py__test_over_budget@60"
    summary = numpy_run.summary(directory.name)
    assert summary["traced"] == "re-run once after the failure"
    assert summary["verdict"]["budget_bytes"] == 20_000_000
    assert summary["verdict"]["failed"][0].startswith("peak ")
    assert summary["verdict"]["peak_bytes"] > 55 * 2**20  # the untraced run held 60 MiB
    assert summary["traced_run"]["peak"] > 55 * 2**20  # so did the re-run
    assert summary["profiler"] == {"status": "not-loaded", "message": "no framework is loaded (TensorFlow, JAX, PyTorch): no profiler trace", "files": []}
    assert summary["tensorboard"] == f"tensorboard --logdir {shlex.quote(str(directory))}"
    assert (directory / "output.txt").read_text() == "--- stdout ---\nallocating 60\n"


def test_the_timeline_is_a_tensorboard_scalar_series_and_a_png(numpy_run: TracedRun) -> None:
    directory = numpy_run.session / "test_numpy.py__test_over_budget@60"
    scalars = read_scalars(directory)
    assert sorted(scalars) == ["memory/budget_mib", "memory/host_rss_mib"]
    host = scalars["memory/host_rss_mib"]
    assert host[0] == (0, 0.0)  # step 0 ms, at the test's starting level
    assert max(value for _, value in host) > 55  # MiB: the 60 MiB block shows up
    assert [value for _, value in scalars["memory/budget_mib"]] == pytest.approx([20e6 / 2**20] * 2)
    assert (directory / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_always_traced_test_says_its_figures_were_measured_while_tracing(numpy_run: TracedRun) -> None:
    summary = numpy_run.summary("test_numpy.py__test_passes_traced")
    assert summary["traced"] == "the test's own run"
    assert summary["verdict"]["measured_while_tracing"] is True
    assert summary["verdict"]["failed"] == []


def test_without_tensorflow_the_default_writes_nothing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_numpy=NUMPY_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "not passes_traced")  # (its marker asks for a trace)
    result.assert_outcomes(passed=1, failed=3, xfailed=1)
    assert not (pytester.path / ".tfmem" / "traces").exists()


def test_ini_values_choose_mode_directory_and_rotation(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntfmem_trace = on-failure\ntfmem_trace_dir = ci/traces\ntfmem_trace_keep = 1\n")
    pytester.makepyfile(test_numpy=NUMPY_TESTS)
    for _ in range(2):
        pytester.runpytest("-p", "no:cacheprovider", "-k", "test_over_budget and 40").assert_outcomes(failed=1)
    sessions = tracedirs.session_dirs(pytester.path / "ci" / "traces")
    assert len(sessions) == 1
    assert all(p.name == "test_numpy.py__test_over_budget@40" for s in sessions for p in tracedirs.traced_tests(s))


def test_the_command_line_overrides_the_ini_and_the_marker_overrides_both(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntfmem_trace = always\n")
    pytester.makepyfile(test_numpy=NUMPY_TESTS)
    pytester.runpytest("-p", "no:cacheprovider", "--tfmem-trace=off").assert_outcomes(passed=2, failed=3, xfailed=1)
    session = only_session(pytester.path / ".tfmem" / "traces")
    assert [p.name for p in tracedirs.traced_tests(session)] == ["test_numpy.py__test_passes_traced"]


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_hostile_parametrize_ids_cannot_leave_the_trace_directory(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_ids="""
        import pytest

        @pytest.mark.parametrize("x", [1, 2], ids=["../../../escaped", "a" * 400])
        @pytest.mark.tfmem(budget="1KB")
        def test_hostile(x):
            block = b"x" * 2_000_000  # over budget: only a memory failure is traced
            assert len(block) > x
        """
    )
    pytester.runpytest("-p", "no:cacheprovider", "--tfmem-trace=on-failure").assert_outcomes(failed=2)
    session = only_session(pytester.path / ".tfmem" / "traces")
    names = sorted(p.name for p in tracedirs.traced_tests(session))
    assert names[0] == "test_ids.py__test_hostile@.escaped"
    assert names[1].startswith("test_ids.py__test_hostile@aaaa") and len(names[1]) == tracedirs.MAX_NAME_LENGTH
    outside = [p for p in pytester.path.parent.rglob("*escaped*") if session not in p.parents]
    assert outside == []


@pytest.mark.parametrize(
    ("args", "marker", "message"),
    [
        (["--tfmem-trace=sometimes"], "", "invalid --tfmem-trace value 'sometimes': expected one of on-failure, always, off"),
        (["--tfmem-trace-keep=0"], "", "invalid --tfmem-trace-keep value '0': expected a whole number >= 1"),
        ([], "trace='maybe'", "invalid tfmem marker argument trace 'maybe': expected one of on-failure, always, off, True or False"),
        ([], "trace=3", "invalid tfmem marker argument trace 3: expected one of on-failure, always, off, True or False"),
    ],
)
def test_bad_trace_settings_are_usage_errors(pytester: pytest.Pytester, args, marker, message) -> None:
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.tfmem({marker})\ndef test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_an_isolated_test_is_traced_into_the_sessions_directory(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_isolated="""
        import numpy as np
        import pytest

        @pytest.mark.tfmem(budget="20MB", isolate=True)
        def test_over_budget_in_its_own_process():
            assert np.ones(40 * 2**20 // 8).sum() > 0
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfmem-trace=on-failure")
    result.assert_outcomes(failed=1)
    session = only_session(pytester.path / ".tfmem" / "traces")
    assert session.name.endswith(f"_{os.getpid()}")  # the session's own directory, not the child's
    assert [p.name for p in tracedirs.traced_tests(session)] == ["test_isolated.py__test_over_budget_in_its_own_process"]
    result.stdout.fnmatch_lines([f"open it: tensorboard --logdir .tfmem/traces/{session.name}/test_isolated.py__*"])


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_a_trace_that_cannot_be_written_warns_and_leaves_the_failure_as_it_was(pytester: pytest.Pytester) -> None:
    pytester.makefile(".txt", blocker="a file where the trace directory should go")
    pytester.makepyfile(
        test_x="""
        import pytest

        @pytest.mark.tfmem(budget="1KB")
        def test_fails():
            block = b"x" * 2_000_000  # over budget as well: a memory failure, so it is traced
            assert len(block) == 2
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfmem-trace=on-failure", "--tfmem-trace-dir=blocker.txt/t")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E       AssertionError: assert 2000000 == 2", "*PytestWarning: pytest-tfmem: no trace for this test:*"])
    assert " tfmem trace " not in result.stdout.str()


def test_each_view_has_a_scalar_tag_of_its_own():
    from pytest_tfmem.trace.timeline import scalar_tag

    tags = [scalar_tag(view) for view in ("host", "children", "tf:CPU:0", "jax:gpu:0", "torch:cuda:1")]
    assert tags == ["memory/host_rss_mib", "memory/children_mib", "memory/tf_CPU:0_mib", "memory/jax_gpu:0_mib",
                    "memory/torch_cuda:1_mib"]


HIDE_TRACE_EXTRA = '''
import importlib.abc
import sys


class Missing(importlib.abc.MetaPathFinder):
    """As in an environment without the trace extra: tensorboard and matplotlib cannot be imported."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorboard", "matplotlib"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Missing())
'''


def test_without_the_trace_extra_it_is_said_once_with_what_to_install(tmp_path, monkeypatch) -> None:
    """Two traced failures: no note under each, one line at the end naming installable packages,
    and no TensorBoard command that cannot run."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text(HIDE_TRACE_EXTRA)  # this session and the drawing child
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hidden), os.environ.get("PYTHONPATH")])))
    (tmp_path / "project").mkdir()
    run = run_pytest(tmp_path / "project", {"test_numpy.py": NUMPY_TESTS}, "-k", "test_over_budget and not not_traced",
                     "--tfmem-trace=on-failure")  # a fresh interpreter: its sitecustomize hides the extra
    assert "2 failed" in run.output, run.output
    assert "No module named" not in run.output and "open it:" not in run.output and "open them:" not in run.output
    said = [line for line in run.output.splitlines() if "not installed" in line]
    assert said == [
        "tensorboard and matplotlib are not installed: the traces have no memory scalars or timeline.png, and no "
        "viewer; pip install tensorboard tensorboard-plugin-profile xprof matplotlib (or the trace extra: pip install "
        '"/path/to/pytest-tfmem[trace]" from a clone, or a wheel built from one)'
    ]
