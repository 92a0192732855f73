"""macOS: the physical footprint (what Activity Monitor's Memory column and Xcode show) and its
marks, read with ``proc_pid_rusage`` through ``ctypes``; nothing compiled.

``proc_pid_rusage(pid, RUSAGE_INFO_V4, &info)`` fills ``struct rusage_info_v4`` (296 bytes: a
16-byte uuid, then 35 ``uint64_t``; xnu ``bsd/sys/resource.h``). Of it this module reads
``ri_phys_footprint`` (the size now), ``ri_interval_max_phys_footprint`` (the peak since the
last ``proc_reset_footprint_interval(pid)``: exact and resettable, macOS >= 10.14) and
``ri_lifetime_max_phys_footprint`` (the process's peak since it started: where the reset is
missing, exact for a window that raised it). The reset is declared only in xnu's private
``libproc_internal.h``, so it is looked up at run time; a process may reset its own mark.
On Apple silicon the footprint includes Metal (GPU) allocations. ``wait4``'s ``ru_maxrss`` is
in bytes here (KiB on Linux).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from .base import EXACT, EXACT_IF_RAISED, PHYS_FOOTPRINT, Missing
from .portable import descendants_from_parents
from .posix import Posix

LIBSYSTEM = "/usr/lib/libSystem.B.dylib"
RUSAGE_INFO_V4 = 4
_CHILDREN_AT_ONCE = 4096  # pids read per ``proc_listchildpids`` call


class RusageInfoV4(ctypes.Structure):
    """``struct rusage_info_v4``, field for field (xnu ``bsd/sys/resource.h``)."""

    _fields_ = [
        ("ri_uuid", ctypes.c_uint8 * 16),
        *(
            (name, ctypes.c_uint64)
            for name in (
                "ri_user_time", "ri_system_time", "ri_pkg_idle_wkups", "ri_interrupt_wkups", "ri_pageins",
                "ri_wired_size", "ri_resident_size", "ri_phys_footprint", "ri_proc_start_abstime",
                "ri_proc_exit_abstime", "ri_child_user_time", "ri_child_system_time", "ri_child_pkg_idle_wkups",
                "ri_child_interrupt_wkups", "ri_child_pageins", "ri_child_elapsed_abstime", "ri_diskio_bytesread",
                "ri_diskio_byteswritten", "ri_cpu_time_qos_default", "ri_cpu_time_qos_maintenance",
                "ri_cpu_time_qos_background", "ri_cpu_time_qos_utility", "ri_cpu_time_qos_legacy",
                "ri_cpu_time_qos_user_initiated", "ri_cpu_time_qos_user_interactive", "ri_billed_system_time",
                "ri_serviced_system_time", "ri_logical_writes", "ri_lifetime_max_phys_footprint", "ri_instructions",
                "ri_cycles", "ri_billed_energy", "ri_serviced_energy", "ri_interval_max_phys_footprint",
                "ri_runnable_time",
            )
        ),
    ]


def load_libproc() -> Any:
    """libSystem, with the argument types of the calls this module makes declared."""
    library = ctypes.CDLL(LIBSYSTEM, use_errno=True)
    library.proc_pid_rusage.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(RusageInfoV4)]
    library.proc_pid_rusage.restype = ctypes.c_int
    library.proc_listchildpids.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    library.proc_listchildpids.restype = ctypes.c_int
    reset = getattr(library, "proc_reset_footprint_interval", None)  # macOS >= 10.14
    if reset is not None:
        reset.argtypes = [ctypes.c_int]
        reset.restype = ctypes.c_int
    relief = getattr(library, "malloc_zone_pressure_relief", None)
    if relief is not None:
        relief.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        relief.restype = ctypes.c_size_t
    return library


class ChildPidTable:
    """Descendants through ``proc_listchildpids``: each process's children, level by level."""

    def __init__(self, platform: MacOS) -> None:
        self.platform = platform

    def descendants(self, root: int) -> dict[int, int]:
        parents: dict[int, int] = {}
        pending = [root]
        while pending:
            parent = pending.pop()
            for child in self.platform.children_of(parent):
                if child not in parents:
                    parents[child] = parent
                    pending.append(child)
        return descendants_from_parents(root, parents)


class MacOS(Posix):
    """The footprint's marks through libproc; forks are not used (see ``fork_missing``)."""

    name = "macOS"
    counts = PHYS_FOOTPRINT
    child_marks = EXACT
    marks_named = "each process's lifetime footprint mark"
    maxrss_unit = 1

    def __init__(self, libproc: Any = None) -> None:
        super().__init__()
        self._library = libproc

    @property
    def libproc(self) -> Any:
        if self._library is None:
            self._library = load_libproc()
        return self._library

    @property
    def resettable(self) -> bool:
        return getattr(self.libproc, "proc_reset_footprint_interval", None) is not None

    def rusage(self, pid: int) -> RusageInfoV4 | None:
        """``proc_pid_rusage(pid, RUSAGE_INFO_V4)``; ``None`` where it fails (the process is gone).
        A structure of its own each call: samplers read this process from their own threads."""
        info = RusageInfoV4()
        if self.libproc.proc_pid_rusage(pid, RUSAGE_INFO_V4, ctypes.byref(info)) != 0:
            return None
        return info

    def children_of(self, pid: int) -> list[int]:
        buffer = (ctypes.c_int * _CHILDREN_AT_ONCE)()
        count = self.libproc.proc_listchildpids(pid, buffer, ctypes.sizeof(buffer))
        return [child for child in buffer[: max(0, min(count, _CHILDREN_AT_ONCE))] if child > 0]

    # -- this process

    def _own(self) -> RusageInfoV4:
        info = self.rusage(os.getpid())
        if info is None:  # this process is not gone: only a broken libproc fails here
            raise OSError(ctypes.get_errno(), "proc_pid_rusage failed for this process")
        return info

    def current_size(self) -> int:
        return int(self._own().ri_phys_footprint)

    def peak_method(self) -> str:
        return EXACT if self.resettable else EXACT_IF_RAISED

    def peak_mark(self) -> int | None:
        info = self._own()
        return int(info.ri_interval_max_phys_footprint if self.resettable else info.ri_lifetime_max_phys_footprint)

    def reset_peak_mark(self) -> None:
        if self.resettable:
            self.libproc.proc_reset_footprint_interval(os.getpid())

    def release_freed_heap(self) -> None:
        relief = getattr(self.libproc, "malloc_zone_pressure_relief", None)
        if relief is not None:
            relief(None, 0)  # every zone, as much as it can

    def release_action(self) -> str | None:
        if getattr(self.libproc, "malloc_zone_pressure_relief", None) is None:
            return None
        return "malloc_zone_pressure_relief(NULL, 0)"

    # -- other processes

    def memory_of(self, pid: int) -> tuple[int, int] | None:
        info = self.rusage(pid)
        if info is None or info.ri_proc_exit_abstime:  # gone, or ended (a zombie)
            return None
        return int(info.ri_phys_footprint), int(info.ri_lifetime_max_phys_footprint)

    def process_table(self) -> ChildPidTable:
        return ChildPidTable(self)

    def has_children(self) -> bool:
        if hasattr(os, "waitid"):  # Python >= 3.13
            return super().has_children()
        return bool(self.children_of(os.getpid()))

    # -- starting processes

    def fork_missing(self) -> str | None:
        return (
            "on macOS a fork of a process that loaded system frameworks is not safe (Python's "
            "multiprocessing spawns there too)"
        )

    def die_with_parent(self, parent_pid: int) -> None:
        super(Posix, self).die_with_parent(parent_pid)  # no PR_SET_PDEATHSIG: the parent is watched

    # -- the machine

    def cpu_model(self) -> str:
        size = ctypes.c_size_t(256)
        buffer = ctypes.create_string_buffer(size.value)
        name = b"machdep.cpu.brand_string"
        if self.libproc.sysctlbyname(name, buffer, ctypes.byref(size), None, 0) == 0:
            return buffer.value.decode(errors="replace")
        return super().cpu_model()

    def missing(self) -> list[Missing]:
        found = [
            Missing("isolation by fork", f"{self.fork_missing()}; isolated tests start a fresh interpreter"),
            Missing("OOM-kill counts", "macOS keeps no count of the kills its memory pressure (jetsam) makes"),
        ]
        if not self.resettable:
            found.insert(0, Missing(
                "a resettable peak", "proc_reset_footprint_interval is missing (macOS < 10.14): a test's peak is "
                "exact when it raised the process's lifetime footprint mark, sampled otherwise"))
        return found

    def describe(self) -> str:
        if self.resettable:
            return "exact peaks from the footprint's interval mark (phys_footprint), reset per test"
        return ("peaks from the process's lifetime footprint mark (phys_footprint) where a test raised it, "
                "sampled every millisecond otherwise")
