"""TensorFlow's out-of-memory error retold as a tfmem failure.

The messages below are TensorFlow 2.21's own: the CPU ones were captured on this machine
with ``TF_MKL_ALLOC_MAX_BYTES=67108864``; the GPU one has the form TensorFlow's GPU
allocator writes (same template, ``GPU_0_bfc`` allocator). The slow test forces a real
``ResourceExhaustedError`` in a child pytest run.
"""

from __future__ import annotations

import pytest

from pytest_tfmem.core.measure import Measurement, ViewReading
from pytest_tfmem.core.oom import describe_oom, parse_oom, record_section

MiB = 2**20
EAGER_CPU = (
    "{{function_node __wrapped__RandomStandardNormal_device_/job:localhost/replica:0/task:0/device:CPU:0}} "
    "OOM when allocating tensor with shape[4096,8192] and type float on "
    "/job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu [Op:RandomStandardNormal] name: "
)
KERAS_FIT_CPU = (
    "{{function_node __wrapped__StatelessRandomUniformV2_device_/job:localhost/replica:0/task:0/device:CPU:0}} "
    "OOM when allocating tensor with shape[4096,8192] and type float on "
    "/job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu [Op:StatelessRandomUniformV2] name: "
)
GRAPH_GPU = (
    "OOM when allocating tensor with shape[64,1024,56,56] and type half on "
    "/job:localhost/replica:0/task:0/device:GPU:1 by allocator GPU_1_bfc\n"
    "\t [[{{node conv2d/Conv2D}}]]\n"
    "Hint: If you want to see a list of allocated tensors when OOM happens, add report_tensor_allocations_upon_oom "
    "to RunOptions for current allocation info."
)
EAGER_GPU_SHORT = "failed to allocate memory [Op:AddV2] on /job:localhost/replica:0/task:0/device:GPU:0"


def test_parse_an_eager_cpu_oom():
    oom = parse_oom(EAGER_CPU)
    assert (oom.device, oom.allocator, oom.shape, oom.dtype, oom.op) == (
        "CPU:0", "mklcpu", (4096, 8192), "float", "RandomStandardNormal"
    )
    assert oom.requested_bytes == 128 * MiB
    assert oom.tensor() == "a tensor of shape [4096,8192] and type float (128.0 MiB)"


def test_parse_a_keras_fit_oom():
    oom = parse_oom(KERAS_FIT_CPU)
    assert (oom.device, oom.op, oom.requested_bytes) == ("CPU:0", "StatelessRandomUniformV2", 128 * MiB)
    assert oom.message == (
        "OOM when allocating tensor with shape[4096,8192] and type float on "
        "/job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu [Op:StatelessRandomUniformV2]"
    )


def test_parse_a_graph_mode_gpu_oom():
    oom = parse_oom(GRAPH_GPU)
    assert (oom.device, oom.allocator, oom.shape, oom.dtype, oom.op) == ("GPU:1", "GPU_1_bfc", (64, 1024, 56, 56), "half", None)
    assert oom.requested_bytes == 64 * 1024 * 56 * 56 * 2
    assert oom.message == "OOM when allocating tensor with shape[64,1024,56,56] and type half on " \
        "/job:localhost/replica:0/task:0/device:GPU:1 by allocator GPU_1_bfc"


def test_parse_a_message_without_the_allocation_template_keeps_what_it_can():
    oom = parse_oom(EAGER_GPU_SHORT)
    assert (oom.device, oom.allocator, oom.shape, oom.op) == ("GPU:0", None, None, "AddV2")
    assert oom.tensor() == "memory"


def test_the_failure_names_device_allocator_tensor_limit_peak_and_trace(monkeypatch: pytest.MonkeyPatch):
    measurement = Measurement((ViewReading("host", 0, 3 * MiB, 0), ViewReading("tf:GPU:1", 10 * MiB, 1034 * MiB, 10 * MiB)), 0.5)
    text = describe_oom(parse_oom(GRAPH_GPU), measurement, gpu_limit=2 * 2**30, trace_directory=".tfmem/traces/s/t")
    assert text.splitlines() == [
        "tfmem: out of memory on GPU:1: allocator GPU_1_bfc could not allocate a tensor of shape [64,1024,56,56] "
        "and type half (392.0 MiB)",
        "tfmem: limit 2.0 GiB (--tfmem-gpu-limit)",
        "tfmem: this test's peak before the error: 3.0 MiB (host RSS 3.0 MiB, TF GPU:1 allocator 1.0 GiB)",
        "tfmem: trace: .tfmem/traces/s/t",
        "TensorFlow: OOM when allocating tensor with shape[64,1024,56,56] and type half on "
        "/job:localhost/replica:0/task:0/device:GPU:1 by allocator GPU_1_bfc",
    ]
    monkeypatch.setenv("TF_MKL_ALLOC_MAX_BYTES", "67108864")
    section = record_section(parse_oom(EAGER_CPU), gpu_limit=None)
    assert section["limit"] == "limit 64.0 MiB (TF_MKL_ALLOC_MAX_BYTES)"
    assert (section["shape"], section["requested_bytes"]) == ([4096, 8192], 128 * MiB)
    monkeypatch.delenv("TF_MKL_ALLOC_MAX_BYTES")
    assert "no allocator limit" in describe_oom(parse_oom(EAGER_CPU), None, None)
    assert "no tfmem limit" in describe_oom(parse_oom(GRAPH_GPU), None, None)


OOM_TESTS = """
import pytest
import tensorflow as tf

@pytest.mark.tfmem
def test_needs_128MiB():
    held = tf.ones((1024, 1024))  # 4 MiB: below the cap
    tf.random.normal((4096, 8192))

@pytest.mark.xfail(raises=tf.errors.ResourceExhaustedError, strict=True)
@pytest.mark.tfmem
def test_expects_the_oom():
    tf.random.normal((4096, 8192))
"""


@pytest.mark.longest
@pytest.mark.slow  # TensorFlow's allocator retries each failed allocation for 10 s
def test_a_real_ResourceExhaustedError_is_a_clear_tfmem_failure(
    pytester: pytest.Pytester, run_subprocess_records, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("TF_MKL_ALLOC_MAX_BYTES", str(64 * MiB))
    monkeypatch.setenv("COLUMNS", "250")  # the short summary line in full
    pytester.makepyfile(test_oom=OOM_TESTS)
    result, records = run_subprocess_records("--tfmem-trace=off", "-rf")
    result.assert_outcomes(failed=1, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_needs_128MiB _*",
            "tfmem: out of memory on CPU:0: allocator mklcpu could not allocate a tensor of shape [4096,8192] "
            "and type float (128.0 MiB) for op RandomStandardNormal",
            "tfmem: limit 64.0 MiB (TF_MKL_ALLOC_MAX_BYTES)",
            "tfmem: this test's peak before the error: * (host RSS *, TF CPU:0 allocator *)",
            "TensorFlow: OOM when allocating tensor with shape?4096,8192? and type float on "
            "/job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu ?Op:RandomStandardNormal?",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED test_oom.py::test_needs_128MiB - tfmem: *"])
    record = records["test_needs_128MiB"]
    assert [v.check for v in record.verdicts if not v.ok] == ["oom"]
    section = record.extra["oom"]
    assert (section["device"], section["allocator"], section["shape"], section["requested_bytes"]) == (
        "CPU:0", "mklcpu", [4096, 8192], 128 * MiB
    )
    assert 4 * MiB <= record.measurement.view("tf:CPU:0").increase <= 8 * MiB  # the 4 MiB it held
