"""Every kind of test pytest runs is measured: functions, unittest.TestCase, tf.test.TestCase,
absl parameterized.TestCase, doctests; markers work on TestCase methods as on functions.

The suites import TensorFlow, so they run in a fresh interpreter (``runpytest_subprocess``).
"""

from __future__ import annotations

import pytest

MB = 10**6
MIB = 2**20

STYLES = '''
"""A module doctest:

>>> import numpy as np
>>> block = np.ones(150 * 2**20, dtype=np.uint8)
>>> int(block[-1])
1
"""
import unittest

import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

MIB = 2**20


def hold(mib):
    block = np.ones(mib * MIB, dtype=np.uint8)
    return int(block.sum() // MIB)


def test_function_over():
    assert hold(150) == 150


class PlainCase(unittest.TestCase):
    def setUp(self):
        self.block = np.ones(150 * MIB, dtype=np.uint8)  # setUp runs inside the measured call phase

    def tearDown(self):
        del self.block

    def test_set_up_counts(self):
        self.assertEqual(int(self.block[0]), 1)


class TensorFlowCase(tf.test.TestCase):
    def test_over(self):
        self.assertEqual(hold(150), 150)

    def test_under(self):
        self.assertEqual(hold(10), 10)

    @pytest.mark.tfmem(budget="400MB")
    def test_marker_raises_the_budget(self):
        self.assertEqual(hold(150), 150)

    @pytest.mark.tfmem(budget=None)
    def test_marker_exempts(self):
        self.assertEqual(hold(150), 150)

    def test_tensors_over(self):
        tensor = tf.ones((150 * MIB // 4,), dtype=tf.float32)
        self.assertAllEqual(tf.reduce_max(tensor), 1.0)


class ParameterizedCase(parameterized.TestCase):
    @parameterized.parameters(10, 150)
    def test_sizes(self, mib):
        self.assertEqual(hold(mib), mib)
'''


@pytest.mark.linux  # exact marks: a set-up's peak read by sampling falls short of the 145 MiB it asserts
@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_every_style_is_measured_and_held_to_the_budget(run_subprocess_records, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_styles=STYLES)
    result, records = run_subprocess_records("--tfmem-budget=100MB", "--tfmem-trace=off", "--doctest-modules", "test_styles.py")
    outcomes = {report: record.outcome for report, record in records.items()}
    assert outcomes == {
        "test_styles": "failed",  # the doctest item
        "test_function_over": "failed",
        "test_set_up_counts": "failed",
        "test_over": "failed",
        "test_under": "passed",
        "test_marker_raises_the_budget": "passed",
        "test_marker_exempts": "passed",
        "test_tensors_over": "failed",
        "test_session": "skipped",  # tf.test.TestCase's own, skipped by TensorFlow
        "test_sizes0": "passed",
        "test_sizes1": "failed",
    }, result.stdout.str()
    for name in ("test_styles", "test_function_over", "test_set_up_counts", "test_over", "test_tensors_over", "test_sizes1"):
        # TensorFlow's CPU allocator hands out a 150 MiB tensor from a 256 MiB chunk
        assert 145 * MIB < records[name].measurement.peak < 260 * MIB, name
        assert [v.check for v in records[name].failed_verdicts] == ["budget"]
    assert records["test_marker_raises_the_budget"].budget == 400 * MB
    assert records["test_marker_exempts"].budget is None
    result.stdout.fnmatch_lines([
        "FAILED test_styles.py::PlainCase::test_set_up_counts - tfmem: *",
        "FAILED test_styles.py::TensorFlowCase::test_over - tfmem: *",
        "FAILED test_styles.py::ParameterizedCase::test_sizes1 - tfmem: *",
    ])
    assert "not measured" not in result.stdout.str()


MARKERS = '''
import unittest

import numpy as np
import pytest
import tensorflow as tf

MIB = 2**20
KEPT = []


SET_UPS = []


class MarkedCase(tf.test.TestCase):
    def setUp(self):
        SET_UPS.append(self._testMethodName)

    @pytest.mark.tfmem_leak(iterations=4, warmup=2, max_growth="500KB")
    def test_leaks(self):
        KEPT.append(np.ones(MIB, dtype=np.uint8))

    def test_set_up_ran_once_for_the_leak_check(self):  # runs after test_leaks: unittest sorts by name
        self.assertEqual(SET_UPS.count("test_leaks"), 1)

    @pytest.mark.tfmem(kill_at="1500MB")  # above the ~0.7 GB a process with TensorFlow starts at
    def test_killed_at_the_limit(self):
        blocks = [np.ones(50 * MIB, dtype=np.uint8) for _ in range(60)]
        self.assertTrue(blocks)

    @pytest.mark.tfmem(isolate=True)
    def test_isolated_passes(self):
        self.assertEqual(int(np.ones(MIB, dtype=np.uint8).sum()), MIB)


class PlainCase(unittest.TestCase):
    @pytest.mark.tfmem(budget="50MB", explain=True)
    def test_explained(self):
        block = np.ones(150 * MIB, dtype=np.uint8)
        self.assertEqual(int(block[0]), 1)
'''


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_markers_work_on_testcase_methods(run_subprocess_records, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_markers=MARKERS)
    result, records = run_subprocess_records("-rA", "--tfmem-trace=off", "test_markers.py")
    outcomes = {name: record.outcome for name, record in records.items()}
    assert outcomes == {
        "test_leaks": "failed",
        "test_killed_at_the_limit": "failed",
        "test_isolated_passes": "passed",
        "test_explained": "failed",
    }, result.stdout.str()  # the unmarked tests are not measured: no tfmem option is given
    result.stdout.fnmatch_lines(["PASSED test_markers.py::MarkedCase::test_set_up_ran_once_for_the_leak_check"])
    leak = records["test_leaks"].extra["leak"]
    assert leak["leaked"] and leak["iterations"] == 4 and 0.9 * MIB < leak["growth_per_iteration"] < 1.2 * MIB
    assert [v.check for v in records["test_killed_at_the_limit"].failed_verdicts] == ["kill_at"]
    assert "isolated" in records["test_isolated_passes"].extra
    explained = records["test_explained"].extra["explain"]
    assert explained["how"] == "rerun"
    assert explained["largest"]["contents"].startswith("block = np.ones(150 * MIB")
    result.stdout.fnmatch_lines(["FAILED test_markers.py::MarkedCase::test_leaks - tfmem: *"])


NOT_MEASURED = '''
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A plugin that runs some tests its own way, calling item.runtest() itself."""
    if "own_way" not in item.name:
        return None
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    steps = (
        ("setup", lambda: item.session._setupstate.setup(item)),
        ("call", item.runtest),
        ("teardown", lambda: item.session._setupstate.teardown_exact(nextitem)),
    )
    for when, step in steps:
        call = pytest.CallInfo.from_call(step, when)
        ihook.pytest_runtest_logreport(report=ihook.pytest_runtest_makereport(item=item, call=call))
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
'''


def test_a_test_that_escapes_measurement_is_named_in_the_summary(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(NOT_MEASURED)
    pytester.makepyfile(test_two="def test_measured():\n    pass\n\ndef test_run_its_own_way():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfmem-budget=1GB")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "tfmem: 1 test(s) not measured:",
        "  test_two.py::test_run_its_own_way: its call phase did not go through pytest_runtest_call",
    ])
