"""A framework's device out-of-memory error, read and retold as a tfmem failure.

TensorFlow raises ``tf.errors.ResourceExhaustedError`` whose message, for an allocation
that failed, reads like::

    {{function_node __wrapped__Fill_device_/job:localhost/replica:0/task:0/device:CPU:0}}
    OOM when allocating tensor with shape[26214400] and type float on
    /job:localhost/replica:0/task:0/device:CPU:0 by allocator mklcpu [Op:Fill] name:

``parse_oom`` takes out the device, the allocator, the shape and type (hence the size
requested) and the op; ``describe_oom`` adds the allocator's limit and the test's peak.
Messages in other forms (``failed to allocate memory``) keep what can be found, the size asked
for among it: JAX's ``RESOURCE_EXHAUSTED: Out of memory allocating 4398046511104 bytes.``,
PyTorch's ``CUDA out of memory. Tried to allocate 2.00 GiB``.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass
from typing import Any

from pytest_tfmem.core.measure import Measurement
from pytest_tfmem.core.verdict import describe_views
from pytest_tfmem.units import format_size

CHECK = "oom"
CPU_LIMIT_VARIABLE = "TF_MKL_ALLOC_MAX_BYTES"  # caps TensorFlow's oneDNN CPU allocator

_ALLOCATION = re.compile(
    r"OOM when allocating tensor with shape\s*\[(?P<shape>[^\]]*)\]\s*and type (?P<dtype>\w+)"
    r" on (?P<device>\S+) by allocator (?P<allocator>\S+)"
)
_DEVICE = re.compile(r"device:(?P<device>[A-Z_]+:\d+)")
_ALLOCATOR = re.compile(r"by allocator (?P<allocator>[\w.]+)")
_OP = re.compile(r"\[Op:(?P<op>[^\]\s]+)")
_FUNCTION_NODE = re.compile(r"^\{\{function_node [^}]*\}\}\s*")  # where an eager op ran: noise here
_BYTES_ASKED = re.compile(r"allocating (?P<bytes>\d+) bytes")  # JAX's (XLA's)
_SIZE_ASKED = re.compile(r"Tried to allocate (?P<number>[\d.]+) (?P<unit>[KMGT]i?B|B)")  # PyTorch's
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 2**10, "MB": 2**20, "GB": 2**30}

# Bytes per element of TensorFlow's type names (DataTypeString) that a tensor can have.
_DTYPE_BYTES = {
    "bool": 1, "int8": 1, "uint8": 1, "qint8": 1, "quint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int16": 2, "uint16": 2, "half": 2, "bfloat16": 2, "qint16": 2, "quint16": 2,
    "float": 4, "int32": 4, "uint32": 4, "qint32": 4,
    "double": 8, "int64": 8, "uint64": 8, "complex64": 8,
    "complex128": 16,
}


@dataclass(frozen=True)
class OutOfMemory:
    """What TensorFlow's message says about the failed allocation (``None``: it does not say)."""

    device: str | None  # "CPU:0", "GPU:1"
    allocator: str | None  # "mklcpu", "GPU_0_bfc"
    shape: tuple[int, ...] | None
    dtype: str | None
    op: str | None
    message: str  # the framework's own message: its first line, without the function-node prefix
    framework: str = "TensorFlow"
    asked_bytes: int | None = None  # the size the message names, where it names no tensor

    @property
    def requested_bytes(self) -> int | None:
        if self.shape is None or self.dtype not in _DTYPE_BYTES:
            return self.asked_bytes
        return math.prod(self.shape) * _DTYPE_BYTES[self.dtype]

    def tensor(self) -> str:
        """``a tensor of shape [4096,8192] and type float (128.0 MiB)``, or what is known of it."""
        if self.shape is None:
            return "memory" if self.asked_bytes is None else format_size(self.asked_bytes)
        text = f"a tensor of shape [{','.join(map(str, self.shape))}] and type {self.dtype}"
        size = self.requested_bytes
        return f"{text} ({format_size(size)})" if size is not None else text


def parse_oom(message: str, framework: str = "TensorFlow") -> OutOfMemory:
    allocation = _ALLOCATION.search(message)
    device_match = _DEVICE.search(allocation.group("device") if allocation else message)
    allocator = allocation.group("allocator") if allocation else None
    if allocator is None:
        found = _ALLOCATOR.search(message)
        allocator = found.group("allocator") if found else None
    shape = None
    if allocation:
        try:
            shape = tuple(int(dim) for dim in allocation.group("shape").split(",") if dim.strip())
        except ValueError:  # an unknown dimension (?) in a graph-mode message
            shape = None
    op = _OP.search(message)
    first_line = next((line.strip() for line in message.splitlines() if line.strip()), "")
    first_line = _FUNCTION_NODE.sub("", first_line).removesuffix(" name:")
    asked = None
    if (found_bytes := _BYTES_ASKED.search(message)) is not None:
        asked = int(found_bytes.group("bytes"))
    elif (found_size := _SIZE_ASKED.search(message)) is not None:
        asked = int(float(found_size.group("number")) * _UNITS[found_size.group("unit")])
    return OutOfMemory(
        device=device_match.group("device") if device_match else None,
        allocator=allocator,
        shape=shape,
        dtype=allocation.group("dtype") if allocation else None,
        op=op.group("op") if op else None,
        message=first_line,
        framework=framework,
        asked_bytes=asked,
    )


def allocator_limit(oom: OutOfMemory, gpu_limit: int | None) -> str:
    """What caps the allocator that failed, as far as tfmem knows."""
    if oom.device and oom.device.startswith("GPU"):
        if gpu_limit is not None:
            return f"limit {format_size(gpu_limit)} (--tfmem-gpu-limit)"
        return "no tfmem limit (TensorFlow may use the whole GPU)"
    if oom.device and oom.device.startswith("CPU"):
        cap = os.environ.get(CPU_LIMIT_VARIABLE, "").strip()
        if cap.isdigit():
            return f"limit {format_size(int(cap))} ({CPU_LIMIT_VARIABLE})"
        return "no allocator limit (the machine's memory)"
    return "limit unknown"


def describe_oom(
    oom: OutOfMemory, measurement: Measurement | None, gpu_limit: int | None, trace_directory: str | None = None
) -> str:
    """The failure message: what failed where, the limit, the test's peak, the trace."""
    device = oom.device or "an unknown device"
    allocator = f"allocator {oom.allocator}" if oom.allocator else f"{oom.framework}'s allocator"
    first = f"tfmem: out of memory on {device}: {allocator} could not allocate {oom.tensor()}"
    if oom.op:
        first += f" for op {oom.op}"
    lines = [first, f"tfmem: {allocator_limit(oom, gpu_limit)}"]
    if measurement is not None:
        lines.append(f"tfmem: this test's peak before the error: {format_size(measurement.peak)} "
                     f"({describe_views(measurement)})")
    if trace_directory:
        lines.append(f"tfmem: trace: {trace_directory}")
    lines.append(f"{oom.framework}: {oom.message}")
    return "\n".join(lines)


def record_section(oom: OutOfMemory, gpu_limit: int | None) -> dict[str, Any]:
    """What the test record carries about the error (``record.extra["oom"]``)."""
    section = asdict(oom)
    section["shape"] = list(oom.shape) if oom.shape is not None else None
    section["requested_bytes"] = oom.requested_bytes
    section["limit"] = allocator_limit(oom, gpu_limit)
    return section
