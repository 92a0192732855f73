"""A test measures the same alone and after a heavier test (numpy heap and TF allocator traps)."""

from __future__ import annotations

import json

import pytest

NUMPY_TESTS = """
import numpy as np

def allocate_small_arrays(total_bytes):
    # 100 KB arrays live on glibc's heap: freed, they stay in its arenas unless trimmed
    arrays = [np.ones(10**5, dtype=np.uint8) for _ in range(total_bytes // 10**5)]
    del arrays

def test_heavier():
    allocate_small_arrays(800 * 10**6)

def test_numpy_heavy():
    allocate_small_arrays(400 * 10**6)
"""

TF_TESTS = """
import tensorflow as tf

def test_heavier():
    tensors = [tf.ones((2_500_000,)) for _ in range(80)]  # 800 MB of float32 tensors
    del tensors

def test_tf_heavy():
    tensors = [tf.ones((2_500_000,)) for _ in range(40)]  # 400 MB
    del tensors
"""


def agree(alone: int, after: int) -> bool:
    return abs(alone - after) <= max(0.10 * alone, 16 * 2**20)


@pytest.mark.linux  # malloc_trim hands freed heap back before each reading
@pytest.mark.parametrize(
    ("source", "test_name", "expected"),
    [(NUMPY_TESTS, "test_numpy_heavy", 400 * 10**6), (TF_TESTS, "test_tf_heavy", 400 * 10**6)],
    ids=["numpy", "tensorflow"],
)
@pytest.mark.forked_sessions  # its inner sessions import TensorFlow
def test_alone_and_after_a_heavier_test_agree(pytester, run_subprocess_records, source, test_name, expected):
    pytester.makepyfile(source)
    _, alone = run_subprocess_records("--tfmem-budget=4GB", "-k", test_name)
    result, after = run_subprocess_records("--tfmem-budget=4GB")
    result.assert_outcomes(passed=2)
    peak_alone = alone[test_name].measurement.peak
    peak_after = after[test_name].measurement.peak
    assert after["test_heavier"].measurement.peak > peak_after  # the heavier one really was heavier
    assert agree(peak_alone, peak_after), (peak_alone, peak_after)
    assert 0.9 * expected <= peak_alone <= 1.2 * expected, peak_alone


@pytest.mark.forked_sessions  # its inner sessions import TensorFlow
def test_tensorflow_view_carries_the_figure_when_rss_cannot_see_it(pytester, run_subprocess_records):
    """After a heavier TF test, TF serves the tensors from its pool: RSS barely moves."""
    pytester.makepyfile(TF_TESTS)
    result, records = run_subprocess_records("--tfmem-budget=4GB")
    assert "no TF CPU allocator view" not in result.stdout.str()  # oneDNN on: the view is there
    measurement = records["test_tf_heavy"].measurement
    assert measurement.host < 50 * 2**20
    assert measurement.view("tf:CPU:0").increase > 380 * 10**6
    assert measurement.peak == measurement.tf_host


def test_a_missing_tensorflow_cpu_view_is_said_with_how_to_turn_it_on(pytester, monkeypatch):
    """With oneDNN off (the default on some AMD EPYC CPUs, here forced), TensorFlow's CPU allocator
    keeps no statistics: the session says so once, after collection, or at the end under
    pytest-xdist (one worker: each imports TensorFlow for the module)."""
    pytester.makepyfile("import tensorflow as tf\n\ndef test_sum():\n    assert float(tf.reduce_sum(tf.ones(4))) == 4\n")
    said = "*no TF CPU allocator view: TensorFlow's CPU allocator keeps no statistics here (TF_ENABLE_ONEDNN_OPTS is off)*TF_ENABLE_ONEDNN_OPTS=1*"
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["collected 1 item", f"tfmem: {said}"])
    assert result.stdout.str().count("no TF CPU allocator view") == 1
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB", "-n", "1")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"tfmem: on the workers: {said}"])


FREED_BY_A_FIXTURE = """
import pytest

kept = {"rows": [bytearray(1000) for _ in range(100_000)]}  # ~100 MB in glibc's heap, not mmapped


@pytest.fixture
def cleared():
    kept["rows"] = None  # freed into the heap during the test's setup, resident until handed back
    yield


@pytest.mark.parametrize("run", range(3))
def test_after_a_parameter(run):
    pass


def test_reuses_what_its_fixture_freed(cleared):
    made = [bytearray(1000) for _ in range(50_000)]  # ~50 MB: would fit in what the fixture freed
    assert len(made) == 50_000
"""

COUNT_TRIMS = """
from pytest_tfmem import platforms

calls = []


def pytest_configure(config):
    platform = platforms.current()
    original = platform.release_freed_heap

    def counted():
        calls.append(1)
        original()

    platform.release_freed_heap = counted


def pytest_sessionfinish(session):
    with open("trims.txt", "w") as out:
        out.write(str(len(calls)))
"""


def run_counting_trims(pytester, source: str, passed: int) -> tuple[dict[str, dict], int]:
    """Run ``source`` measured, counting the trims: each test's report entry by name, and the trims."""
    pytester.makeconftest(COUNT_TRIMS)
    pytester.makepyfile(test_trims=source)
    reports = pytester.path / "r.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB", f"--tfmem-report={reports}",
                                           "-p", "no:randomly")
    result.assert_outcomes(passed=passed)
    tests = {test["nodeid"].split("::")[-1]: test for test in json.loads(reports.read_text())["tests"]}
    return tests, int((pytester.path / "trims.txt").read_text())


@pytest.mark.linux  # glibc's malloc_trim
def test_a_window_skips_the_second_trim_only_where_no_fixture_ran_since_the_boundary(pytester):
    """Freed heap is handed back once between two tests (a trim walks the whole heap); a test whose
    own fixture freed memory still starts from a trimmed heap, so what it reuses is counted."""
    tests, trims = run_counting_trims(pytester, FREED_BY_A_FIXTURE, passed=4)
    assert tests["test_reuses_what_its_fixture_freed"]["measurement"]["peak"] > 45 * 2**20  # not read as ~0
    # a boundary per test (and the first test's start), and one more window start where a fixture ran
    assert trims <= 4 + 1 + 1 + 2, trims


SMALL_TESTS_AND_ONE_THAT_FREES = """
import pytest


@pytest.mark.parametrize("index", range(200))
def test_small(index):
    assert len([bytearray(100) for _ in range(100)]) == 100


def test_frees_what_it_made():
    made = [bytearray(1000) for _ in range(60_000)]  # ~60 MB in glibc's heap, freed: resident until handed back
    del made


def test_after_it():
    made = [bytearray(1000) for _ in range(50_000)]  # ~50 MB: would fit in what the test before freed
    assert len(made) == 50_000
"""


@pytest.mark.linux  # glibc's malloc_trim
def test_trims_between_tests_are_skipped_where_they_give_nothing_back_and_done_after_a_test_that_rose(pytester):
    """A trim walks every free chunk of the heap: between small tests that give nothing back most
    are skipped (at most 16 in a row); after a test that rose 4 MiB or more one is always done, so
    the next test cannot reuse what it freed unseen."""
    tests, trims = run_counting_trims(pytester, SMALL_TESTS_AND_ONE_THAT_FREES, passed=202)
    assert tests["test_after_it"]["measurement"]["peak"] > 45 * 2**20  # not read as ~0: the heap was trimmed before it
    assert 202 / 17 <= trims <= 40, trims  # a trim every 16 tests at least, and not one a test
