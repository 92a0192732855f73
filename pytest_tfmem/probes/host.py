"""Host memory of this process: RSS, the kernel's exact high-water mark, returning freed heap.

On Linux >= 4.0 writing ``5`` to ``/proc/self/clear_refs`` resets the peak RSS the kernel
keeps (``VmHWM``) to the current RSS, so the peak of any window can be read exactly instead
of sampled. Where that is not possible a background sampler stands in, and readings say so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _read_status_kib(*keys: str, status: str = _STATUS) -> dict[str, int]:
    values: dict[str, int] = {}
    with open(status, "rb") as lines:
        for line in lines:
            key, _, rest = line.partition(b":")
            name = key.decode()
            if name in keys:
                values[name] = int(rest.split()[0]) * 1024
    return values


def _load_malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _load_malloc_trim()


def current_rss() -> int:
    """Resident set size of this process in bytes."""
    return psutil.Process().memory_info().rss


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's RSS from ``/proc/self/statm``: the cheapest reading, for samplers."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE_SIZE


def release_freed_memory(collect: Callable[[], object] = gc.collect) -> int:
    """Collect garbage (with ``collect``) and hand freed heap back to the OS (glibc ``malloc_trim(0)``).

    Without this, memory freed by an earlier test stays in glibc's arenas and a later test
    reuses it without raising RSS, so its measured peak depends on test order.
    Returns the bytes of RSS given back.
    """
    before = current_rss()
    collect()
    if _malloc_trim is not None:
        _malloc_trim(0)
    return max(0, before - current_rss())


def swapped_bytes(status: str = _STATUS) -> int:
    """This process's memory in swap (``VmSwap``; 0 where the kernel does not say). Resident
    memory, and so the host view, does not count it."""
    try:
        return _read_status_kib("VmSwap", status=status).get("VmSwap", 0)
    except OSError:
        return 0


def kernel_peak_supported() -> bool:
    """True when the kernel's high-water mark can be read and reset for this process."""
    try:
        with open(_CLEAR_REFS, "w") as clear_refs:
            clear_refs.write("5")
        return "VmHWM" in _read_status_kib("VmHWM")
    except OSError:
        return False


class HostRSS:
    """A peak source over host RSS: ``current``, ``peak`` since the last ``reset_peak``."""

    name = "host"

    def __init__(self) -> None:
        self.exact = kernel_peak_supported()
        self._sampler: RssSampler | None = None
        if not self.exact:
            self._sampler = RssSampler(interval_s=0.001)
            self._sampler.start()

    def current(self) -> int:
        if self.exact:
            return _read_status_kib("VmRSS")["VmRSS"]
        return current_rss()

    def peak(self) -> int:
        if self.exact:
            return _read_status_kib("VmHWM")["VmHWM"]
        assert self._sampler is not None
        return max(self._sampler.max_rss, current_rss())

    def reset_peak(self) -> None:
        if self.exact:
            with open(_CLEAR_REFS, "w") as clear_refs:
                clear_refs.write("5")
        else:
            assert self._sampler is not None
            self._sampler.reset_max()


@dataclass
class RssSampler:
    """Background thread reading the RSS of a process (and, optionally, its children).

    Used for timelines and watchdogs; the exact per-test peak comes from the kernel instead.
    """

    interval_s: float = 0.05
    pid: int = field(default_factory=os.getpid)
    include_children: bool = False
    keep_timeline: bool = False
    max_rss: int = 0
    last_rss: int = 0
    timeline: list[tuple[float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._process = psutil.Process(self.pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfmem-rss-sampler", daemon=True)
        self._t0 = time.monotonic()

    def read(self) -> int:
        rss = self._process.memory_info().rss
        if self.include_children:
            for child in self._process.children(recursive=True):
                try:
                    rss += child.memory_info().rss
                except psutil.Error:
                    pass
        return rss

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rss = self.read()
            except psutil.Error:
                return
            self.last_rss = rss
            self.max_rss = max(self.max_rss, rss)
            if self.keep_timeline:
                self.timeline.append((time.monotonic() - self._t0, rss))
            self._stop.wait(self.interval_s)

    def reset_max(self) -> None:
        self.max_rss = 0

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
