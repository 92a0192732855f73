"""GPU memory as the driver sees it, through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Framework-neutral: it reads the same numbers for TensorFlow, PyTorch or CuPy. Per GPU it
reads the memory this process holds (its entry in the device's running-process lists,
matched by pid) and the device's total and used memory. NVML keeps no per-process peak, so a
source's peak is the highest reading taken: at the edges of each window and, while an
``NvmlSampler`` runs, every few milliseconds in between.

NVML numbers its GPUs by physical index, whatever ``CUDA_VISIBLE_DEVICES`` says, so
``nvml:1`` can be TensorFlow's ``GPU:0``.

This module needs neither pytest nor the rest of the package (``scripts/gpu_check.py`` loads
it with ``sampler`` alone, as the package ``probes``); the ``pynvml`` module can be passed in,
which is how tests use a fake one.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .sampler import Sampler  # relative: loaded without the package by scripts/gpu_check.py

# pytest-tfmem is on no index: the package itself (``extras.install_hint``, which this module, loaded
# without the package by scripts/gpu_check.py, cannot import)
INSTALL_HINT = "pip install nvidia-ml-py"


@dataclass(frozen=True)
class DeviceMemory:
    """One GPU's memory in bytes, all processes together."""

    index: int
    name: str
    total: int
    used: int


class Nvml:
    """An open NVML session. ``Nvml.open()`` returns one, or the reason there is none."""

    def __init__(self, pynvml: Any, handles: list[Any], pid: int) -> None:
        self._nvml = pynvml
        self._handles = handles
        self.pid = pid
        self.error: type[Exception] = pynvml.NVMLError

    @classmethod
    def open(cls, pynvml: Any = None, pid: int | None = None) -> tuple[Nvml | None, str]:
        """``(session, "")``, or ``(None, one-line reason)`` without NVML, a driver or a GPU.

        Never raises: a machine without a GPU is a normal place to run tests.
        """
        if pynvml is None:
            try:
                pynvml = importlib.import_module("pynvml")
            except ImportError:
                return None, f"nvidia-ml-py is not installed ({INSTALL_HINT})"
        try:
            pynvml.nvmlInit()
        except (pynvml.NVMLError, OSError) as error:
            return None, f"NVML could not start: {describe_error(error)}"
        try:
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
        except pynvml.NVMLError as error:
            _shutdown(pynvml)
            return None, f"NVML could not list the GPUs: {describe_error(error)}"
        if not handles:
            _shutdown(pynvml)
            return None, "NVML sees no GPU"
        return cls(pynvml, handles, os.getpid() if pid is None else pid), ""

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def process_memory(self, index: int) -> int | None:
        """Bytes this process holds on GPU ``index``: 0 when NVML does not list it there,
        ``None`` when NVML lists it without an amount (``usedGpuMemory`` unavailable).

        Raises ``self.error`` (``pynvml.NVMLError``) when NVML fails.
        """
        handle = self._handles[index]
        amounts: list[int] = []
        unknown = False
        for list_processes in (
            self._nvml.nvmlDeviceGetComputeRunningProcesses,
            self._nvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            try:
                processes = list_processes(handle)
            except self._nvml.NVMLError_NotSupported:  # e.g. graphics lists on compute-only GPUs
                continue
            mine = [process for process in processes if process.pid == self.pid]
            if any(process.usedGpuMemory is None for process in mine):
                unknown = True
                continue
            # Several entries of one list are several GPU instances (MIG): add them up. A
            # process doing compute and graphics appears in both lists with the same memory.
            amounts.append(sum(int(process.usedGpuMemory) for process in mine))
        if unknown and not any(amounts):
            return None
        return max(amounts, default=0)

    def devices(self) -> list[DeviceMemory]:
        """Name, total and used memory of every GPU. Raises ``self.error`` when NVML fails."""
        devices = []
        for index, handle in enumerate(self._handles):
            info = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            name = self._nvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode(errors="replace")
            devices.append(DeviceMemory(index, str(name), int(info.total), int(info.used)))
        return devices

    def close(self) -> None:
        _shutdown(self._nvml)


def _shutdown(pynvml: Any) -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass


def describe_error(error: BaseException) -> str:
    """``NVML Shared Library Not Found (NVMLError_LibraryNotFound)``."""
    try:
        text = str(error)
    except Exception:  # pynvml looks the text up in the library, which may be what is missing
        text = ""
    name = type(error).__name__
    return f"{text} ({name})" if text and text != name else name


class GpuProcessMemory:
    """A peak source: the memory this process holds on one GPU, as NVML reads it.

    ``problem`` says why a reading could not be taken (NVML gave no amount, or failed); the
    source then repeats its last reading rather than stopping the measurement.
    """

    def __init__(self, nvml: Nvml, index: int) -> None:
        self._nvml = nvml
        self.index = index
        self.name = f"nvml:{index}"
        self.problem = ""
        # NVML keeps no peak: seconds between background readings (0: read at window edges only)
        self.sampled_every_s = 0.0
        self._lock = threading.Lock()
        self._last = 0
        self._peak = 0
        self._window = 0  # which window a reading belongs to: one taken before a reset is not the new window's

    def read(self) -> int:
        """Take a reading, fold it into the peak, return it (the sampler calls this too)."""
        window = self._window
        try:
            value = self._nvml.process_memory(self.index)
        except self._nvml.error as error:
            self.problem = f"NVML failed on GPU {self.index}: {describe_error(error)}"
            value = None
        else:
            if value is None:
                self.problem = (
                    f"NVML lists this process on GPU {self.index} without its memory (usedGpuMemory "
                    "unavailable, e.g. Windows WDDM or missing permissions)"
                )
        with self._lock:
            if window != self._window:
                return self._last
            if value is not None:
                self._last = value
            self._peak = max(self._peak, self._last)
            return self._last

    def current(self) -> int:
        return self.read()

    def peak(self) -> int:
        self.read()
        return self._peak

    def reset_peak(self) -> None:
        reading = self.read()
        with self._lock:
            self._window += 1
            self._peak = reading


def process_sources(nvml: Nvml) -> list[GpuProcessMemory]:
    """One source per GPU NVML can see."""
    return [GpuProcessMemory(nvml, index) for index in range(nvml.device_count)]


class NvmlSampler(Sampler):
    """Reads GPU sources every ``interval_s`` in the background, so a short peak between two
    window edges is seen (down to the interval; NVML itself keeps no peak)."""

    def __init__(self, sources: Sequence[GpuProcessMemory], interval_s: float) -> None:
        self.sources = list(sources)
        super().__init__(self._read_all, interval_s, "tfmem-nvml-sampler")

    def _read_all(self) -> None:
        for source in self.sources:
            source.read()
