"""TensorFlow's CPU allocator view (``tf:CPU:0``) on the real TensorFlow.

The allocator counts the chunks it hands out, and its BFC pool may round a chunk up (a
100 MB tensor can take a 128 MiB chunk of a fresh pool), so the figure is the allocated
size or somewhat more; with 10 MB tensors it stays within 10% (docs/gpu.md, "What
`tf:CPU:0` reads"). After a heavier test TF serves the tensors from its pool and RSS hardly moves;
the allocator view still reads them.
"""

from __future__ import annotations

import pytest

ALLOCATIONS = """
import pytest
import tensorflow as tf

def allocate(total_mb, tensor_mb=10):
    tensors = [tf.ones((tensor_mb * 10**6 // 4,), tf.float32) for _ in range(total_mb // tensor_mb)]
    del tensors

@pytest.mark.tfmem
def test_400MB_first():
    allocate(400)

@pytest.mark.tfmem
def test_600MB_heavier():
    allocate(600)

@pytest.mark.tfmem
def test_400MB_after_the_heavier_one():
    allocate(400)
"""


@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_400MB_of_tensors_reads_about_400MB_on_tf_CPU_0_alone_and_after_a_heavier_test(
    pytester: pytest.Pytester, run_subprocess_records
):
    pytester.makepyfile(test_allocations=ALLOCATIONS)
    result, records = run_subprocess_records("--tfmem-trace=off")
    result.assert_outcomes(passed=3)
    readings = {name: record.measurement for name, record in records.items()}
    for name in ("test_400MB_first", "test_400MB_after_the_heavier_one"):
        m = readings[name]
        tf_cpu = m.view("tf:CPU:0")
        assert tf_cpu is not None, f"{name}: no tf:CPU:0 view ({m.views})"
        assert 400e6 <= tf_cpu.increase <= 1.10 * 400e6, f"{name}: tf:CPU:0 {tf_cpu.increase / 2**20:.1f} MiB"
        assert 400e6 <= m.peak <= 1.10 * 400e6, f"{name}: peak {m.peak / 2**20:.1f} MiB"
    heavier = readings["test_600MB_heavier"].view("tf:CPU:0").increase
    assert 600e6 <= heavier <= 1.10 * 600e6
    # Why the allocator view matters: served from TF's pool, the later test hardly raises RSS.
    print({name: (m.host / 2**20, m.view("tf:CPU:0").increase / 2**20) for name, m in readings.items()})
