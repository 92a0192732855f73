"""A test's body runs again only after a tfmem memory failure, and at most once in all.

Each body appends a line to a file every time it runs, as a test writing to a database or a
queue would; the file says how often it ran. TensorFlow is imported, so traces are on
(``on-failure``, the default once TensorFlow is loaded).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import runs

COUNTED = '''
import os
import unittest

import numpy as np
import pytest
import tensorflow as tf

MIB = 2**20


def ran(name):
    with open(os.path.join(os.environ["RUNS_DIR"], name), "a") as runs:
        runs.write("ran\\n")


def test_ordinary_failure():
    ran("test_ordinary_failure")
    assert 1 + 1 == 3


@pytest.mark.tfmem(budget="50MB")
def test_over_budget():
    ran("test_over_budget")
    block = np.ones(150 * MIB, dtype=np.uint8)
    assert int(block[0]) == 1


@pytest.mark.tfmem(budget="50MB", rerun=False)
def test_over_budget_never_twice():
    ran("test_over_budget_never_twice")
    block = np.ones(150 * MIB, dtype=np.uint8)
    assert int(block[0]) == 1


class Case(tf.test.TestCase):
    def test_ordinary_failure_in_a_testcase(self):
        ran("test_ordinary_failure_in_a_testcase")
        self.assertEqual(1 + 1, 3)

    @pytest.mark.tfmem(budget="50MB")
    def test_over_budget_in_a_testcase(self):
        ran("test_over_budget_in_a_testcase")
        block = np.ones(150 * MIB, dtype=np.uint8)
        self.assertEqual(int(block[0]), 1)
'''


@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_only_memory_failures_rerun_and_trace_and_explain_share_one_rerun(
    run_subprocess_records, pytester: pytest.Pytester, runs_dir: Path
) -> None:
    pytester.makepyfile(test_counted=COUNTED)
    result, records = run_subprocess_records("--tfmem-explain", "-p", "no:randomly")
    result.assert_outcomes(failed=5, skipped=1)  # tf.test.TestCase's own test_session skips
    counts = {name: runs(runs_dir, name) for name in (
        "test_ordinary_failure", "test_over_budget", "test_over_budget_never_twice",
        "test_ordinary_failure_in_a_testcase", "test_over_budget_in_a_testcase",
    )}
    assert counts == {
        "test_ordinary_failure": 1,  # an ordinary failure is never re-run
        "test_over_budget": 2,  # traced and explained in one re-run
        "test_over_budget_never_twice": 1,
        "test_ordinary_failure_in_a_testcase": 1,
        "test_over_budget_in_a_testcase": 2,
    }
    for name in ("test_over_budget", "test_over_budget_in_a_testcase"):
        extra = records[name].extra
        assert extra["trace"]["traced"] == "rerun" and extra["explain"]["how"] == "rerun", name
        assert extra["trace"]["profiler_files"], name  # the one profiler of the re-run was the trace's
        assert extra["explain"]["largest"]["contents"].startswith("block = np.ones(150 * MIB")
    never = records["test_over_budget_never_twice"]
    assert "trace" not in never.extra and "explain" not in never.extra
    assert never.notes == [
        "not re-run, so no TensorBoard trace and no memory-by-line table: "
        "re-runs are off for this test (tfmem(rerun=False))",
        "the verdict is the first run's, not confirmed by a re-run: re-runs are off for this test (tfmem(rerun=False))",
    ]
    result.stdout.fnmatch_lines([
        "*test_over_budget_never_twice*over budget",
        "not re-run, so no TensorBoard trace and no memory-by-line table: re-runs are off for this test (tfmem(rerun=False))",
        "the verdict is the first run's, not confirmed by a re-run: re-runs are off for this test (tfmem(rerun=False))",
    ])


def test_rerun_is_a_known_marker_keyword_with_a_clear_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.tfmem(rerun="sometimes")
        def test_x():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_x: invalid tfmem marker argument rerun 'sometimes': expected true/false*"])
