"""First imports are nobody's peak: a test reads the same whether or not it was the first to import.

Without TensorFlow first (a throwaway module that takes 60 MiB at import), then the real thing:
``import tensorflow``, ``import keras`` and ``pytest.importorskip("tensorflow")`` in test bodies,
functions and ``unittest.TestCase`` methods, first to import or not, in process, isolated and
under pytest-xdist.
"""

from __future__ import annotations

import re
import textwrap

import pytest
from conftest import WARM_UP

from pytest_tfmem.core.first_imports import section_lines
from pytest_tfmem.core.measure import Measurement, ViewReading
from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.gates.reports import load_report
from pytest_tfmem.probes.imports import FirstImport

MIB = 2**20


def test_bookings_travel_with_the_measurement_and_old_records_still_read():
    booking = FirstImport("tensorflow", 600 * MIB, 610 * MIB, 2.5)
    measurement = Measurement((ViewReading("host", 0, 16 * MIB, 16 * MIB),), 3.0, first_imports=(booking,))
    data = TestRecord("t.py::test", measurement).to_dict()
    assert list(data["measurement"]["first_imports"]) == [
        {"module": "tensorflow", "host_bytes": 600 * MIB, "peak_bytes": 610 * MIB, "duration_s": 2.5, "raised": False}
    ]
    assert TestRecord.from_dict(data).measurement == measurement
    del data["measurement"]["first_imports"]  # a report written before first imports were booked
    assert TestRecord.from_dict(data).measurement.first_imports == ()  # type: ignore[union-attr]
    assert section_lines([booking, FirstImport("json.tool", 4096, 4096, 0.001)]) == [
        "first import of tensorflow: +600.0 MiB, not charged (its peak +610.0 MiB, 2.50 s)"
    ]


HEAVY_MODULE = """
KEPT = b"k" * (60 * 2**20)
_scratch = b"s" * (40 * 2**20)  # past glibc's largest mmap threshold: freed at once
del _scratch
"""

HEAVY_TESTS = """
def test_a_first_to_import():
    import heavy
    data = b"x" * (20 * 2**20)

def test_b_imports_after():
    import heavy
    data = b"x" * (20 * 2**20)

def test_c_in_a_measure_block(tfmem):
    with tfmem.measure() as block:
        import heavy_too
        data = b"x" * (20 * 2**20)
    assert 19 * 2**20 <= block.peak < 30 * 2**20, block.peak
"""


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_a_first_import_is_left_out_of_the_peak_budget_and_blocks(pytester: pytest.Pytester):
    pytester.makepyfile(heavy=HEAVY_MODULE, heavy_too=HEAVY_MODULE, test_heavy=HEAVY_TESTS)
    common = ("-p", "no:cacheprovider", "--tfmem-budget=50MB", "-rA")
    result = pytester.runpytest_subprocess(*common, "--tfmem-report=report.json")
    result.assert_outcomes(passed=3)
    tests = {r.nodeid.split("::")[-1]: r for r in load_report(pytester.path / "report.json").tests}
    first, after = tests["test_a_first_to_import"].measurement, tests["test_b_imports_after"].measurement
    assert first is not None and after is not None
    assert 19 * MIB <= first.peak < 30 * MIB
    assert abs(first.peak - after.peak) <= 0.1 * max(first.peak, after.peak)
    (booking,) = first.first_imports
    assert booking.module == "heavy" and 59 * MIB <= booking.host_bytes < 70 * MIB
    assert 95 * MIB <= booking.peak_bytes < 115 * MIB
    assert after.first_imports == ()
    result.stdout.re_match_lines([r"first import of heavy: \+6\d\.\d MiB, not charged \(its peak \+(9\d|1\d\d)\.\d MiB, .*"])
    # Asked not to, tfmem charges the import to the test, as it did before it booked imports (and
    # before a re-run confirmed verdicts: a re-run, the module imported, tells the import apart).
    charged = pytester.runpytest_subprocess(*common, "--no-tfmem-book-imports", "--no-tfmem-confirm",
                                            "test_heavy.py::test_a_first_to_import")
    charged.assert_outcomes(failed=1)
    charged.stdout.re_match_lines([r"tfmem: peak (9\d|1\d\d)\.\d MiB > budget 50MB \(47\.7 MiB\)"])
    assert "first import of" not in charged.stdout.str()
    confirmed = pytester.runpytest_subprocess(*common, "--no-tfmem-book-imports", "test_heavy.py::test_a_first_to_import")
    confirmed.assert_outcomes(passed=1)
    confirmed.stdout.re_match_lines([r".*it did not reproduce \(first run (9\d|1\d\d)\.\d MiB \(host RSS .*\), re-run (19|2\d)\.\d MiB \(host RSS .*\)\).*"])


FORM_TESTS = {
    "tf_function": '''
        def test_tensors_import_tensorflow():
            import tensorflow as tf
            assert float(tf.reduce_sum(tf.ones((N,)))) == N
    ''',
    "fit_function": '''
        def test_fit_import_keras():
            import keras
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
            model.compile(optimizer="adam", loss="mse")
            model.fit(np.zeros((64, 8), "float32"), np.zeros((64, 1), "float32"), epochs=1, verbose=0)
    ''',
    "importorskip_function": '''
        @pytest.mark.tfmem(isolate=ISOLATE)
        def test_tensors_importorskip():
            tf = pytest.importorskip("tensorflow")
            assert float(tf.reduce_sum(tf.ones((N,)))) == N
    ''',
    "cases": '''
        class TensorsCase(unittest.TestCase):
            @pytest.mark.tfmem(isolate=ISOLATE)
            def test_import_tensorflow(self):
                import tensorflow as tf
                self.assertEqual(float(tf.reduce_sum(tf.ones((N,)))), N)

            def test_importorskip(self):
                tf = pytest.importorskip("tensorflow")
                self.assertEqual(float(tf.reduce_sum(tf.ones((N,)))), N)
    ''',
    "imports_only": '''
        def test_imports_only():
            import keras
            import tensorflow
    ''',
}
FORM_HEADER = """
import unittest

import numpy as np
import pytest

N = 4 * 2**20  # 16 MiB of float32
ISOLATE = {isolate}
"""


def form_file(isolate: bool, *forms: str) -> str:
    bodies = "".join(textwrap.dedent(FORM_TESTS[form]) for form in forms)
    return FORM_HEADER.format(isolate=isolate) + bodies


@pytest.mark.slow
def test_a_test_reads_the_same_whether_or_not_it_imported_tensorflow_first(pytester: pytest.Pytester):
    # Under pytest-xdist, one worker per file. In the first file's worker the Keras fit is the
    # first test, and the first to import Keras (TensorFlow with it); the importorskip function
    # and a TestCase method that imports TensorFlow run isolated, each in a fork of a template
    # that has not imported it, so each is the first there. In the other worker every form runs
    # after a test that imported both.
    pytester.makepyfile(
        test_first=form_file(True, "fit_function", "tf_function", "importorskip_function", "cases"),
        test_after=form_file(False, "imports_only", "fit_function", "tf_function", "importorskip_function", "cases"),
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-rA", "--tfmem-budget=200MB", "--tfmem-report=report.json", *WARM_UP,
        "-n", "2", "--dist", "loadfile", "test_first.py", "test_after.py",
    )
    result.assert_outcomes(passed=11)  # within 200 MB, first import of TensorFlow or not
    records = {record.nodeid: record for record in load_report(pytester.path / "report.json").tests}
    figures = {nodeid: record.measurement.peak for nodeid, record in records.items() if record.measurement}
    # the tensors are 16 MiB; the fit's figure is its own (Keras's first use is paid in the import, too)
    for name, least in (("test_fit_import_keras", 2 * MIB), ("test_tensors_import_tensorflow", 15 * MIB),
                        ("test_tensors_importorskip", 15 * MIB), ("TensorsCase::test_import_tensorflow", 15 * MIB),
                        ("TensorsCase::test_importorskip", 15 * MIB)):
        first, after = figures[f"test_first.py::{name}"], figures[f"test_after.py::{name}"]
        assert least <= first < 40 * MIB, (name, first)
        assert abs(first - after) <= max(2 * MIB, 0.1 * max(first, after)), (name, first, after)

    # Each first import is named in its test's section, with its size; the tests after it read
    # nothing of it. TensorFlow's runtime started inside the import: its allocator view opened after.
    imported = {
        "test_first.py::test_fit_import_keras": "keras",  # in the worker's own process
        "test_first.py::test_tensors_importorskip": "tensorflow",  # isolated
        "test_first.py::TensorsCase::test_import_tensorflow": "tensorflow",
        "test_after.py::test_imports_only": "keras",  # the other worker's
    }
    for nodeid, module in imported.items():
        section = section_of(result.stdout.lines, nodeid)
        # hundreds of MiB: ~580 on TensorFlow 2.21, ~440 on 2.16
        said = re.compile(rf"first import of {module}: \+\d{{3}}\.\d MiB, not charged")
        assert any(said.match(line) for line in section), section
        assert [b.module for b in records[nodeid].measurement.first_imports if b.host_bytes > 100 * MIB] == [module]  # type: ignore[union-attr]
    for nodeid in set(records) - set(imported):
        assert not any("first import of" in line for line in section_of(result.stdout.lines, nodeid)), nodeid
    case = records["test_first.py::TensorsCase::test_import_tensorflow"].measurement
    tf_view = case.view("tf:CPU:0") if case else None
    assert tf_view is not None and 15 * MIB <= tf_view.increase < 20 * MIB, tf_view


def section_of(lines: list[str], nodeid: str) -> list[str]:
    """The lines of the one ``-rA`` report block whose tfmem table has a row for ``nodeid``."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        if line.startswith("____"):  # a test's title
            current = []
            blocks.append(current)
        elif line.startswith("===="):  # the next part of the output (the summaries): no test's
            current = None
        elif current is not None:
            current.append(line)
    (block,) = [block for block in blocks if any(line.startswith(nodeid + " ") for line in block)]
    return block
