"""Host memory of this process: RSS, the kernel's exact high-water mark, returning freed heap.

On Linux >= 4.0 writing ``5`` to ``/proc/self/clear_refs`` resets the peak RSS the kernel
keeps (``VmHWM``) to the current RSS, so the peak of any window can be read exactly instead
of sampled. Where that is not possible a background sampler stands in, and readings say so.
``high_water_mark`` is the one reader of that mark, for this process or another.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from collections.abc import Callable
from typing import TypeVar

import psutil

from pytest_tfmem.probes.sampler import Sampler

_CLEAR_REFS = "/proc/self/clear_refs"
_PROC_READ = 8192  # more than /proc/PID/status and statm hold
_Parsed = TypeVar("_Parsed")


class _OwnProcFile:
    """A file of ``/proc/self``, kept open and read whole with ``pread``: a reading costs one
    system call instead of three and a file object (this process's RSS is read several times a
    test, and by samplers every few milliseconds). ``/proc/self`` names the process that opened
    it, so a fork opens its own; a descriptor that user code closed is opened again."""

    def __init__(self, name: str) -> None:
        self.path = f"/proc/self/{name}"
        self._opened = (0, -1)  # (the pid it was opened in, the descriptor)

    def _descriptor(self, again: bool = False) -> int:
        pid, descriptor = self._opened
        if again or pid != os.getpid():
            # A fork's inherited descriptor is left open: its number may have been reused already.
            descriptor = os.open(self.path, os.O_RDONLY)
            self._opened = (os.getpid(), descriptor)
        return descriptor

    def read(self, parse: Callable[[bytes], _Parsed]) -> _Parsed:
        """``parse`` of the file's content; opened again once if the descriptor fails or reads
        something ``parse`` rejects (``ValueError``, ``IndexError``)."""
        try:
            return parse(os.pread(self._descriptor(), _PROC_READ, 0))
        except (OSError, ValueError, IndexError):
            return parse(os.pread(self._descriptor(again=True), _PROC_READ, 0))


_OWN_STATUS = _OwnProcFile("status")


def _fields(content: bytes, keys: tuple[bytes, ...]) -> dict[bytes, int]:
    """``/proc/PID/status`` fields given in kB (``VmRSS:``, ``VmHWM:``), in bytes; a field the
    process has no line for is left out (a zombie has no memory left to describe)."""
    if not content.startswith(b"Name:"):
        raise ValueError("not a /proc status file")
    found = {}
    for key in keys:
        start = content.find(b"\n" + key)
        if start >= 0:
            found[key] = int(content[start + len(key) + 1 :].split(None, 1)[0]) * 1024
    return found


def _status_fields(keys: tuple[bytes, ...], pid: int | str, status_file: str | None = None) -> dict[bytes, int]:
    """``_fields`` of ``/proc/PID/status`` (``status_file`` in its place, if given)."""
    if pid == "self" and status_file is None:
        return _OWN_STATUS.read(lambda content: _fields(content, keys))
    with open(status_file or f"/proc/{pid}/status", "rb") as status:
        return _fields(status.read(), keys)


def _status_bytes(key: bytes, pid: int | str, status_file: str | None = None) -> int | None:
    """One ``/proc/PID/status`` field given in kB, in bytes; ``None`` when the process has no such line."""
    return _status_fields((key,), pid, status_file).get(key)


def high_water_mark(pid: int | None = None) -> int | None:
    """A process's peak RSS since it started or last reset it (the kernel's ``VmHWM``, exact),
    in bytes: this process's, or ``pid``'s; ``None`` when there is none to read (the process
    is gone, or a zombie; no ``/proc``)."""
    try:
        return _status_bytes(b"VmHWM:", "self" if pid is None else pid)
    except (OSError, ValueError):
        return None


def resident_and_high_water_mark(pid: int) -> tuple[int, int] | None:
    """Another process's RSS and high-water mark (bytes), from one read of ``/proc/PID/status``
    (a watchdog reads both of each watched process every few milliseconds); ``None`` once it
    has ended (a zombie) or is gone."""
    try:
        fields = _status_fields((b"VmRSS:", b"VmHWM:"), pid)
    except (OSError, ValueError):
        return None
    if len(fields) < 2:
        return None
    return fields[b"VmRSS:"], fields[b"VmHWM:"]


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


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_OWN_STATM = _OwnProcFile("statm")
_HAVE_STATM = os.path.exists(_OWN_STATM.path)


def _resident_pages(content: bytes) -> int:
    return int(content.split()[1])


def current_rss() -> int:
    """Resident set size of this process in bytes: from ``/proc/self/statm`` (the cheapest
    reading; samplers call it every few milliseconds), through psutil where there is no ``/proc``."""
    if _HAVE_STATM:
        return _OWN_STATM.read(_resident_pages) * _PAGE_SIZE
    return int(psutil.Process().memory_info().rss)


def return_freed_heap() -> None:
    """Hand the heap glibc holds free back to the OS (``malloc_trim(0)``; nothing elsewhere)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def release_freed_memory(collect: Callable[[], object] = gc.collect) -> None:
    """Collect garbage (with ``collect``) and hand freed heap back to the OS (glibc ``malloc_trim(0)``).

    Without this, memory freed by an earlier test stays in glibc's arenas and a later test
    reuses it without raising RSS, so its measured peak depends on test order.
    """
    collect()
    return_freed_heap()


def swapped_bytes(status_file: str | None = None) -> int:
    """This process's memory in swap (``VmSwap``; 0 where the kernel does not say), read from
    ``status_file`` in place of ``/proc/self/status`` if given. Resident memory, and so the host
    view, does not count it."""
    try:
        return _status_bytes(b"VmSwap:", "self", status_file) or 0
    except (OSError, ValueError):
        return 0


def kernel_peak_supported() -> bool:
    """True when the kernel's high-water mark can be read and reset for this process."""
    try:
        with open(_CLEAR_REFS, "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return high_water_mark() is not None


class HostRSS:
    """A peak source over host RSS: ``current``, ``peak`` since the last ``reset_peak``.

    Exact where the kernel's high-water mark can be reset; elsewhere RSS is sampled every
    millisecond, and readings say so.
    """

    name = "host"

    def __init__(self) -> None:
        self.exact = kernel_peak_supported()
        self._sampled_peak = 0
        self._sampler: Sampler | None = None
        if not self.exact:
            self._sampler = Sampler(self._sample, 0.001, "tfmem-rss-sampler").start()

    def _sample(self) -> None:
        self._sampled_peak = max(self._sampled_peak, current_rss())

    def current(self) -> int:
        return current_rss()

    def peak(self) -> int:
        if self.exact:
            return high_water_mark() or 0  # exact: the kernel keeps this process's mark
        return max(self._sampled_peak, current_rss())

    def reset_peak(self) -> None:
        if self.exact:
            with open(_CLEAR_REFS, "w") as clear_refs:
                clear_refs.write("5")
        else:
            self._sampled_peak = 0
