"""Watch a child process and its descendants; kill the tree at a hard memory limit.

The outside view of a process, shared by isolated tests (``isolate``), ``tfmem run`` and
``find_max_batch_size``'s trials. The watcher samples the tree's resident memory (the child
plus every process it started) every ``interval_s`` on a ``Sampler``'s thread, while the
calling thread waits for the child. With each sample it also reads the mark of each process of
the tree where the platform keeps one (``platforms``: Linux's ``VmHWM``, macOS's lifetime
footprint mark, Windows' peak working set), spikes between two samples included (for a process
that ends between two samples, the mark as last read). (``ru_maxrss`` from ``wait4`` would not
do: it starts from the parent's size, copied at fork and kept by exec.) When a reading reaches
``kill_at`` the tree is killed at once (SIGKILL; TerminateProcess on Windows): a process that
allocates fast can still overshoot the limit by what it allocates within one interval.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from pytest_tfmem import platforms
from pytest_tfmem.platforms import SIGNAL_CAUSES
from pytest_tfmem.probes import system
from pytest_tfmem.probes.sampler import Sampler

# How often the list of descendants is refreshed; their memory is read at every sample.
_TREE_REFRESH_S = 0.5
# How long a fork copy is watched for ``exec`` (a fork that runs another program does so at once).
_EXEC_WINDOW_S = 1.0



class ProcessGone(Exception):
    """The watched process has ended: nothing more to read of its tree."""


@dataclass
class WatchResult:
    """How the child ended and what its tree's memory did meanwhile (bytes, seconds)."""

    returncode: int
    kill_at: int | None
    killed_at_limit: bool  # the watchdog sent the SIGKILL
    last_rss: int  # process tree RSS at the last sample
    peak_rss: int  # highest sampled process tree RSS
    child_peak_rss: int  # the child's own high-water mark, exact, as last read (0 if never read)
    elapsed_s: float
    timeline: list[tuple[float, int]] = field(default_factory=list)
    oom_kills: int | None = None  # OOM kills in ``oom_scope`` while the child ran, if known
    available: int = 0  # memory still available on the machine (or cgroup) at the last reading
    # pid -> the highest high-water mark read of each process of the tree (the child's included)
    high_water_marks: dict[int, int] = field(default_factory=dict)
    oom_scope: str = "this cgroup"  # whose oom_kill count ``oom_kills`` is: "this cgroup", "the machine"

    @property
    def signal(self) -> str | None:
        """The signal that ended the child (``SIGKILL``), ``None`` if it exited."""
        return platforms.current().ending(self.returncode).signal


def describe_signal(sig: str, oom_kills: int | None, oom_scope: str = "this cgroup") -> str:
    """``killed by SIGKILL (not sent by pytest-tfmem): likely the kernel's OOM killer ...``.

    ``oom_kills``: how far the ``oom_kill`` count of ``oom_scope`` rose while the process ran, if known.
    """
    return f"killed by {sig} (not sent by pytest-tfmem): {signal_cause(sig, oom_kills, oom_scope)}"


def signal_cause(sig: str, oom_kills: int | None, oom_scope: str = "this cgroup") -> str:
    """What most likely sent ``sig`` (``describe_signal``'s words after the colon)."""
    cause = SIGNAL_CAUSES.get(sig, "a signal from outside the test")
    if sig == "SIGKILL" and oom_kills:
        cause = f"the kernel's OOM killer: out of memory ({oom_scope}'s oom_kill count rose by {oom_kills})"
    elif sig == "SIGKILL" and oom_kills == 0:
        cause = (
            f"SIGKILL is what the kernel's OOM killer sends when memory runs out, but {oom_scope}'s "
            "oom_kill count did not change: more likely another process (kill -9, a CI timeout)"
        )
    return cause


def killed_by_oom_killer(sig: str | None, oom_kills: int | None) -> bool:
    """The kernel's OOM killer sent it: a SIGKILL while the ``oom_kill`` count rose."""
    return sig == "SIGKILL" and bool(oom_kills)


def downsample(timeline: list[tuple[float, int]], points: int) -> list[tuple[float, int]]:
    """At most ``points`` samples, keeping each bucket's highest reading and the last one."""
    if len(timeline) <= points:
        return list(timeline)
    size = -(-len(timeline) // (points - 1))
    kept = [max(timeline[i : i + size], key=lambda sample: sample[1]) for i in range(0, len(timeline) - 1, size)]
    return kept if kept[-1] == timeline[-1] else [*kept, timeline[-1]]


@dataclass
class ProcessMark:
    """One descendant of a watched process, as its readings found it (bytes, ``time.monotonic``).

    A fork copy (a process that has not called ``exec``: a ``multiprocessing`` fork worker, a
    forkserver's worker) starts out mapping its parent's pages, which its resident size and
    high-water mark count: ``inherited`` is its size at the fork (as it told it, else its size
    when first read or its parent's, whichever is smaller), and its own figures are what it holds
    above that. A process that ran a program of its own inherited nothing.
    """

    pid: int
    parent: int
    command: str
    first_seen: float
    last_seen: float
    inherited: int  # a fork copy's size at the fork; 0 for a process that ran ``exec``
    high_water_mark: int  # the highest mark read (``VmHWM`` on Linux)
    rss: int  # at the last reading
    fork_copy: bool
    told: bool = False  # ``inherited`` is the size the fork copy told

    @property
    def own_peak(self) -> int:
        """The process's own peak above what it inherited: exact as of its last reading."""
        return max(0, self.high_water_mark - self.inherited)

    @property
    def own_size(self) -> int:
        """What it holds above what it inherited, at its last reading."""
        return max(0, self.rss - self.inherited)


def command_line(pid: int, width: int = 60) -> str:
    """``python -c import numpy ...``: a process's command line, shortened to ``width``
    characters (``[name]`` for a kernel thread or a process whose arguments are gone)."""
    args = platforms.current().command_line(pid)
    if args is None:
        return "?"
    text = " ".join(" ".join(arg.split()) for arg in args if arg)
    args0, _, rest = text.partition(" ")
    text = " ".join(filter(None, [os.path.basename(args0) if not args0.startswith("[") else args0, rest]))
    return text if len(text) <= width else text[: width - 3] + "..."


class ProcessTreeRss:
    """Resident memory of a process plus its descendants' own, less those in ``leave_out``.

    A descendant that is a fork copy counts what it grew above its size at the fork
    (``ProcessMark``): the pages it shares with its parent are the parent's.

    ``leave_out`` holds the isolation templates a session started (read at every ``read``, so
    its owner may change it): their forks count, each mapping the template's pages it uses, so
    adding the template's own RSS would count those pages twice and charge its start to a test.

    Descendants are listed by the platform's process table (``platforms``), refreshed every
    ``refresh_s``; each ``read`` reads the size and mark of the tree's processes, one reading each
    (tens of microseconds on Linux).
    """

    def __init__(
        self,
        pid: int,
        refresh_s: float = _TREE_REFRESH_S,
        leave_out: Collection[int] = (),
        start_size: Callable[[int], int | None] = lambda pid: None,
        told_late: Callable[[int], int | None] = lambda pid: None,
    ) -> None:
        self.pid = pid
        self.start_size = start_size  # a fork copy's size when it started, where known (``fork_sizes.ForkSizes.size``)
        # the same, from forks that tell it only after some work (``batch_trials``): read until it comes
        self.told_late = told_late
        self.leave_out = leave_out
        self.refresh_s = refresh_s
        self.platform = platforms.current()
        self._table = self.platform.process_table()
        self.descendants: list[int] = []
        self._parents: dict[int, int] = {}  # pid -> parent pid, of the descendants last listed
        self._marks: dict[int, int] = {}  # pid -> high-water mark at the last read
        self._refreshed = float("-inf")
        # Every descendant read since ``forget`` (the ended ones too), by pid.
        self.processes: dict[int, ProcessMark] = {}
        self.running: set[int] = set()  # the descendants the last ``read`` found running
        self._commands: dict[int, str] = {}  # pid -> its command line as last read

    def refresh(self) -> None:
        self._parents = self._table.descendants(self.pid)
        self.descendants = list(self._parents)
        self._refreshed = time.monotonic()

    def read(self) -> int:
        """The tree's size in bytes; raises ``ProcessGone`` once the root process has ended."""
        if time.monotonic() - self._refreshed >= self.refresh_s:
            self.refresh()
        root = self.platform.memory_of(self.pid)
        if root is None:  # gone, or a zombie: the process has ended, its memory is gone
            raise ProcessGone(self.pid)
        readings = {self.pid: root}
        for pid in self.descendants:  # those left out too: a fork copy's parent's size is its inheritance
            if memory := self.platform.memory_of(pid):
                readings[pid] = memory
        now = time.monotonic()
        for pid, memory in readings.items():
            if pid != self.pid and pid not in self.leave_out:
                self._note(pid, memory, now, readings)
        self.running = {pid for pid in readings if pid != self.pid}
        counted = {pid: memory for pid, memory in readings.items() if pid not in self.leave_out}
        inherited = {pid: mark.inherited for pid, mark in self.processes.items() if pid in counted}
        self._marks = {pid: max(0, memory[1] - inherited.get(pid, 0)) for pid, memory in counted.items()}
        return sum(max(0, memory[0] - inherited.get(pid, 0)) for pid, memory in counted.items())

    def _note(self, pid: int, memory: tuple[int, int], now: float, readings: dict[int, tuple[int, int]]) -> None:
        """Update ``pid``'s ``ProcessMark`` with a reading of (RSS, high-water mark)."""
        known = self.processes.get(pid)
        young = known is not None and now - known.first_seen < _EXEC_WINDOW_S
        if known is not None and known.fork_copy and young and _ran_exec(known.command, self._command(pid, again=True)):
            known = None  # the fork copy has run ``exec`` since: a new program, with a mark of its own
        if known is None:
            parent = self._parents.get(pid, self.pid)
            command = self._command(pid)
            fork_copy = command == self._command(parent)
            # A fork copy starts with at most its parent's resident pages: if it was first read
            # after it had grown, its parent's size is the closer figure, unless it told its own.
            known = self.processes[pid] = ProcessMark(pid, parent, command, now, now, 0, 0, 0, fork_copy)
            if fork_copy:
                told = self.start_size(pid)
                known.inherited = told or min(memory[0], readings.get(parent, memory)[0])
                known.told = told is not None
        if known.fork_copy and not known.told:
            # A copy that tells its size after some work may have been found before: read until it does.
            told = self.told_late(pid)
            if told is not None:
                known.inherited, known.told = told, True
        known.last_seen, known.rss = now, memory[0]
        known.high_water_mark = max(known.high_water_mark, memory[1])

    def _command(self, pid: int, again: bool = False) -> str:
        if again or pid not in self._commands:
            self._commands[pid] = command_line(pid)
        return self._commands[pid]

    def forget(self) -> None:
        """Drop the ``ProcessMark`` of every process that has ended (as of the last ``read``)."""
        self.processes = {pid: mark for pid, mark in self.processes.items() if pid in self.running}
        self._commands = {pid: command for pid, command in self._commands.items() if pid in self._parents}

    def high_water_marks(self) -> dict[int, int]:
        """Each process's high-water mark (the platform's: ``VmHWM`` on Linux) at the last ``read``, by pid, less
        what a fork copy inherited: the root, then the descendants last listed; a process
        already gone is left out."""
        return dict(self._marks)


def _ran_exec(command: str, now: str) -> bool:
    """A fork copy's command line has become another program's (not one that could not be read:
    a process that is ending has none)."""
    return now != command and now != "?" and not now.startswith("[")


class ChildProcess(Protocol):
    """What the watchdog needs of the process it watches: a ``subprocess.Popen``, a fork of
    isolation's template (whose exit status the template reports), a trial process."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def wait(self) -> int: ...


Reading = Callable[[float, int], object]  # called with (seconds since the start, tree RSS)


class Watchdog:
    """Sample a child's process tree, kill it at ``kill_at``, wait for it to end.

    ``kill_at`` may be set (or changed) once watching has started; ``on_reading`` is called
    on the sampling thread with each reading; ``start_size`` gives a fork copy's size at the fork
    where it told it (``fork_sizes.ForkSizes.size``).
    """

    def __init__(
        self,
        process: ChildProcess,
        kill_at: int | None,
        interval_s: float = 0.02,
        on_reading: Reading | None = None,
        start_size: Callable[[int], int | None] = lambda pid: None,
    ) -> None:
        self.process = process
        self.kill_at = kill_at
        self.interval_s = interval_s
        self.on_reading = on_reading
        self.killed_at_limit = False
        self._tree = ProcessTreeRss(process.pid, start_size=start_size)  # forks' told sizes, where known
        self._available = system.available_memory()
        self._available_read = time.monotonic()
        self._timeline: list[tuple[float, int]] = []
        self._marks: dict[int, int] = {}
        self._sampler = Sampler(self._sample, interval_s, "tfmem-watchdog")
        self._oom_before: system.OomKillCount | None = None
        self._t0 = time.monotonic()

    @property
    def peak_rss(self) -> int:
        """The highest tree RSS sampled so far."""
        return max((rss for _, rss in self._timeline), default=0)

    def start(self) -> Watchdog:
        """Start sampling (``wait`` starts it if this has not)."""
        if self._oom_before is None:
            self._oom_before = system.oom_kill_counter()
            self._sampler.start()
        return self

    def stop(self) -> None:
        self._sampler.stop()

    def _kill_tree(self) -> None:
        self._tree.refresh()
        # the platform's kill: Popen.send_signal would poll() from this thread while the other waits
        self._tree.platform.kill(self.process.pid)
        self.kill_descendants()

    def kill_descendants(self) -> None:
        """Kill what the child started (left running when the child died)."""
        for pid in self._tree.descendants:
            self._tree.platform.kill(pid)

    def _sample(self) -> bool:
        """One reading of the tree; ``False`` once there is nothing more to watch."""
        try:
            rss = self._tree.read()
        except ProcessGone:  # the child has exited
            return False
        for pid, mark in self._tree.high_water_marks().items():
            self._marks[pid] = max(self._marks.get(pid, 0), mark)
        if time.monotonic() - self._available_read >= _TREE_REFRESH_S:
            self._available, self._available_read = system.available_memory(), time.monotonic()
        elapsed = time.monotonic() - self._t0
        self._timeline.append((elapsed, rss))
        if self.on_reading is not None:
            self.on_reading(elapsed, rss)
        if self.kill_at is not None and rss >= self.kill_at and not self.killed_at_limit:
            self.killed_at_limit = True
            self._kill_tree()
            return False
        return True

    def wait(self) -> WatchResult:
        """Block until the child has ended; reap it and return what was seen."""
        self.start()
        try:
            self.process.wait()
        except BaseException:  # interrupted (Ctrl-C): the child must not outlive the wait
            self._sampler.stop()
            self._kill_tree()
            self.process.wait()
            raise
        elapsed = time.monotonic() - self._t0
        self._sampler.stop()
        returncode = self.process.wait()  # reaped: known
        if returncode < 0:
            self.kill_descendants()
        oom_kills = system.oom_kills_since(self._oom_before)
        timeline = self._timeline
        return WatchResult(
            returncode=returncode,
            kill_at=self.kill_at,
            killed_at_limit=self.killed_at_limit and returncode == self._tree.platform.killed_returncode,
            last_rss=timeline[-1][1] if timeline else 0,
            peak_rss=max((rss for _, rss in timeline), default=0),
            child_peak_rss=self._marks.get(self.process.pid, 0),
            elapsed_s=elapsed,
            timeline=timeline,
            oom_kills=None if oom_kills is None else oom_kills.count,
            available=self._available,
            high_water_marks=dict(self._marks),
            oom_scope="this cgroup" if oom_kills is None else oom_kills.scope,
        )
