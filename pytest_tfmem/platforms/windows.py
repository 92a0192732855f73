"""Windows: the working set and its lifetime peak (``GetProcessMemoryInfo``, through psutil), the
process tree through a Job Object, TerminateProcess, and ``msvcrt`` file locks.

Windows keeps no resettable peak: ``PeakWorkingSetSize`` is the process's peak since it started.
A window that raised it reads it exactly; for the rest a sampler runs beside it (``probes.host``).
Another process's ``PeakWorkingSetSize`` is its own peak (nothing is inherited: there is no fork),
exact for a process a test started.

The tree: this process joins a Job Object of its own at the first question about its children
(``CreateJobObjectW``, ``AssignProcessToJobObject``; jobs nest since Windows 8), and every process
it starts afterwards joins it too, so its members (``JobObjectBasicProcessIdList``) are the tree
and its count of active processes (``JobObjectBasicAccountingInformation``) tells whether there are
children, without listing the machine's processes. Its commit peaks
(``JobObjectExtendedLimitInformation``: ``PeakProcessMemoryUsed``, ``PeakJobMemoryUsed``) are read
by ``job_memory``. Where no job can be made, processes are listed by scanning, and the session
header says why.
"""

from __future__ import annotations

import ctypes
import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from .base import EXACT, EXACT_IF_RAISED, WORKING_SET, Ending, Missing, ProcessTable
from .locks import msvcrt_lock
from .portable import Portable, ScannedTable, descendants_from_parents, psutil

# Information classes of QueryInformationJobObject.
JOB_BASIC_ACCOUNTING = 1
JOB_PROCESS_ID_LIST = 3
JOB_EXTENDED_LIMIT = 9
_LISTED_AT_ONCE = 4096  # process ids read per JobObjectBasicProcessIdList query
# The exit code ``kill`` ends a process with (``os.kill`` on Windows calls TerminateProcess with
# the number given): the shell's code for a process killed by SIGKILL.
KILLED_EXIT_CODE = 137

# How a process that crashed ends on Windows: its exit code is an NTSTATUS.
EXIT_STATUSES = {
    0xC0000005: "access violation: invalid memory access in native code",
    0xC0000017: "out of memory (STATUS_NO_MEMORY)",
    0xC000001D: "illegal instruction",
    0xC00000FD: "stack overflow",
    0xC0000409: "a native library stopped the process (stack buffer overrun or fail-fast, as abort() does)",
    KILLED_EXIT_CODE: "killed by pytest-tfmem (TerminateProcess)",
}

DWORD = ctypes.c_uint32
LARGE_INTEGER = ctypes.c_int64
SIZE_T = ctypes.c_size_t


class JobBasicLimits(ctypes.Structure):
    """``JOBOBJECT_BASIC_LIMIT_INFORMATION``."""

    _fields_ = [
        ("PerProcessUserTimeLimit", LARGE_INTEGER),
        ("PerJobUserTimeLimit", LARGE_INTEGER),
        ("LimitFlags", DWORD),
        ("MinimumWorkingSetSize", SIZE_T),
        ("MaximumWorkingSetSize", SIZE_T),
        ("ActiveProcessLimit", DWORD),
        ("Affinity", SIZE_T),  # ULONG_PTR
        ("PriorityClass", DWORD),
        ("SchedulingClass", DWORD),
    ]


class IoCounters(ctypes.Structure):
    """``IO_COUNTERS``."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("ReadOperationCount", "WriteOperationCount", "OtherOperationCount", "ReadTransferCount",
                     "WriteTransferCount", "OtherTransferCount")
    ]


class JobExtendedLimits(ctypes.Structure):
    """``JOBOBJECT_EXTENDED_LIMIT_INFORMATION``: the job's and its processes' commit peaks."""

    _fields_ = [
        ("BasicLimitInformation", JobBasicLimits),
        ("IoInfo", IoCounters),
        ("ProcessMemoryLimit", SIZE_T),
        ("JobMemoryLimit", SIZE_T),
        ("PeakProcessMemoryUsed", SIZE_T),
        ("PeakJobMemoryUsed", SIZE_T),
    ]


class JobAccounting(ctypes.Structure):
    """``JOBOBJECT_BASIC_ACCOUNTING_INFORMATION``."""

    _fields_ = [
        ("TotalUserTime", LARGE_INTEGER),
        ("TotalKernelTime", LARGE_INTEGER),
        ("ThisPeriodTotalUserTime", LARGE_INTEGER),
        ("ThisPeriodTotalKernelTime", LARGE_INTEGER),
        ("TotalPageFaultCount", DWORD),
        ("TotalProcesses", DWORD),
        ("ActiveProcesses", DWORD),
        ("TotalTerminatedProcesses", DWORD),
    ]


class JobProcessIds(ctypes.Structure):
    """``JOBOBJECT_BASIC_PROCESS_ID_LIST`` with room for ``_LISTED_AT_ONCE`` ids."""

    _fields_ = [
        ("NumberOfAssignedProcesses", DWORD),
        ("NumberOfProcessIdsInList", DWORD),
        ("ProcessIdList", SIZE_T * _LISTED_AT_ONCE),  # ULONG_PTR
    ]


def _last_error() -> int:
    """The error of the last kernel32 call made with ``use_last_error`` (Windows only)."""
    return int(getattr(ctypes, "get_last_error", lambda: 0)())


def load_kernel32() -> Any:
    """kernel32, with the argument types of the calls this module makes declared."""
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    kernel32.CreateJobObjectW.argtypes = [ctypes.c_void_p, ctypes.c_wchar_p]
    kernel32.CreateJobObjectW.restype = ctypes.c_void_p
    kernel32.AssignProcessToJobObject.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    kernel32.AssignProcessToJobObject.restype = ctypes.c_int
    kernel32.GetCurrentProcess.restype = ctypes.c_void_p
    kernel32.QueryInformationJobObject.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, DWORD, ctypes.POINTER(DWORD)
    ]
    kernel32.QueryInformationJobObject.restype = ctypes.c_int
    return kernel32


class Job:
    """A Job Object this process belongs to (with every process it starts from now on)."""

    def __init__(self, kernel32: Any, handle: int) -> None:
        self.kernel32 = kernel32
        self.handle = handle

    @classmethod
    def join_new(cls, kernel32: Any) -> Job:
        """Make a job and put this process in it; ``OSError`` naming the call that failed."""
        handle = kernel32.CreateJobObjectW(None, None)
        if not handle:
            raise OSError(f"CreateJobObjectW failed (error {_last_error()})")
        if not kernel32.AssignProcessToJobObject(handle, kernel32.GetCurrentProcess()):
            raise OSError(f"AssignProcessToJobObject failed (error {_last_error()}): this process "
                          "is in a job that allows no job below it (Windows < 8)")
        return cls(kernel32, handle)

    def _query(self, information_class: int, structure: ctypes.Structure) -> None:
        if not self.kernel32.QueryInformationJobObject(
            self.handle, information_class, ctypes.byref(structure), ctypes.sizeof(structure), None
        ):
            raise OSError(f"QueryInformationJobObject({information_class}) failed (error {_last_error()})")

    def active_processes(self) -> int:
        accounting = JobAccounting()
        self._query(JOB_BASIC_ACCOUNTING, accounting)
        return int(accounting.ActiveProcesses)

    def members(self) -> list[int]:
        listed = JobProcessIds()
        self._query(JOB_PROCESS_ID_LIST, listed)
        return [int(pid) for pid in listed.ProcessIdList[: min(listed.NumberOfProcessIdsInList, _LISTED_AT_ONCE)]]

    def memory(self) -> tuple[int, int]:
        """The commit peaks: of the job's largest process, and of the job as a whole (bytes)."""
        limits = JobExtendedLimits()
        self._query(JOB_EXTENDED_LIMIT, limits)
        return int(limits.PeakProcessMemoryUsed), int(limits.PeakJobMemoryUsed)


class JobTable:
    """Descendants among the job's members: their parents, read once per process."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self._parents: dict[int, int] = {}

    def descendants(self, root: int) -> dict[int, int]:
        members = set(self.job.members())
        if root not in members:  # a process from before the job: its children are not all members
            return ScannedTable().descendants(root)
        self._parents = {pid: parent for pid, parent in self._parents.items() if pid in members}
        for pid in members - self._parents.keys():
            try:
                self._parents[pid] = psutil().Process(pid).ppid()
            except psutil().Error:
                pass
        return descendants_from_parents(root, self._parents)


class Windows(Portable):
    """Working sets and their lifetime peaks; the tree through a Job Object."""

    name = "Windows"
    counts = WORKING_SET
    child_marks = EXACT
    marks_named = "each process's peak working set"
    killed_returncode = KILLED_EXIT_CODE
    appends_whole_lines = False  # the C runtime's append seeks, then writes: two steps

    def __init__(self, kernel32: Any = None, process: Any = None) -> None:
        super().__init__()
        self._kernel32 = kernel32
        self._process = process  # this process, as psutil sees it (a stand-in in the tests)
        self._job: Job | None = None
        self.job_missing: str | None = None  # why no job could be made, once one was tried

    def _own_process(self) -> Any:
        return self._process if self._process is not None else super()._own_process()

    def job(self) -> Job | None:
        """This process's job, made at the first call; ``None`` (and ``job_missing``) where none can be."""
        if self._job is None and self.job_missing is None:
            try:
                kernel32 = self._kernel32 if self._kernel32 is not None else load_kernel32()
                self._job = Job.join_new(kernel32)
            except (OSError, AttributeError) as error:
                self.job_missing = str(error)
        return self._job

    def job_memory(self) -> tuple[int, int] | None:
        """The job's commit peaks (its largest process's, the whole tree's) since it was made."""
        job = self.job()
        return job.memory() if job is not None else None

    # -- this process

    def peak_method(self) -> str:
        return EXACT_IF_RAISED

    def peak_mark(self) -> int | None:
        return int(self._own_process().memory_info().peak_wset)

    # -- other processes

    def memory_of(self, pid: int) -> tuple[int, int] | None:
        try:
            memory = psutil().Process(pid).memory_info()
        except (psutil().Error, OSError):
            return None
        return int(memory.rss), int(memory.peak_wset)

    def process_table(self) -> ProcessTable:
        job = self.job()
        return JobTable(job) if job is not None else ScannedTable()

    def has_children(self) -> bool:
        job = self.job()
        if job is None:
            return super().has_children()
        return job.active_processes() > 1  # this process is one of them

    def kill(self, pid: int) -> None:
        try:
            os.kill(pid, KILLED_EXIT_CODE)  # TerminateProcess(handle, 137)
        except OSError:
            pass

    def ending(self, returncode: int) -> Ending:
        known = EXIT_STATUSES.get(returncode & 0xFFFFFFFF)
        if known is None:
            return super().ending(returncode)
        return Ending(None, returncode, f"ended with {returncode & 0xFFFFFFFF:#x}: {known}")

    # -- starting processes

    def fork_missing(self) -> str | None:
        return "Windows has no fork()"

    def lock(self, directory: Path) -> AbstractContextManager[None]:
        return msvcrt_lock(directory)

    # -- the machine

    def missing(self) -> list[Missing]:
        found = [
            Missing("a resettable peak", "Windows keeps only a process's lifetime peak working set: a test's "
                    "peak is exact when it raised it, sampled every millisecond otherwise"),
            Missing("isolation by fork", "Windows has no fork(); isolated tests start a fresh interpreter"),
            Missing("OOM-kill counts", "Windows has no OOM killer: an allocation past the commit limit fails instead"),
        ]
        self.job()
        if self.job_missing is not None:
            found.append(Missing("the process tree through a Job Object",
                                 f"{self.job_missing}; processes are listed by scanning instead"))
        return found

    def describe(self) -> str:
        return ("peaks from the process's lifetime peak working set where a test raised it, sampled every "
                f"millisecond otherwise; processes a test starts: each one's own peak working set ({EXACT})")
