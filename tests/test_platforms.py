"""Operating systems behind one interface (``pytest_tfmem.platforms``).

macOS's and Windows' modules cannot run here: they are read through stand-ins of the very calls
they make (libproc's ``proc_pid_rusage``, kernel32's job calls, psutil's ``memory_info``), which
write each structure byte by byte at the offsets the systems' headers give, so that the layouts
are checked against the systems, not against our own field names. The portable module runs for
real, and so do whole sessions on Python as Windows has it (its missing names taken away,
``tests/simulated/windows``) and without ``/proc`` as on macOS (``tests/simulated/no_proc``).
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import time
import types
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
from conftest import PLAIN_RUN_OPTIONS

from pytest_tfmem import platforms
from pytest_tfmem.core.measure import PeakTracker
from pytest_tfmem.platforms import locks, windows
from pytest_tfmem.platforms.portable import Portable
from pytest_tfmem.probes import host

pytestmark = pytest.mark.any_os

MIB = 2**20
SIMULATED = Path(__file__).parent / "simulated"
HOLD_MEMORY = (
    "import sys, time\n"
    "block = bytearray(100 * 2**20)\n"
    "block[::4096] = b'x' * len(block[::4096])\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


# -- macOS: libproc's proc_pid_rusage, as xnu fills it


@pytest.fixture
def macos():
    """The macOS module (POSIX: it builds on the POSIX one, whose names Windows lacks)."""
    return pytest.importorskip("pytest_tfmem.platforms.macos", reason="the macOS module builds on POSIX")


class FakeLibproc:
    """libproc as macOS answers: ``proc_pid_rusage`` writes a ``struct rusage_info_v4`` at the
    byte offsets of xnu's ``bsd/sys/resource.h`` (FACTS.md), ``proc_reset_footprint_interval``
    (only where ``resettable``) sets the interval mark to the footprint now."""

    SIZE = 296
    RESIDENT, FOOTPRINT, EXIT_TIME, LIFETIME_MAX, INTERVAL_MAX = 64, 72, 88, 240, 280

    def __init__(self, resettable: bool = True) -> None:
        self.processes: dict[int, dict[str, int]] = {}
        self.resets: list[int] = []
        if resettable:
            self.proc_reset_footprint_interval = self._reset

    def set(self, pid: int, footprint: int, parent: int = 0, ended: bool = False) -> None:
        process = self.processes.setdefault(pid, {"lifetime": 0, "interval": 0, "parent": parent, "ended": 0})
        process["footprint"] = footprint
        process["lifetime"] = max(process["lifetime"], footprint)
        process["interval"] = max(process["interval"], footprint)
        process["ended"] = int(ended)

    def proc_pid_rusage(self, pid: int, flavor: int, reference: object) -> int:
        assert flavor == 4  # RUSAGE_INFO_V4
        process = self.processes.get(pid)
        if process is None:
            return -1
        structure = reference._obj  # type: ignore[attr-defined]  # what ctypes.byref points at
        assert ctypes.sizeof(structure) == self.SIZE
        raw = (ctypes.c_char * self.SIZE).from_buffer(structure)
        struct.pack_into("<Q", raw, self.RESIDENT, process["footprint"] // 2)
        struct.pack_into("<Q", raw, self.FOOTPRINT, process["footprint"])
        struct.pack_into("<Q", raw, self.EXIT_TIME, 12345 if process["ended"] else 0)
        struct.pack_into("<Q", raw, self.LIFETIME_MAX, process["lifetime"])
        struct.pack_into("<Q", raw, self.INTERVAL_MAX, process["interval"])
        return 0

    def _reset(self, pid: int) -> int:
        self.resets.append(pid)
        self.processes[pid]["interval"] = self.processes[pid]["footprint"]
        return 0

    def proc_listchildpids(self, pid: int, buffer: ctypes.Array, size: int) -> int:
        children = [child for child, process in self.processes.items() if process["parent"] == pid]
        for index, child in enumerate(children):
            buffer[index] = child
        return len(children)


def test_rusage_info_v4_is_laid_out_as_xnu_declares_it(macos):
    info = macos.RusageInfoV4
    assert ctypes.sizeof(info) == 296
    offsets = {name: getattr(info, name).offset for name in (
        "ri_resident_size", "ri_phys_footprint", "ri_proc_exit_abstime", "ri_lifetime_max_phys_footprint",
        "ri_interval_max_phys_footprint")}
    assert offsets == {"ri_resident_size": 64, "ri_phys_footprint": 72, "ri_proc_exit_abstime": 88,
                       "ri_lifetime_max_phys_footprint": 240, "ri_interval_max_phys_footprint": 280}


def test_macos_peaks_are_the_footprint_interval_mark_reset_at_each_window(macos):
    libproc = FakeLibproc()
    me = os.getpid()
    libproc.set(me, 100 * MIB)
    platform = macos.MacOS(libproc)
    assert (platform.peak_method(), platform.counts) == ("exact", "phys_footprint")
    tracker = PeakTracker(host.HostRSS(platform))
    window = tracker.open()
    assert libproc.resets == [me]  # the window reset this process's own mark
    libproc.set(me, 700 * MIB)  # a spike no sampler saw
    libproc.set(me, 150 * MIB)
    reading = tracker.close(window)
    assert (reading.start, reading.peak, reading.end) == (100 * MIB, 700 * MIB, 150 * MIB)
    assert tracker.method(window) == "exact"
    assert platform.describe().startswith("exact peaks from the footprint's interval mark")


def test_without_the_reset_a_macos_window_is_exact_only_when_it_raised_the_lifetime_mark(macos):
    libproc = FakeLibproc(resettable=False)
    me = os.getpid()
    libproc.set(me, 100 * MIB)
    platform = macos.MacOS(libproc)
    source = host.HostRSS(platform)
    assert source.method == "exact-if-raised"
    tracker = PeakTracker(source)
    raising = tracker.open()
    libproc.set(me, 500 * MIB)
    libproc.set(me, 100 * MIB)
    assert tracker.close(raising).peak == 500 * MIB and tracker.method(raising) == "exact-if-raised"
    below = tracker.open()
    libproc.set(me, 300 * MIB)  # under the lifetime mark: only the sampler can see it
    time.sleep(0.05)
    libproc.set(me, 100 * MIB)
    reading = tracker.close(below)
    source._sampler.stop()
    assert reading.peak == 300 * MIB and tracker.method(below) == "sampled"
    assert [missing.feature for missing in platform.missing()][0] == "a resettable peak"


def test_macos_children_are_listed_by_libproc_and_read_by_their_own_marks(macos):
    libproc = FakeLibproc()
    me = os.getpid()
    libproc.set(me, 100 * MIB)
    libproc.set(101, 40 * MIB, parent=me)
    libproc.set(101, 10 * MIB, parent=me)  # its lifetime mark stays at 40 MiB
    libproc.set(102, 5 * MIB, parent=101)
    libproc.set(103, 8 * MIB, parent=me, ended=True)  # a zombie: ended, not yet reaped
    platform = macos.MacOS(libproc)
    assert platform.process_table().descendants(me) == {101: me, 102: 101, 103: me}
    assert platform.memory_of(101) == (10 * MIB, 40 * MIB)
    assert platform.memory_of(103) is None and platform.memory_of(999) is None
    assert platform.maxrss_unit == 1  # wait4's ru_maxrss is in bytes on macOS
    assert platform.fork_missing() is not None
    assert {missing.feature for missing in platform.missing()} == {"isolation by fork", "OOM-kill counts"}


# -- Windows: kernel32's Job Objects and psutil's memory_info


class FakeKernel32:
    """kernel32's job calls as Windows answers: each ``QueryInformationJobObject`` writes its
    structure at the byte offsets of its 64-bit layout (``winnt.h``)."""

    def __init__(self, members: list[int], assign: bool = True) -> None:
        self.members = members
        self.assign = assign
        self.peaks = (0, 0)  # PeakProcessMemoryUsed, PeakJobMemoryUsed
        self.assigned: list[tuple[int, int]] = []

    def CreateJobObjectW(self, attributes: object, name: object) -> int:  # noqa: N802 - kernel32's names
        return 0x1234

    def GetCurrentProcess(self) -> int:  # noqa: N802
        return -1

    def AssignProcessToJobObject(self, job: int, process: int) -> int:  # noqa: N802
        self.assigned.append((job, process))
        return int(self.assign)

    def QueryInformationJobObject(self, job: int, kind: int, reference: object, size: int, returned: object) -> int:  # noqa: N802
        assert job == 0x1234 and returned is None
        raw = (ctypes.c_char * size).from_buffer(reference._obj)  # type: ignore[attr-defined]
        if kind == windows.JOB_BASIC_ACCOUNTING:
            assert size == 48
            struct.pack_into("<I", raw, 40, len(self.members))  # ActiveProcesses
        elif kind == windows.JOB_PROCESS_ID_LIST:
            struct.pack_into("<II", raw, 0, len(self.members), len(self.members))
            for index, pid in enumerate(self.members):
                struct.pack_into("<Q", raw, 8 + 8 * index, pid)
        elif kind == windows.JOB_EXTENDED_LIMIT:
            assert size == 144
            struct.pack_into("<QQ", raw, 128, *self.peaks)
        else:
            return 0
        return 1


Memory = namedtuple("Memory", "rss peak_wset")


class FakeWindowsProcess:
    """psutil's ``Process`` on Windows: ``memory_info()`` with the working set and its lifetime peak."""

    def __init__(self, size: int) -> None:
        self.size = self.peak = size

    def set(self, size: int) -> None:
        self.size, self.peak = size, max(self.peak, size)

    def memory_info(self) -> Memory:
        return Memory(self.size, self.peak)


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="the 64-bit layouts")
def test_job_object_structures_are_laid_out_as_windows_declares_them():
    assert ctypes.sizeof(windows.JobExtendedLimits) == 144
    assert windows.JobExtendedLimits.PeakProcessMemoryUsed.offset == 128
    assert windows.JobExtendedLimits.PeakJobMemoryUsed.offset == 136
    assert ctypes.sizeof(windows.JobAccounting) == 48 and windows.JobAccounting.ActiveProcesses.offset == 40
    assert windows.JobProcessIds.ProcessIdList.offset == 8


@pytest.fixture
def sleeping_child():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


def test_windows_reads_the_tree_through_a_job_object(sleeping_child):
    kernel32 = FakeKernel32(members=[os.getpid(), sleeping_child.pid])
    kernel32.peaks = (300 * MIB, 420 * MIB)
    platform = windows.Windows(kernel32=kernel32)
    assert platform.has_children()  # two active processes: this one and its child
    assert kernel32.assigned == [(0x1234, -1)]  # this process joined the job it made, once
    assert platform.process_table().descendants(os.getpid()) == {sleeping_child.pid: os.getpid()}
    assert platform.job_memory() == (300 * MIB, 420 * MIB)
    kernel32.members = [os.getpid()]
    assert not platform.has_children()
    assert "the process tree through a Job Object" not in {missing.feature for missing in platform.missing()}


def test_where_no_job_can_be_made_windows_scans_and_says_so(sleeping_child):
    platform = windows.Windows(kernel32=FakeKernel32(members=[], assign=False))
    assert sleeping_child.pid in platform.process_table().descendants(os.getpid())
    assert platform.job_memory() is None
    missing = {m.feature: m.why for m in platform.missing()}
    assert "AssignProcessToJobObject failed" in missing["the process tree through a Job Object"]
    assert missing["the process tree through a Job Object"].endswith("processes are listed by scanning instead")


def test_a_windows_window_is_exact_when_it_raised_the_peak_working_set():
    process = FakeWindowsProcess(100 * MIB)
    platform = windows.Windows(kernel32=FakeKernel32([]), process=process)
    source = host.HostRSS(platform)
    assert (source.method, source.counts) == ("exact-if-raised", "working set")
    tracker = PeakTracker(source)
    raising = tracker.open()
    process.set(900 * MIB)
    process.set(100 * MIB)
    assert tracker.close(raising).peak == 900 * MIB and tracker.method(raising) == "exact-if-raised"
    below = tracker.open()
    process.set(400 * MIB)
    time.sleep(0.05)
    process.set(100 * MIB)
    reading = tracker.close(below)
    source._sampler.stop()
    assert reading.peak == 400 * MIB and tracker.method(below) == "sampled"


def test_windows_names_how_a_process_ended_from_its_exit_code():
    platform = windows.Windows(kernel32=FakeKernel32([]))
    assert platform.ending(0xC0000005).description == "ended with 0xc0000005: access violation: invalid memory access in native code"
    assert platform.ending(windows.KILLED_EXIT_CODE).description.endswith("killed by pytest-tfmem (TerminateProcess)")
    assert platform.ending(1) == platforms.Ending(None, 1, "exited with 1")
    assert platform.killed_returncode == windows.KILLED_EXIT_CODE and platform.fork_missing() == "Windows has no fork()"


def test_the_msvcrt_lock_is_retried_until_had_and_released(tmp_path, monkeypatch):
    calls: list[tuple[int, int]] = []
    refusals = [OSError("locked by another process")]

    def locking(descriptor: int, mode: int, nbytes: int) -> None:
        calls.append((mode, os.lseek(descriptor, 0, os.SEEK_CUR)))
        if mode == 2 and refusals:
            raise refusals.pop()

    msvcrt = types.ModuleType("msvcrt")
    msvcrt.LK_UNLCK, msvcrt.LK_NBLCK, msvcrt.locking = 0, 2, locking  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "msvcrt", msvcrt)
    with locks.msvcrt_lock(tmp_path):
        assert calls == [(2, 0), (2, 0)]  # refused once, then had
    assert calls[-1] == (0, 0)  # unlocked at the byte it locked
    assert (tmp_path / locks.LOCK_FILE).exists()


# -- the portable platform and Linux, for real


@pytest.fixture
def holding_child():
    child = subprocess.Popen([sys.executable, "-c", HOLD_MEMORY], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    yield child
    child.kill()
    child.wait()


@pytest.mark.parametrize("name", ["portable", pytest.param("Linux", marks=pytest.mark.linux)])
def test_a_child_is_listed_read_and_killed(name, holding_child):
    if name == "Linux":
        from pytest_tfmem.platforms.linux import Linux

        platform = Linux()
    else:
        platform = Portable()
    assert holding_child.pid in platform.process_table().descendants(os.getpid())
    size, mark = platform.memory_of(holding_child.pid)
    assert 100 * MIB <= size <= mark < 200 * MIB
    assert platform.command_line(holding_child.pid)[:2] == [sys.executable, "-c"]
    platform.kill(holding_child.pid)
    returncode = holding_child.wait(timeout=10)
    assert returncode == platform.killed_returncode
    assert platform.ending(returncode).signal == "SIGKILL"
    assert platform.memory_of(holding_child.pid) is None


SEES_A_CHILD = """
import subprocess, sys
from pytest_tfmem.platforms.portable import Portable
platform = Portable()
assert not platform.has_children() and not platform.has_children()  # the second from what it knew
before = platform.processes_started()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
try:
    assert platform.processes_started() != before  # so the tree is listed again at once
    assert platform.has_children()  # not an answer kept from before it started
finally:
    child.kill()
    child.wait()
assert not platform.has_children()
"""


def test_the_portable_platform_sees_a_child_the_moment_it_starts():
    # In a fresh interpreter: a worker of this suite may hold a child an earlier test left it
    # (multiprocessing's resource tracker).
    checked = subprocess.run([sys.executable, "-c", SEES_A_CHILD], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr


def test_the_portable_platform_samples_a_spike_it_would_miss_without_its_sampler():
    source = host.HostRSS(Portable())
    tracker = PeakTracker(source)
    window = tracker.open()
    block = np.ones(200 * MIB, dtype=np.uint8)
    time.sleep(0.02)
    del block
    reading = tracker.close(window)
    source._sampler.stop()
    assert reading.increase >= 195 * MIB and tracker.method(window) == "sampled"


DIES_WITH_PARENT = """
import subprocess, sys
grandchild = subprocess.Popen([sys.executable, "-c", '''
import os, sys, time
from pytest_tfmem.platforms.portable import Portable
Portable().die_with_parent(os.getppid())
print("watching", flush=True)
time.sleep(60)
'''], stdout=subprocess.PIPE, text=True)
assert grandchild.stdout.readline() == "watching\\n"
print(grandchild.pid, flush=True)
"""


def test_a_process_dies_with_its_parent_without_prctl():
    middle = subprocess.run([sys.executable, "-c", DIES_WITH_PARENT], capture_output=True, text=True, timeout=60)
    grandchild = int(middle.stdout.strip())
    deadline = time.monotonic() + 5
    while Portable().memory_of(grandchild) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Portable().memory_of(grandchild) is None  # ended (its parent, the middle process, exited)


# -- choosing the platform


@pytest.mark.linux
def test_tfmem_platform_chooses_the_portable_platform_and_refuses_others():
    def chosen(value: str) -> subprocess.CompletedProcess[str]:
        code = "from pytest_tfmem import platforms; print(platforms.current().name)"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, platforms.ENVIRONMENT: value})

    assert chosen("portable").stdout == "portable\n"
    assert chosen("auto").stdout == "Linux\n"
    refused = chosen("windows")
    assert refused.returncode == 1
    assert "ValueError: invalid TFMEM_PLATFORM value 'windows': expected one of auto, portable" in refused.stderr


# test_big holds 300 MiB. Where peaks are sampled (the portable platform), a reading is the whole
# process's RSS at that moment: with what pytest and tfmem's own threads hold meanwhile, and no heap
# handed back before the window (no malloc_trim there), it read 300.0 to 301.1 MiB on two 2-core
# machines. BIG_OVER_BUDGET allows 300 to 303 MiB.
BIG_OVER_BUDGET = "*test_big*30[0-3].? MiB*over budget*"
TESTS = """
import numpy as np

def test_big():
    block = np.ones(300 * 2**20 // 8)
    assert block.sum() > 0

def test_small():
    assert sum(range(10)) == 45
"""


def test_a_bad_platform_option_is_a_usage_error(pytester: pytest.Pytester):
    pytester.makepyfile(test_any=TESTS)
    result = pytester.runpytest_subprocess("--tfmem-platform=bsd")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-tfmem: invalid --tfmem-platform value 'bsd': expected one of auto, portable"])


def test_forking_named_where_the_platform_does_not_fork_is_a_usage_error(pytester: pytest.Pytester):
    pytester.makepyfile(test_any=TESTS)
    result = pytester.runpytest_subprocess("--tfmem-platform=portable", "--tfmem-isolate", "--tfmem-isolate-start=fork")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: pytest-tfmem: --tfmem-isolate-start=fork is not available on portable: the portable platform starts "
        "every process by spawning a fresh interpreter; use --tfmem-isolate-start=spawn (the default there)"
    ])


def test_a_portable_session_says_how_each_figure_was_read(pytester: pytest.Pytester):
    pytester.makepyfile(test_any=TESTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-platform=portable", "--tfmem-budget=200MB",
                                           f"--tfmem-report={report}", "-rA")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "tfmem: platform portable: peaks sampled every millisecond through psutil (RSS)",
        "tfmem: not on portable: exact peaks (psutil reads sizes only, so every peak is sampled); isolation by fork *; OOM-kill counts *",
        BIG_OVER_BUDGET,
        "host RSS: sampled every millisecond: no mark this test could use",
    ])
    data = json.loads(report.read_text())
    assert (data["environment"]["memory"], data["environment"]["peaks"]) == ("RSS", "sampled")
    assert {test["measurement"]["method"] for test in data["tests"]} == {"sampled"}
    shown = subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", "show", str(report)],
                           capture_output=True, text=True, check=True)
    assert "memory RSS" in shown.stdout and "peaks sampled" in shown.stdout


@pytest.mark.linux
def test_a_linux_session_says_its_figures_are_exact(pytester: pytest.Pytester):
    pytester.makepyfile(test_any=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB", "-rA")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "tfmem: platform Linux: exact peaks from the kernel's high-water mark of RSS (VmHWM), reset per test",
        "host RSS: exact: the platform's mark, reset for this test",
    ])
    assert "tfmem: not on Linux" not in result.stdout.str()


@pytest.mark.linux
def test_a_baseline_that_counts_something_else_is_not_compared(pytester: pytest.Pytester):
    pytester.makepyfile(test_any=TESTS)
    baseline = pytester.path / "baseline.json"
    saved = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--tfmem-save-baseline={baseline}")
    saved.assert_outcomes(passed=2)
    data = json.loads(baseline.read_text())
    assert data["environment"]["memory"] == "RSS"
    data["environment"].update(memory="phys_footprint", platform="Darwin arm64")
    for entry in data["tests"].values():
        entry["peak"] = 1024  # would be a regression of every test, were it compared
    baseline.write_text(json.dumps(data))
    report = pytester.path / "report.json"
    gated = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--tfmem-baseline={baseline}",
                                          f"--tfmem-report={report}")
    gated.assert_outcomes(passed=2)
    gated.stdout.fnmatch_lines([
        "tfmem: warning: not compared: the baseline's figures count phys_footprint (Darwin arm64), those here count "
        "RSS (Linux x86_64); save a baseline on this platform"
    ])
    compared = subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", "compare", str(baseline), str(report)],
                              capture_output=True, text=True)
    assert compared.returncode == 0
    assert "not compared: the baseline's figures count phys_footprint" in compared.stderr
    assert "0 regression(s)" in compared.stdout


# -- whole sessions on Python as Windows has it, and without /proc as on macOS


def simulated(name: str, **variables: str) -> dict[str, str]:
    """The environment of a session run on the simulated system ``name`` (``tests/simulated/NAME``)."""
    path = os.pathsep.join(filter(None, [str(SIMULATED / name), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **variables}


@pytest.mark.linux
def test_installed_on_windows_an_unused_plugin_changes_nothing(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    from test_inert import PLAIN_TESTS, comparable

    pytester.makepyfile(test_plain=PLAIN_TESTS)
    monkeypatch.setenv("PYTHONPATH", simulated("windows")["PYTHONPATH"])
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # other plugins (pytest-memray) do not run on Windows
    monkeypatch.setenv("PYTEST_ADDOPTS", PLAIN_RUN_OPTIONS)  # no tfmem ini value either
    without = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:tfmem")
    inert = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "pytest_tfmem.plugin")
    without.assert_outcomes(passed=6, xfailed=1)
    inert.assert_outcomes(passed=6, xfailed=1)
    assert comparable(inert.outlines) == comparable(without.outlines)
    assert inert.errlines == without.errlines == []
    assert not (pytester.path / ".tfmem").exists()


CREEPING = """
import numpy as np

KEPT = []

def test_keeps_one():
    KEPT.append(np.ones(100 * 2**20 // 8))

def test_keeps_two():
    KEPT.append(np.ones(100 * 2**20 // 8))

def test_keeps_three():
    KEPT.append(np.ones(100 * 2**20 // 8))
"""


@pytest.mark.slow
@pytest.mark.linux  # Python as Windows has it is simulated on Linux's
def test_on_windows_every_feature_works_or_says_why_not(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Budgets, isolation (spawned), the session limit's replacement processes (a channel over the
    loopback interface), the journal (msvcrt's lock) and ``tfmem last``: no fork, no SIGKILL, no fcntl."""
    pytester.makepyfile(test_budget=TESTS, test_creep=CREEPING)
    for name, value in simulated("windows", TFMEM_PLATFORM="portable", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1").items():
        monkeypatch.setenv(name, value)
    plugin = ("-p", "no:cacheprovider", "-p", "pytest_tfmem.plugin")
    budget = pytester.runpytest_subprocess(*plugin, "--tfmem-budget=200MB", "--tfmem-isolate", "test_budget.py")
    budget.assert_outcomes(passed=1, failed=1)
    budget.stdout.fnmatch_lines(["tfmem: not on portable: *isolation by fork (tests are isolated in fresh interpreters)*",
                                 "*isolated tests*", BIG_OVER_BUDGET])
    creep = pytester.runpytest_subprocess(*plugin, "--tfmem-session-limit=150MB", "test_creep.py")
    creep.assert_outcomes(passed=3)
    creep.stdout.fnmatch_lines(["2 replacement process(es) started (fresh interpreters)*"])
    for result in (budget, creep):
        assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    last = subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", "last"], capture_output=True, text=True,
                          cwd=pytester.path)
    assert last.returncode == 0 and "3 passed" in last.stdout


@pytest.mark.linux
def test_without_proc_a_session_measures_through_psutil(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    pytester.makepyfile(test_budget=TESTS)
    for name, value in simulated("no_proc", TFMEM_PLATFORM="portable").items():
        monkeypatch.setenv(name, value)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=200MB")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([BIG_OVER_BUDGET])
    assert "INTERNALERROR" not in result.stdout.str()


@pytest.mark.linux
def test_a_fork_that_maps_the_file_pages_again_holds_them_as_its_parent_does():
    """``resident_file_pages``: the libraries this process has in memory; a fork holds few of them
    until it maps them again. Elsewhere (no ``/proc``, or no fork to give them) there are none."""
    from pytest_tfmem.platforms.linux import Linux

    assert Portable().resident_file_pages().ranges == ()
    pages = Linux().resident_file_pages()
    assert pages.size > 10 * MIB  # the interpreter, NumPy and pytest's modules' libraries at least
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:
        before = Linux().resident_file_pages().size
        pages.map_again()
        os.write(writing, json.dumps([before, Linux().resident_file_pages().size]).encode())
        os._exit(0)
    os.close(writing)
    with os.fdopen(reading) as pipe:
        before, after = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert before < pages.size / 2 < pages.size * 0.9 < after, (before, pages.size, after)
