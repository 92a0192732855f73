"""What TensorFlow's C++ code logs while tfmem starts its runtime and warms it up is held, and said
once at the end where it matters (``frameworks.native_log``); a test's own lines stay the test's."""

from __future__ import annotations

import pytest

from pytest_tfmem.frameworks.native_log import HeldLog, routine

CUINIT = ("E0000 00:00:1796515822.613587   10387 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
          "Failed call to cuInit: UNKNOWN ERROR (303)")

TENSORFLOW_TEST = """
import os

import tensorflow as tf


def test_small():
    assert float(tf.reduce_sum(tf.ones((4, 4)))) == 16.0


def test_logs_its_own_line():
    os.write(2, b"E0000 the test's own line\\n")
    assert False, "shows the test's captured stderr"
"""


@pytest.mark.slow  # TensorFlow's runtime starts in each session
def test_tensorflows_start_up_lines_are_held_and_said_with_v(pytester: pytest.Pytester, monkeypatch):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)  # TensorFlow logs as a user's session does
    pytester.makepyfile(test_tf=TENSORFLOW_TEST)
    quiet = pytester.runpytest_subprocess("-p", "no:randomly", "--tfmem-budget=1GB")
    quiet.assert_outcomes(passed=1, failed=1)
    printed = quiet.stdout.str() + quiet.stderr.str()
    assert "cuInit" not in printed and "tfmem: what the frameworks logged" not in printed
    quiet.stdout.fnmatch_lines(["*Captured stderr call*", "E0000 the test's own line"])  # the test's own stays
    verbose = pytester.runpytest_subprocess("-p", "no:randomly", "--tfmem-budget=1GB", "-v", "-k", "small")
    verbose.assert_outcomes(passed=1)
    verbose.stdout.fnmatch_lines([
        "tfmem: what the frameworks logged while tfmem started them (their runtime and first use)",
        "  E0000 * failed call to cuInit: *",
    ])


def test_a_line_that_matters_is_said_without_v_and_routine_lines_are_not() -> None:
    log = HeldLog()
    log.lines = [CUINIT, "I0000 oneDNN custom operations are on. You may see ...",
                 "E0000 gpu_device.cc] could not load libcudnn.so.9: cannot open shared object file"]
    assert log.summary_lines(verbose=False, nvidia_device=False) == [
        "tfmem: what the frameworks logged while tfmem started them (their runtime and first use); -v shows every line",
        "  E0000 gpu_device.cc] could not load libcudnn.so.9: cannot open shared object file",
    ]
    # with an NVIDIA device, CUDA failing to start is no routine line
    assert log.summary_lines(verbose=False, nvidia_device=True)[1:] == [f"  {CUINIT}", log.summary_lines(
        verbose=False, nvidia_device=False)[1]]
    assert len(log.summary_lines(verbose=True)) == 4
    assert HeldLog().summary_lines(verbose=True) == []
    assert routine(CUINIT, nvidia_device=False) and not routine(CUINIT, nvidia_device=True)
