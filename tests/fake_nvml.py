"""A stand-in for ``pynvml`` (nvidia-ml-py) on machines without a GPU.

``FakeNvml`` has the names of ``pynvml`` that pytest-tfmem uses, with the same call shapes:
handles from ``nvmlDeviceGetHandleByIndex``, memory info with ``total``/``free``/``used``,
process entries with ``pid``/``usedGpuMemory`` (``None`` when the driver does not say), and
the ``NVMLError`` hierarchy (subclasses built without arguments, ``str()`` the driver's text).
``test_gpu_nvml.py`` checks that every name also exists in the real ``pynvml``.

Test-only helpers (``hold``, ``release``, ``fail_next``) change what the "driver" reports.
A generated ``pynvml.py`` exposes one instance as a module for a pytest run in a subprocess:

    from fake_nvml import FakeNvml, FakeGpu
    _fake = FakeNvml([FakeGpu("Fake H100", 80 * 2**30)])
    def __getattr__(name):
        return getattr(_fake, name)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace


class NVMLError(Exception):
    value = 999
    text = "Unknown Error"

    def __str__(self) -> str:
        return self.text


class NVMLError_Uninitialized(NVMLError):
    value, text = 1, "Uninitialized"


class NVMLError_NotSupported(NVMLError):
    value, text = 3, "Not Supported"


class NVMLError_NoPermission(NVMLError):
    value, text = 4, "Insufficient Permissions"


class NVMLError_DriverNotLoaded(NVMLError):
    value, text = 9, "Driver Not Loaded"


class NVMLError_LibraryNotFound(NVMLError):
    value, text = 12, "NVML Shared Library Not Found"


class NVMLError_GpuIsLost(NVMLError):
    value, text = 15, "GPU is lost"


@dataclass
class FakeGpu:
    """One GPU: its name, total memory, memory of other processes, and per-pid usage."""

    name: str
    total: int
    other_used: int = 0
    processes: dict[int, int | None] = field(default_factory=dict)  # pid -> bytes (None: not reported)
    graphics_supported: bool = True


class FakeNvml:
    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost

    def __init__(self, gpus: list[FakeGpu], init_error: type[NVMLError] | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = 0  # nvmlInit calls not yet shut down
        self.calls = 0  # process-list calls, to see the sampler work
        self._fail_next: list[type[NVMLError]] = []

    # -- the pynvml interface -------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._require_init()
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._require_init()
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        self._require_init()
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        self._require_init()
        used = handle.other_used + sum(v or 0 for v in handle.processes.values())
        return SimpleNamespace(total=handle.total, free=handle.total - used, used=used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        self._require_init()
        self.calls += 1
        if self._fail_next:
            raise self._fail_next.pop(0)()
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in handle.processes.items()]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        self._require_init()
        if not handle.graphics_supported:
            raise NVMLError_NotSupported()
        return []

    # -- test helpers ---------------------------------------------------------------------
    def hold(self, index: int, pid: int, nbytes: int | None) -> None:
        """Make the driver report ``nbytes`` held by ``pid`` on GPU ``index``."""
        self.gpus[index].processes[pid] = nbytes

    def take(self, index: int, pid: int, nbytes: int) -> None:
        """``pid`` takes ``nbytes`` more on GPU ``index`` (a tensor kept alive: a second run keeps another)."""
        self.gpus[index].processes[pid] = (self.gpus[index].processes.get(pid) or 0) + nbytes

    def release(self, index: int, pid: int) -> None:
        self.gpus[index].processes.pop(pid, None)

    def fail_next(self, error: type[NVMLError]) -> None:
        """The next process-list call raises ``error``."""
        self._fail_next.append(error)

    def _require_init(self) -> None:
        if self.initialised < 1:
            raise NVMLError_Uninitialized()
