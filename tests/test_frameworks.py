"""The frameworks behind one protocol: which backend a session uses, which frameworks tfmem starts,
and the device views of JAX and PyTorch on GPUs. This machine has no GPU: the devices are small
fakes with the shape of JAX's ``Device.memory_stats()`` and ``torch.cuda``'s statistics."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_tfmem import frameworks
from pytest_tfmem.core.measure import Measurement, PeakTracker, ViewReading
from pytest_tfmem.core.oom import parse_oom
from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.core.summary import summary_rows
from pytest_tfmem.core.verdict import view_label
from pytest_tfmem.frameworks.jax import JaxDevice
from pytest_tfmem.frameworks.torch import CudaAllocator

MIB = 2**20


class FakeJaxGpu:
    """``jax.Device`` as far as ``JaxDevice`` reads it: a level and a lifetime peak."""

    platform = "gpu"
    id = 0

    def __init__(self) -> None:
        self.in_use = 0
        self.lifetime_peak = 0

    def hold(self, size: int) -> None:
        self.in_use += size
        self.lifetime_peak = max(self.lifetime_peak, self.in_use)

    def memory_stats(self) -> dict[str, int]:
        return {"bytes_in_use": self.in_use, "peak_bytes_in_use": self.lifetime_peak, "bytes_limit": 80 * 2**30}


class FakeCuda:
    """``torch.cuda``'s statistics for one device: allocated, its peak, and the reset."""

    def __init__(self) -> None:
        self.allocated = 0
        self.max_allocated = 0

    def hold(self, size: int) -> None:
        self.allocated += size
        self.max_allocated = max(self.max_allocated, self.allocated)

    def memory_allocated(self, index: int) -> int:
        return self.allocated

    def max_memory_allocated(self, index: int) -> int:
        return self.max_allocated

    def reset_peak_memory_stats(self, index: int) -> None:
        self.max_allocated = self.allocated


def window(tracker: PeakTracker, work: Callable[[], object]) -> int:
    opened = tracker.open()
    work()
    return tracker.close(opened).increase


def test_a_jax_window_that_raises_the_lifetime_peak_reads_it_exactly():
    device = FakeJaxGpu()
    tracker = PeakTracker(JaxDevice(device))
    assert tracker.source.name == "jax:gpu:0"

    def burst() -> None:
        device.hold(300 * MIB)
        device.hold(-300 * MIB)

    assert window(tracker, burst) == 300 * MIB


def test_a_jax_window_under_an_earlier_peak_reads_its_levels_a_lower_bound():
    """JAX's peak cannot be reset: after a 300 MiB test, a 100 MiB burst that is freed again is
    not seen; what the window kept is."""
    device = FakeJaxGpu()
    tracker = PeakTracker(JaxDevice(device))
    window(tracker, lambda: (device.hold(300 * MIB), device.hold(-300 * MIB)))
    assert window(tracker, lambda: (device.hold(100 * MIB), device.hold(-100 * MIB))) == 0
    assert window(tracker, lambda: device.hold(50 * MIB)) == 50 * MIB


def test_a_cuda_window_is_exact_after_the_reset():
    cuda = FakeCuda()
    tracker = PeakTracker(CudaAllocator(cuda, 0))
    window(tracker, lambda: (cuda.hold(3 * 2**30), cuda.hold(-3 * 2**30)))
    assert window(tracker, lambda: (cuda.hold(2**30), cuda.hold(-2**30))) == 2**30


def test_jax_and_pytorch_gpu_views_carry_gpu_budgets_and_are_labelled():
    views = (ViewReading("host", 0, MIB, MIB), ViewReading("jax:gpu:0", 0, 2**30, 0),
             ViewReading("torch:cuda:1", 0, 2 * 2**30, 0), ViewReading("nvml:0", 0, 4 * 2**30, 0))  # fmt: skip
    measurement = Measurement(views, 0.1)
    assert [v.view for v in measurement.gpu_views()] == ["jax:gpu:0", "torch:cuda:1"]  # NVML only without them
    assert measurement.gpu == 2 * 2**30 and measurement.peak == MIB  # GPU views never count as host
    assert [view_label(v.view) for v in views] == [
        "host RSS", "JAX gpu:0 device", "PyTorch cuda:1 allocator", "GPU 0 (NVML)"
    ]
    assert not frameworks.is_gpu_view("jax:cpu:0") and frameworks.is_gpu_view("tf:GPU:0")


def test_the_keras_backend_is_read_as_keras_reads_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.delitem(sys.modules, "keras.src.backend.config", raising=False)
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert frameworks.keras_backend() == ("tensorflow", "Keras's default")
    configured = tmp_path / "configured"
    configured.mkdir()
    (configured / "keras.json").write_text(json.dumps({"backend": "torch"}))
    monkeypatch.setenv("KERAS_HOME", str(configured))
    assert frameworks.keras_backend() == ("torch", str(configured / "keras.json"))
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    assert frameworks.keras_backend() == ("jax", "KERAS_BACKEND")
    loaded = types.ModuleType("keras.src.backend.config")
    loaded._BACKEND = "tensorflow"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "keras.src.backend.config", loaded)
    assert frameworks.keras_backend() == ("tensorflow", "the loaded Keras")


def test_a_framework_another_library_loaded_is_not_started(monkeypatch: pytest.MonkeyPatch):
    """TensorFlow Lite imports JAX where it is installed: JAX is in use only as Keras's backend,
    named by the test module, or imported by a test itself."""
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.delitem(sys.modules, "keras.src.backend.config", raising=False)
    jax = next(framework for framework in frameworks.KNOWN if framework.module == "jax")
    numpy_module = types.ModuleType("jax.numpy")

    def jitted() -> None: ...

    jitted.__module__ = "jax._src.api"
    assert not frameworks.in_use(jax, frameworks.named_modules({"np": types.ModuleType("numpy")}))
    assert frameworks.in_use(jax, frameworks.named_modules({"jnp": numpy_module}))
    assert frameworks.in_use(jax, frameworks.named_modules({"jit": jitted}))
    assert frameworks.in_use(jax, {"jax"})  # a test's own ``import jax``
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    assert frameworks.in_use(jax, set())


def test_jax_and_pytorch_out_of_memory_messages_give_the_size_asked_for():
    torch = parse_oom("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB", "PyTorch")
    assert (torch.requested_bytes, torch.tensor(), torch.framework) == (2 * 2**30, "2.0 GiB", "PyTorch")
    jax = parse_oom("RESOURCE_EXHAUSTED: Out of memory allocating 1073741824 bytes.", "JAX")
    assert jax.requested_bytes == 2**30 and jax.message == "RESOURCE_EXHAUSTED: Out of memory allocating 1073741824 bytes."


def _record_with_views(nodeid: str, views: dict[str, int]) -> TestRecord:
    readings = (ViewReading("host", 0, 5 * MIB, 0), *(ViewReading(name, 0, peak, 0) for name, peak in views.items()))
    record = TestRecord(nodeid, Measurement(views=readings, duration_s=0.01))
    record.outcome = "passed"
    return record


def test_the_table_has_a_column_for_each_framework_view_a_test_has_titled_with_its_framework():
    records = [
        _record_with_views("t::jax_gpu", {"jax:gpu:0": 300 * MIB}),
        _record_with_views("t::torch", {"torch:cuda:0": 200 * MIB}),
        _record_with_views("t::tf", {"tf:GPU:0": 100 * MIB, "tf:CPU:0": 2 * MIB}),
        _record_with_views("t::plain", {}),
    ]
    header, *rows = summary_rows(records, 10)
    assert header == ["test", "peak", "host RSS", "TF CPU", "TF GPU:0", "JAX gpu:0", "torch cuda:0", "budget", "use",
                      "result"]
    cells = {row[0]: row[3:7] for row in rows}
    assert cells["t::jax_gpu"] == ["-", "-", "300.0 MiB", "-"]  # a view the test has not: "-"
    assert cells["t::tf"] == ["2.0 MiB", "100.0 MiB", "-", "-"]
    # a session of JAX or PyTorch alone shows no TensorFlow column, and one of no framework none at all
    assert summary_rows(records[:1], 10)[0][:4] == ["test", "peak", "host RSS", "JAX gpu:0"]
    assert summary_rows(records[3:], 10)[0] == ["test", "peak", "host RSS", "budget", "use", "result"]
