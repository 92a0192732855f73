"""The processes a measured window starts, and what each of them needed.

A test's memory includes the processes it starts: a training script run with ``subprocess``, a
``multiprocessing`` pool, a Keras data loader's workers. ``ChildWatch`` reads this process's
descendants through the one reader of a process tree (``watchdog.ProcessTreeRss``) while a
window is open, and hands each window a ``ChildrenReading``:

- each process's own peak is the platform's mark of it (Linux's ``VmHWM``, macOS's lifetime
  footprint mark, Windows' peak working set), which keeps spikes between two readings; it is
  read every ``INTERVAL_S`` while the process lives, and, where the platform's wait tells it
  (``wait4`` on Linux and macOS), once more when it is reaped: ``os.waitpid`` (through which
  ``subprocess`` and ``multiprocessing`` reap their children) goes through it while a window is
  open, whose ``ru_maxrss`` is the mark the process had when it ended. That figure also counts
  what the process inherited (a fork's copy of its parent; the parent's own mark, for a program
  started with ``exec``), so it is used only where it can be told apart (see ``_exact_peak``).
- their combined figure: where processes ran at the same time, their marks are added, an upper
  bound (their peaks need not have met); the sum of their resident sizes at each reading is
  kept too, a lower bound (a reading can miss a short peak).
- how each ended: its exit code or signal, where this process reaped it, and the machine's or
  cgroup's OOM kill count, so that a child the OOM killer took is named.

A window that starts no process costs one question at each end (Linux: a ``waitid`` call). The
watch's thread asks the same every ``LOOK_S`` while windows open and close, and reads the
descendants every ``INTERVAL_S`` once there are any; it is not woken for each window (a wake-up
for each of thousands of short tests was a large share of their cost on two cores), and it
sleeps once no window has been open for ``IDLE_AFTER_S``. While this process waits for a child in
``os.waitpid`` (``subprocess.run``, a pool's ``join``), the wait itself reads the tree every
``WAIT_READ_S`` (then ``INTERVAL_S``) until the child ends, so a program that lives a few tens of
milliseconds is read near its peak, and what it starts in turn is found. A process that starts
after one look and ends before the next without such a wait (its output read to the end first,
as ``subprocess.run(capture_output=True)`` does) is still counted where it is reaped through
``os.waitpid``, exactly where its ``ru_maxrss`` tells its own peak apart; otherwise it is named as
ended unread (``ChildFigure.read``), and a re-run that could not read a process the first run read
does not overturn a verdict on it (``core.confirm``). One reaped elsewhere (a shell's child) that
lived less than ``LOOK_S`` is missed.
Processes already running when a window opens (a kernel nbval started for a notebook's first
cell, a pool a wider fixture started) count by what they grew while it was open: their size as
it opened, and their largest size read while it was open (every ``INTERVAL_S``; an exact mark
would need resetting theirs, which the windows of other tests nest in), at least ``GREW_AT_LEAST``
above it. tfmem's own processes (isolation templates) never count, nor do those a span left out
of the window starts (a first import's). A fork of this process tells its size at the fork itself
(``ForkSizes``).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pytest_tfmem import platforms
from pytest_tfmem.platforms.fork_sizes import ForkSizes
from pytest_tfmem.probes import host, system
from pytest_tfmem.probes.process_books import ProcessBooks
from pytest_tfmem.probes.watchdog import ProcessMark, ProcessTreeRss, killed_by_oom_killer, signal_cause

INTERVAL_S = 0.005  # how often descendants are read while a window has any
# While this process waits for one of them (``os.waitpid``): how often they are read in the
# first ``WAIT_READ_FOR_S`` of the wait (a short-lived program is read near its peak), then
# every ``INTERVAL_S``.
WAIT_READ_S = 0.001
WAIT_READ_FOR_S = 0.1
LOOK_S = 0.05  # how often the thread looks for a first one while windows have none
IDLE_AFTER_S = 1.0  # the thread sleeps once no window has been open for this long
# How often the list of descendants is refreshed when no process was started anywhere.
_REFRESH_S = 0.25
# What a process running before a window opened must grow by to count (an idle process's pages
# come and go by a few hundred KiB).
GREW_AT_LEAST = 2**20
UNREAD = "(ended before its first reading)"  # the command of a process reaped, never read


@dataclass(frozen=True)
class ChildFigure:
    """One process a window started: its own peak (bytes) and how it ended."""

    pid: int
    command: str
    peak: int  # above what it inherited from its parent
    exact: bool  # the kernel's mark when it ended; otherwise as of its last reading
    last_rss: int
    ended: str | None  # "exited with 0", "killed by SIGKILL ...", None while running or not reaped here
    running: bool  # still running when the window closed
    oom_killed: bool = False
    # Running before the window opened: ``peak`` is what it grew by while the window was open.
    running_before: bool = False
    # What the process booked apart itself (``probes.process_books``: a kernel's start, its first
    # imports), left out of ``peak``; ``booked_as`` says what: (what, bytes) each.
    booked: int = 0
    booked_as: tuple[tuple[str, int], ...] = ()

    @property
    def read(self) -> bool:
        """Its peak is known: read while it ran, or told exactly as it was reaped."""
        return self.exact or self.command != UNREAD

    @property
    def died(self) -> bool:
        """Killed: by the OOM killer, SIGKILL, or a crash (not stopped by SIGTERM or SIGINT, as a
        pool stops its workers)."""
        return self.oom_killed or (self.ended or "").startswith("killed")


@dataclass(frozen=True)
class ChildrenReading:
    """The processes a window started and their combined figure (bytes)."""

    processes: tuple[ChildFigure, ...]
    combined: int
    combined_basis: str  # "one at a time", "marks summed" (an upper bound), "sampled together"
    sampled_sum: int  # highest sum of their resident sizes at one reading (a lower bound)
    interval_s: float = INTERVAL_S

    def largest(self, count: int) -> list[ChildFigure]:
        return sorted(self.processes, key=lambda figure: figure.peak, reverse=True)[:count]

    def named(self) -> str:
        """``process it started``, ``processes it used`` (running before it), ``processes it
        started or used``."""
        count, before = len(self.processes), sum(figure.running_before for figure in self.processes)
        how = "it started" if not before else "it used" if before == count else "it started or used"
        return f"process{'es' if count > 1 else ''} {how}"

    @property
    def read_count(self) -> int:
        """How many of its processes have a known peak (``ChildFigure.read``)."""
        return sum(figure.read for figure in self.processes)

    def counted(self) -> str:
        """``1 process it started``, ``2 processes it used``..."""
        return f"{len(self.processes)} {self.named()}"

    def to_dict(self) -> dict[str, Any]:
        data = dict(vars(self))
        data["processes"] = [dict(vars(figure)) for figure in self.processes]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChildrenReading:
        return cls(
            processes=tuple(
                ChildFigure(**{**figure, "booked_as": tuple((str(what), int(size))
                                                            for what, size in figure.get("booked_as", ()))})
                for figure in data["processes"]
            ),
            combined=data["combined"],
            combined_basis=data["combined_basis"],
            sampled_sum=data["sampled_sum"],
            interval_s=data.get("interval_s", INTERVAL_S),
        )


@dataclass
class _Reaped:
    returncode: int  # as ``subprocess`` gives it: negative for a signal
    max_rss: int  # ``ru_maxrss``, bytes
    parent_mark: int  # this process's high-water mark when it reaped the child


@dataclass(eq=False)
class ChildWindow:
    started: float
    leave_out: set[int]
    oom_before: system.OomKillCount | None = None
    oom_read: bool = False
    sampled_sum: int = 0
    seen: set[int] = field(default_factory=set)
    # Processes running as it opened (less tfmem's own): their size then, and the largest read since.
    sizes_before: dict[int, int] = field(default_factory=dict)
    largest: dict[int, int] = field(default_factory=dict)


class ChildWatch:
    """This process's descendants while windows are open; one per process (``watch()``)."""

    def __init__(self) -> None:
        self.platform = platforms.current()
        self._tree = ProcessTreeRss(os.getpid(), refresh_s=float("inf"), start_size=_fork_sizes().size,
                                    told_late=_told_elsewhere_size)
        self._windows: list[ChildWindow] = []
        self._reaped: dict[int, _Reaped] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_closed = float("-inf")  # when the last open window closed
        self._last_pid = b""
        self._refreshed = 0.0
        self._waitpid: Callable[[int, int], tuple[int, int]] | None = None  # the original, while replaced
        # tfmem's own processes among the descendants (isolation templates): nobody's children
        self.helpers: set[int] = set()
        self._span: tuple[float, set[int]] | None = None  # a span left out: its start, the pids it reaped
        self._read_for_wait = float("-inf")  # when a wait for a process last read the tree

    # -- windows

    def open(self) -> ChildWindow:
        with self._lock:
            leave_out: set[int] = set()
            sizes_before: dict[int, int] = {}
            if self.platform.has_children():
                self._refresh()
                leave_out = set(self._tree.descendants) | self.helpers
                if set(self._tree.descendants) - self.helpers:
                    self._read_tree()
                    alive = self._tree.running - self.helpers
                    sizes_before = {pid: mark.rss for pid, mark in self._tree.processes.items() if pid in alive}
            window = ChildWindow(time.monotonic(), leave_out, sizes_before=sizes_before)
            self._windows.append(window)
            self._install_waitpid()
            self._start_thread()
            return window

    def close(self, window: ChildWindow) -> ChildrenReading | None:
        """End ``window``; what it started, or ``None`` if it started nothing."""
        with self._lock:
            if self._anything_to_read():
                self._tick()
            self._windows.remove(window)
            reading = self._reading(window)
            if not self._windows:
                self._last_closed = time.monotonic()
                self._tree.forget()  # a process still running stays known: what stays is read between tests
                self._reaped.clear()
                self._restore_waitpid()
            return reading

    def leave_out_begin(self) -> None:
        """A span that is no window's own begins (a first import): the processes it starts (a
        library's helper, as matplotlib runs ``fc-list`` when Keras is imported) are not the
        windows' either."""
        with self._lock:
            if self._windows:
                self._span = (time.monotonic(), set())

    def leave_out_end(self) -> None:
        """The span ends: every process it started, running or reaped, is left out of the open windows."""
        with self._lock:
            span, self._span = self._span, None
            if span is None or not self._windows:
                return
            if self._anything_to_read():
                self._tick()
            started, reaped = span
            pids = reaped | {pid for pid, mark in self._tree.processes.items() if mark.first_seen >= started}
            for window in self._windows:
                window.leave_out |= pids

    def running(self) -> list[ProcessMark]:
        """The descendants running now, less ``helpers``, as just read: each one's ``own_peak`` is
        its peak, its ``rss`` less what it inherited its size now (``core.retained.children_size``)."""
        with self._lock:
            if not self._anything_to_read():
                return []
            self._tick()
            alive = self._tree.running - self.helpers
            return [mark for pid, mark in self._tree.processes.items() if pid in alive]

    # -- readings

    def _anything_to_read(self) -> bool:
        """A child, or descendants the last listing found (a grandchild outlives its parent)."""
        return self.platform.has_children() or bool(self._tree.descendants)

    def _start_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="tfmem-children", daemon=True)
            self._thread.start()
        self._wake.set()  # wakes the thread only where it sleeps: set already while it looks

    def _run(self) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                if not self._windows and time.monotonic() - self._last_closed >= IDLE_AFTER_S:
                    self._wake.clear()
                    continue
                found = bool(self._windows) and self._anything_to_read()
                if found:
                    self._tick()
            time.sleep(INTERVAL_S if found else LOOK_S)

    def _refresh(self) -> None:
        self._last_pid, self._refreshed = self.platform.processes_started(), time.monotonic()
        self._tree.refresh()

    def _tick(self) -> None:
        """Read every descendant; refresh their list first if a process was started anywhere."""
        if self.platform.processes_started() != self._last_pid or time.monotonic() - self._refreshed >= _REFRESH_S:
            self._refresh()
        if not self._read_tree():
            return
        alive = self._tree.running
        for window in self._windows:
            for pid in window.sizes_before.keys() & alive:
                window.largest[pid] = max(window.largest.get(pid, 0), self._tree.processes[pid].rss)
            in_span = self._span[0] if self._span is not None else float("inf")  # a first import's: not the window's
            own = [
                mark for pid, mark in self._tree.processes.items()
                if pid in alive and pid not in window.leave_out and window.started <= mark.last_seen
                and mark.first_seen < in_span
            ]
            if own and not window.oom_read:
                window.oom_before, window.oom_read = system.oom_kill_counter(), True
            window.seen.update(mark.pid for mark in own)
            window.sampled_sum = max(window.sampled_sum, sum(mark.own_size for mark in own))

    def _read_tree(self) -> bool:
        try:
            self._tree.read()
        except Exception:  # this process is the root: never gone; a /proc oddity is skipped
            return False
        return True

    def _reading(self, window: ChildWindow) -> ChildrenReading | None:
        pids = (window.seen | {pid for pid in self._reaped if pid not in window.leave_out}) - window.leave_out
        grew = {pid: largest - window.sizes_before[pid] for pid, largest in window.largest.items()
                if largest - window.sizes_before[pid] >= GREW_AT_LEAST}
        if not pids and not grew:
            return None
        oom = system.oom_kills_since(window.oom_before) if window.oom_read else None
        alive = self._tree.running
        figures = [self._figure(pid, pid in alive, oom) for pid in sorted(pids)]
        figures += [self._growth(pid, grown, pid in alive) for pid, grown in sorted(grew.items())]
        sampled_sum = window.sampled_sum
        books = ProcessBooks.from_environment()
        if books is not None:
            figures = [_net_of_books(figure, books, window.started) for figure in figures]
            # the sizes read at once counted the processes it started whole, their bookings too
            sampled_sum = max(0, sampled_sum - sum(figure.booked for figure in figures if not figure.running_before))
        marks = [self._tree.processes.get(pid) for pid in [*sorted(pids), *sorted(grew)]]
        combined, basis = _combined(figures, marks, sampled_sum)
        return ChildrenReading(tuple(figures), combined, basis, sampled_sum)

    def _figure(self, pid: int, running: bool, oom: system.OomKillCount | None) -> ChildFigure:
        mark = self._tree.processes.get(pid)
        reaped = self._reaped.get(pid)
        peak = mark.own_peak if mark is not None else 0
        # A process that waited for children of its own (a shell) reports their mark if larger.
        parent = any(other.parent == pid for other in self._tree.processes.values())
        exact_peak = None if parent else _exact_peak(mark, reaped)
        ended, oom_killed = None, False
        if reaped is not None:
            ending = self.platform.ending(reaped.returncode)
            if ending.signal is not None:
                count = None if oom is None else oom.count
                if ending.signal in ("SIGTERM", "SIGINT"):
                    ended = f"stopped by {ending.signal}"
                else:  # a test's child: whether tfmem sent it is not the question
                    cause = signal_cause(ending.signal, count, "this cgroup" if oom is None else oom.scope)
                    ended = f"killed by {ending.signal}: {cause}"
                oom_killed = killed_by_oom_killer(ending.signal, count)
            else:
                ended = ending.description
        command = UNREAD
        if mark is not None:
            command = f"fork of {mark.command}" if mark.fork_copy else mark.command
        return ChildFigure(
            pid, command, max(peak, exact_peak or 0), exact_peak is not None,
            mark.rss if mark is not None else 0, ended, running, oom_killed,
        )

    def _growth(self, pid: int, grown: int, running: bool) -> ChildFigure:
        """A process that was running as the window opened, by what it grew while it was open."""
        mark = self._tree.processes[pid]
        return ChildFigure(pid, mark.command, grown, False, mark.rss, None, running, running_before=True)

    # -- reaping

    def _install_waitpid(self) -> None:
        if self._waitpid is None and self.platform.reaps_with_peak:
            self._waitpid = os.waitpid
            os.waitpid = self._waitpid_through_wait4

    def _restore_waitpid(self) -> None:
        if self._waitpid is not None and os.waitpid == self._waitpid_through_wait4:
            os.waitpid = self._waitpid
        self._waitpid = None

    def _waitpid_through_wait4(self, pid: int, options: int) -> tuple[int, int]:
        """``os.waitpid``, done by the platform's wait (``wait4``) to learn the reaped process's mark.

        A blocking wait for a process that still runs (``subprocess.run`` waits while its
        program works) reads the tree until the process ends, every ``WAIT_READ_S`` at first,
        then every ``INTERVAL_S``, so that a process living a few tens of milliseconds is read
        at its peak rather than found only as it is reaped. A wait that does not block reads the
        tree before it (at most every ``WAIT_READ_S``)."""
        if os.getpid() != self._tree.pid:  # a fork of this process (a pool's worker): plain waitpid
            reaped_pid, status, _ = self.platform.wait_with_peak(pid, options)
            return reaped_pid, status
        if options & os.WNOHANG:
            self._read_before_reaping(pid)
            return self._reap(pid, options)
        began = time.monotonic()
        while True:
            self._read_before_reaping(pid)
            reaped_pid, status = self._reap(pid, options | os.WNOHANG)
            if reaped_pid != 0:
                return reaped_pid, status
            if not self._windows:  # the last window closed meanwhile: nothing to read for
                return self._reap(pid, options)
            time.sleep(WAIT_READ_S if time.monotonic() - began < WAIT_READ_FOR_S else INTERVAL_S)

    def _read_before_reaping(self, pid: int) -> None:
        """Read the tree while a window is open, ``pid`` in it (a process started since the last
        listing is listed first); not again within ``WAIT_READ_S`` of the last such reading."""
        with self._lock:
            if not self._windows or time.monotonic() - self._read_for_wait < WAIT_READ_S:
                return
            if pid > 0 and pid not in self._tree.descendants:
                self._refresh()
            self._tick()
            self._read_for_wait = time.monotonic()

    def _reap(self, pid: int, options: int) -> tuple[int, int]:
        reaped_pid, status, max_rss = self.platform.wait_with_peak(pid, options)
        if reaped_pid > 0:
            with self._lock:
                if self._windows:
                    returncode = self.platform.returncode(status)
                    self._reaped[reaped_pid] = _Reaped(returncode, max_rss, host.high_water_mark() or 0)
                if self._span is not None:
                    self._span[1].add(reaped_pid)
        return reaped_pid, status


def _net_of_books(figure: ChildFigure, books: ProcessBooks, since: float) -> ChildFigure:
    """``figure`` less what its process booked apart while the window saw it (a kernel's start and
    first imports): those are the process's, paid once, not the window's."""
    bookings = books.booked(figure.pid, since, started_in_window=not figure.running_before)
    if not bookings:
        return figure
    booked = sum(booking.bytes for booking in bookings)
    said = tuple((booking.what, booking.bytes) for booking in bookings)
    return dataclasses.replace(figure, peak=max(0, figure.peak - booked), booked=booked, booked_as=said)


def _exact_peak(mark: ProcessMark | None, reaped: _Reaped | None) -> int | None:
    """The process's own peak from ``ru_maxrss`` where it can be told apart from what it inherited:
    a fork copy's mark less its inherited size; a program's mark where it exceeds the parent's own
    mark (the kernel keeps the larger of the two across ``exec``)."""
    if reaped is None:
        return None
    if mark is not None and mark.fork_copy:
        return max(0, reaped.max_rss - mark.inherited)
    if reaped.max_rss > reaped.parent_mark:
        return reaped.max_rss
    return None


def _combined(
    figures: list[ChildFigure], marks: list[ProcessMark | None], sampled_sum: int = 0
) -> tuple[int, str]:
    """The processes' combined figure: the largest sum of the peaks of processes alive together,
    never below what their sizes read at once added up to (``sampled_sum``: a process never read,
    or spans seen apart, can hide an overlap the readings saw)."""
    never_read = (float("inf"), float("inf"))  # ended before its first reading: alone, as far as known
    spans = [
        ((mark.first_seen, mark.last_seen) if mark is not None else never_read) + (figure.peak,)
        for figure, mark in zip(figures, marks)
    ]
    best, overlapped = 0, False
    for start, _, _ in spans:
        together = [peak for first, last, peak in spans if first <= start <= last]
        overlapped |= len(together) > 1
        best = max(best, sum(together))
    best = max(best, max((figure.peak for figure in figures), default=0))
    if sampled_sum > best:
        return sampled_sum, "sampled together"
    return best, "marks summed" if overlapped else "one at a time"


_watch: ChildWatch | None = None
_sizes: ForkSizes | None = None


# Pages where the forks of a helper this process started tell their sizes (``also_told``).
_told_elsewhere: list[ForkSizes] = []


def _fork_sizes() -> ForkSizes:
    """One per process and its forks: the page is shared, and a fork hook cannot be taken back."""
    global _sizes
    if _sizes is None:
        _sizes = ForkSizes(platforms.current().current_size).tell_forks()
    return _sizes


def _told_elsewhere_size(pid: int) -> int | None:
    """The size a fork of a helper's told into a page given to ``also_told``, if it did."""
    for sizes in _told_elsewhere:
        size = sizes.size(pid)
        if size is not None:
            return size
    return None


@contextmanager
def also_told(sizes: ForkSizes) -> Iterator[None]:
    """While open, the child watch also reads the sizes that forks tell into ``sizes``: the
    forks of a process this one started (``batch_trials``'s server), which share its pages."""
    _told_elsewhere.append(sizes)
    try:
        yield
    finally:
        _told_elsewhere.remove(sizes)


def watch() -> ChildWatch:
    """This process's ``ChildWatch``."""
    global _watch
    if _watch is None or _watch._tree.pid != os.getpid() or _watch.platform is not platforms.current():
        _watch = ChildWatch()  # a fork (an isolated test) watches its own; so does another platform
    return _watch
