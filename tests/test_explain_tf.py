"""Explaining a failure, TensorFlow side: the ops alive at the allocator's peak, from a real trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_tfmem.explain.tf_ops import UNATTRIBUTED, peak_allocations, render_ops

MIB = 2**20

# A Dense layer of 4096 units on a batch of 2048: its output, [2048, 4096] float32 = 32 MiB,
# is the largest tensor (kernel [256, 4096] = 4 MiB, input [2048, 256] = 2 MiB).
WIDE_MODEL = """
import numpy as np
import pytest
import tensorflow as tf

def predict_wide():
    model = tf.keras.Sequential([
        tf.keras.Input((256,)),
        tf.keras.layers.Dense(4096, name="wide"),
        tf.keras.layers.Dense(8, name="head"),
    ])
    model.predict(np.zeros((2048, 256), "float32"), batch_size=2048, verbose=0)

@pytest.mark.tfmem(budget="16MB", explain=True)
def test_traced():
    predict_wide()

@pytest.mark.tfmem(budget="16MB", explain=True, trace="off")
def test_untraced():
    predict_wide()

@pytest.mark.tfmem(budget="16MB", explain=True, explain_mode="from-start", trace="off")
def test_from_start():
    predict_wide()

@pytest.mark.tfmem(budget="16MB", explain=True, explain_mode="from-start", trace="always")
def test_from_start_traced():
    predict_wide()
"""


@pytest.mark.slow  # four failing TensorFlow tests, traced and re-run, in a fresh interpreter: ~40 s here
@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_the_largest_tensor_is_listed_first_with_its_shape_and_size(run_subprocess_records, pytester: pytest.Pytester):
    pytester.makepyfile(test_wide=WIDE_MODEL)
    result, records = run_subprocess_records("--tfmem-trace-dir=traces")
    result.assert_outcomes(failed=4)
    result.stdout.fnmatch_lines([
        "*- memory at the peak by TensorFlow op -*",
        "from the test's TensorBoard trace (its re-run by the trace feature)",
        "allocator *: * in use at its peak, * s into the trace",
        "op * shape * dtype * count * MiB",
        "*wide*/* [[]2048,4096[]] * float * 1 * 32.0",
        "*- memory at the peak by TensorFlow op -*",
        "from TensorFlow's profiler during the re-run",
        "allocator *",
        "op * shape * dtype * count * MiB",
        "*wide*/* [[]2048,4096[]] * float * 1 * 32.0",
        "*- memory at the peak by TensorFlow op -*",
        "from TensorFlow's profiler during the test's own run",
        "allocator *",
        "op * shape * dtype * count * MiB",
        "*wide*/* [[]2048,4096[]] * float * 1 * 32.0",
    ])
    sources = {
        "test_traced": "the test's TensorBoard trace (its re-run by the trace feature)",
        "test_untraced": "TensorFlow's profiler during the re-run",
        "test_from_start": "TensorFlow's profiler during the test's own run",
        "test_from_start_traced": "the test's TensorBoard trace (its own run)",
    }
    for name, source in sources.items():
        explanation = records[name].extra["explain"]
        assert explanation["tensorflow"]["source"] == source
        allocator = explanation["tensorflow"]["allocators"][0]
        first = allocator["rows"][0]
        assert (first["shape"], first["dtype"], first["bytes"]) == ("[2048,4096]", "float", 32 * MIB), first
        assert "wide" in first["layer"], first
        assert allocator["peak_bytes"] >= 32 * MIB
        # by line, the predict call took it
        assert explanation["largest"]["contents"] == "predict_wide()"
        assert explanation["largest"]["peak_increase_bytes"] >= 32 * MIB
    # a traced test's explanation is in its trace directory's summary.json too
    for name in ("test_traced", "test_from_start_traced"):
        trace_directory = Path(records[name].extra["trace"]["directory"])
        summary = json.loads((trace_directory / "summary.json").read_text())
        assert summary["explain"]["tensorflow"]["allocators"][0]["rows"][0]["shape"] == "[2048,4096]"
    assert "trace" not in records["test_untraced"].extra


def _allocation(op: str, shape: str, nbytes: int, dtype: str = "float") -> dict:
    return {"activityMetadata": {"memoryActivity": "ALLOCATION", "allocationBytes": str(nbytes),
                                 "tfOpName": op, "tensorShape": shape, "dataType": dtype}}


def test_allocations_alive_at_the_peak_are_grouped_by_op_shape_and_dtype():
    # The shape of xprof's memory_profile tool data (keys and string-encoded numbers as in a real capture).
    profile = {
        "memoryProfilePerAllocator": {
            "mklcpu": {
                "profileSummary": {"peakStats": {"peakBytesInUse": str(90 * MIB)}, "peakStatsTimePs": "1500000000000"},
                "memoryProfileSnapshots": [
                    _allocation("model/dense/MatMul", "[64,1024]", 8 * MIB),
                    _allocation("model/dense_1/BiasAdd", "[64,4096]", 32 * MIB),
                    _allocation("", "", 2 * MIB, "INVALID"),
                ],
                "specialAllocations": [
                    {"allocationBytes": str(24 * MIB), "tfOpName": UNATTRIBUTED, "tensorShape": "unknown",
                     "dataType": "INVALID"},
                ],
                "activeAllocations": [
                    {"snapshotIndex": "0", "specialIndex": "-1", "numOccurrences": "4"},
                    {"snapshotIndex": "1", "specialIndex": "-1", "numOccurrences": "1"},
                    {"snapshotIndex": "2", "specialIndex": "-1", "numOccurrences": "1"},
                    {"snapshotIndex": "-1", "specialIndex": "0", "numOccurrences": "1"},
                ],
            },
            "unused": {"profileSummary": {"peakStats": {"peakBytesInUse": "0"}}},
        }
    }
    (peak,) = peak_allocations(profile, top=3)
    assert (peak.allocator, peak.peak_bytes, peak.peak_time_s, peak.groups) == ("mklcpu", 90 * MIB, 1.5, 4)
    assert [(row.op, row.shape, row.dtype, row.count, row.bytes) for row in peak.rows] == [
        ("model/dense/MatMul", "[64,1024]", "float", 4, 32 * MIB),
        ("model/dense_1/BiasAdd", "[64,4096]", "float", 1, 32 * MIB),
        (UNATTRIBUTED, "", "", 1, 24 * MIB),
    ]
    assert peak.rows[1].layer == "model/dense_1"
    lines = render_ops(peak)
    assert lines[0] == "allocator mklcpu: 90.0 MiB in use at its peak, 1.50 s into the trace"
    assert lines[2].split() == ["model/dense/MatMul", "[64,1024]", "float", "4", "32.0"]
    assert lines[-2] == "(1 smaller groups not shown)"
    assert lines[-1].startswith(f"'{UNATTRIBUTED}': bytes in use at the peak")


@pytest.mark.slow  # a failing TensorFlow test explained in a fresh interpreter
def test_without_the_cpu_allocators_statistics_explain_says_why_there_is_no_op_table(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    """oneDNN off (the default on some AMD EPYC CPUs): no op table, and how to get one."""
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    pytester.makepyfile(test_wide=WIDE_MODEL)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "test_untraced")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "note: no op table: TensorFlow's CPU allocator keeps no statistics here (TF_ENABLE_ONEDNN_OPTS is off); "
        "TF_ENABLE_ONEDNN_OPTS=1 (or TF_CPU_ALLOCATOR_USE_BFC=1) set before TensorFlow loads turns it on",
    ])
    assert "memory at the peak by TensorFlow op" not in result.stdout.str()
