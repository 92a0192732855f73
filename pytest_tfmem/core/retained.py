"""What each test leaves behind, and the session's account: readings at test boundaries.

Between two tests the process is read once (after the garbage collection and ``malloc_trim``
that open a measurement window): a ``Level``. The level after one test's teardown is the level
before the next one's setup, so a test's *retained* figure, the difference of the levels at its
two ends, adds up with its neighbours' to the session's growth by construction. What changed
the level inside a test's span but is not the test's (a fixture of module, class, package or
session scope set up or torn down there, a first import, TensorFlow's runtime starting, a
framework's first use paid before the first test) is a
``Booking`` of its own, left out of the test's figure, so the books still balance.

Two views, so that tensors TensorFlow took back into its pool do not count and tensors still
alive do: host memory outside TensorFlow's pool (RSS less the pool, estimated from the highest
level TensorFlow's CPU allocator ever had in use: its pool never shrinks; see ``ResidentPool``)
and TensorFlow's CPU allocator in use. A test's headline ``bytes`` is their sum. The RSS growth of the session is
the tests' and bookings' figures, plus the growth of the pool's free part (memory TensorFlow
keeps for reuse), plus what grew between measured tests (tests not measured, ...).

Pure values and arithmetic; ``current_level`` is the one reader.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any

import pytest

from pytest_tfmem.core import measure
from pytest_tfmem.core.confirm import OneTimeCosts
from pytest_tfmem.probes import children, host
from pytest_tfmem.probes.process_books import ProcessBooks
from pytest_tfmem.units import format_size

TEST, FIXTURE, IMPORT, RUNTIME, FIRST_USE = "test", "fixture", "first import", "runtime", "first use"
RERUN = "re-run"  # what a test's body kept when tfmem ran it a second time (``core.confirm``)
# On a test's item: its re-run's booking, which the session's books take out of its retained figure.
RERUN_BOOKING = pytest.StashKey["Booking"]()
NOTABLE_RETAINER = 2**20  # a retainer that left (or held) less is not listed among the top


@dataclass(frozen=True)
class Level:
    """The process at one test boundary, in bytes."""

    rss: int
    tf_in_use: int = 0  # TensorFlow's CPU allocator, in use
    tf_pool: int = 0  # the pool's estimate: the highest level ever in use
    children: int = 0  # the processes this one started that are still running (``probes.children``)
    # Those processes one by one: (pid, size), as ``children`` counts them; not written out.
    processes: tuple[tuple[int, int], ...] = field(default=(), compare=False, repr=False)

    @property
    def total(self) -> int:
        """This process's RSS and its running descendants' own sizes."""
        return self.rss + self.children

    @property
    def outside_pool(self) -> int:
        """Host memory outside TensorFlow's pool, the running descendants' included."""
        return self.total - self.tf_pool

    @property
    def held(self) -> int:
        """Host memory outside TensorFlow's pool plus tensors alive in it."""
        return self.outside_pool + self.tf_in_use

    @property
    def pool_free(self) -> int:
        return self.tf_pool - self.tf_in_use

    def to_dict(self) -> dict[str, int]:
        return {"rss": self.rss, "tf_in_use": self.tf_in_use, "tf_pool": self.tf_pool, "children": self.children}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Level:
        return cls(
            int(data["rss"]), int(data.get("tf_in_use", 0)), int(data.get("tf_pool", 0)), int(data.get("children", 0))
        )


# The name of the view of the running processes a process started, where a view of them is read
# beside the process's own (leak checks' levels, traces' timelines).
CHILDREN_VIEW = "children"


def children_size(leave_out: Collection[int] = ()) -> int:
    """What the running descendants (less those in ``leave_out``) hold above what they inherited
    (0, at the cost of one system call, when there are none)."""
    return sum(size for pid, size in running_sizes() if pid not in leave_out)


def running_sizes() -> tuple[tuple[int, int], ...]:
    """Each running descendant's size above what it inherited, less what it booked apart itself
    (``probes.process_books``: a notebook kernel's start and first imports, paid once by it)."""
    marks = children.watch().running()
    books = ProcessBooks.from_environment() if marks else None
    return tuple(
        (mark.pid, max(0, mark.own_size - (books.booked_bytes(mark.pid) if books is not None else 0)))
        for mark in marks
    )


def running_children() -> frozenset[int]:
    """The running descendants' pids (tfmem's own left out)."""
    return frozenset(mark.pid for mark in children.watch().running())


def current_level() -> Level:
    """The process now (no collection: see ``read_collected_level``)."""
    allocator = measure.probes().pooled_host_view()
    processes = running_sizes()
    children_total = sum(size for _, size in processes)
    if allocator is None:
        return Level(host.current_rss(), children=children_total, processes=processes)
    allocator.peak()  # the highest level since the last reset counts towards the pool
    in_use = allocator.current()
    return Level(host.current_rss(), in_use, allocator.pool_estimate, children_total, processes)


class ResidentPool:
    """TensorFlow's pool as resident memory, from one boundary reading to the next.

    The allocator's highest level in use overstates what the pool holds in RSS: it counts chunks
    rounded up, and pages never touched (a 20 MiB tensor raised it by 32 MiB and RSS by 20 MiB).
    So between two readings the resident pool grows by the rise of that highest level, but by no
    more than RSS grew; it never shrinks (TensorFlow does not hand its pool back).
    """

    def __init__(self) -> None:
        self._highest = 0
        self._resident = 0
        self._rss: int | None = None

    def level(self, reading: Level, *, keep: bool = True) -> Level:
        """``reading`` (whose ``tf_pool`` is the allocator's highest level) with the resident pool;
        ``keep=False`` leaves the estimate as it was (a look between two boundaries)."""
        resident = self._resident
        if reading.tf_pool > self._highest:
            rise = reading.tf_pool - self._highest
            resident += rise if self._rss is None else min(rise, max(0, reading.rss - self._rss))
        if keep:
            self._highest = max(self._highest, reading.tf_pool)
            self._resident, self._rss = resident, reading.rss
        return Level(reading.rss, reading.tf_in_use, resident, reading.children, reading.processes)


def read_collected_level(between_tests: bool = False) -> Level:
    """The process once its garbage was collected: freed heap handed back (``between_tests``: where
    it pays, ``probes.host.HeapTrims``), then read."""
    if between_tests:
        host.trims().between_tests()
    else:
        host.return_freed_heap()
    return current_level()


@dataclass(frozen=True)
class Booking:
    """A change of the level inside a test's span that is not the test's: ``kind`` (``FIXTURE``,
    ``IMPORT``, ``RUNTIME``, ``FIRST_USE``, ``RERUN``), ``name`` (``big_table (module scope)``, ``tensorflow``,
    ``Keras's first use``), ``detail`` (``setup``, ``teardown``)."""

    kind: str
    name: str
    detail: str
    host_bytes: int
    tf_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.host_bytes + self.tf_bytes

    @classmethod
    def between(cls, kind: str, name: str, detail: str, before: Level, after: Level) -> Booking:
        return cls(kind, name, detail, after.outside_pool - before.outside_pool, after.tf_in_use - before.tf_in_use)


@dataclass(frozen=True)
class Retained:
    """What one test left behind: the levels at its two ends, less its span's bookings.

    ``seq`` orders a process's tests; ``worker`` names the process that ran it when that is not the
    session's own (``processes.process_label``: a pytest-xdist worker, a replacement process);
    ``stayed`` says what stayed (for a test over the threshold) and ``named_bytes`` how much
    of it the named holders account for (``None`` where it was not weighed); ``cleared`` what
    ``--tfmem-clear-session`` gave back after it (``None`` when it is off).
    """

    before: Level
    after: Level
    bookings: tuple[Booking, ...] = ()
    seq: int = 0
    worker: str | None = None
    stayed: tuple[str, ...] = ()
    cleared: int | None = None
    named_bytes: int | None = None
    cleared_by: tuple[str, ...] = ()  # what the clearing did, with its cost where it has one

    @property
    def host_bytes(self) -> int:
        return self.after.outside_pool - self.before.outside_pool - sum(b.host_bytes for b in self.bookings)

    @property
    def tf_bytes(self) -> int:
        return self.after.tf_in_use - self.before.tf_in_use - sum(b.tf_bytes for b in self.bookings)

    @property
    def bytes(self) -> int:
        """The headline: host memory outside TensorFlow's pool plus TensorFlow tensors, kept."""
        return self.host_bytes + self.tf_bytes

    def to_dict(self) -> dict[str, Any]:
        """Its fields as JSON values (field by field: see ``Measurement.to_dict``), with the figures."""
        data = dict(vars(self))
        data.update(
            before=self.before.to_dict(),
            after=self.after.to_dict(),
            bookings=[dict(vars(booking)) for booking in self.bookings],
            stayed=list(self.stayed),
            cleared_by=list(self.cleared_by),
            bytes=self.bytes,
            host_bytes=self.host_bytes,
            tf_bytes=self.tf_bytes,
        )
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Retained:
        return cls(
            before=Level.from_dict(data["before"]),
            after=Level.from_dict(data["after"]),
            bookings=tuple(Booking(**booking) for booking in data.get("bookings", ())),
            seq=int(data.get("seq", 0)),
            worker=data.get("worker"),
            stayed=tuple(data.get("stayed", ())),
            cleared=data.get("cleared"),
            named_bytes=data.get("named_bytes"),
            cleared_by=tuple(data.get("cleared_by", ())),
        )


@dataclass(frozen=True)
class Boundary:
    """The process after a measured test's teardown (``nodeid``), read once: the level the next
    test starts from, and the test's retained figure (``None`` where the test got none: not
    measured after all, its setup skipped)."""

    nodeid: str
    level: Level
    retained: Retained | None = None


@dataclass(frozen=True)
class Retainer:
    """One entry of the account's top list: a test, a fixture, a first import, with what it
    left (``bytes``) and what stayed or what it was (``what``). ``held`` is what a fixture
    held from its setup to its teardown (its ``bytes`` is what it left after its teardown)."""

    kind: str
    name: str
    bytes: int
    what: str = ""
    held: int | None = None
    worker: str | None = None

    @property
    def weight(self) -> int:
        """What ranks it: what it left, or for a fixture what it held, whichever is more."""
        return max(self.bytes, self.held or 0)


def _share(explained: int, growth: int) -> float | None:
    """The share of ``growth`` that ``explained`` accounts for, at most all of it: what was freed
    between tests (``between_tests`` below zero) makes the parts add up to more than the growth."""
    return None if growth <= 0 else min(explained, growth) / growth


def _heaviest_first(retainer: Retainer) -> tuple[int, str]:
    return -retainer.weight, retainer.name


HEAVIEST_KEPT = 10  # the most tests any list of retainers names (the terminal's 5, ``tfmem plot --top``'s 10)


class ProcessAccount:
    """One process's books (the session's, a pytest-xdist worker's, a replacement process's), kept
    as running figures while its measured tests' ``Retained`` are added, in any order: what the
    account says needs no test's figures but the first's and last's levels (by ``seq``), sums,
    the bookings (a few per fixture or import, not per test) and the heaviest tests. So a session's
    books stay the same size however many tests it runs."""

    def __init__(self, worker: str | None) -> None:
        self.worker = worker
        self.tests = 0  # how many measured tests were added, those skipped left out
        self.skipped = 0  # measured tests that were skipped (``pytest.skip`` in the body): in the books, not counted
        self.tests_bytes = 0
        self._first: tuple[int, Level] | None = None  # (seq, the level before the first test)
        self._last: tuple[int, Level] | None = None  # (seq, the level after the last test)
        self._held_before = 0  # the sums of ``Level.held`` before and after each test
        self._held_after = 0
        self._bookings: list[tuple[int, str, Booking]] = []  # (seq, node id, booking)
        self._cleared: int | None = None
        self._cleared_by: dict[str, None] = {}  # what the clearing did, in the order first seen
        self.weighed_tests = 0  # tests whose kept memory was weighed against the holders named
        self.weighed_bytes = 0  # what they kept
        self.named_bytes = 0  # what the holders named account for of it
        self._heaviest: list[Retainer] = []  # the heaviest tests, at least the ``HEAVIEST_KEPT`` heaviest

    def add(self, nodeid: str, retained: Retained, skipped: bool = False) -> None:
        if skipped:
            self.skipped += 1
        else:
            self.tests += 1
        self.tests_bytes += retained.bytes
        if self._first is None or retained.seq < self._first[0]:
            self._first = (retained.seq, retained.before)
        if self._last is None or retained.seq >= self._last[0]:
            self._last = (retained.seq, retained.after)
        self._held_before += retained.before.held
        self._held_after += retained.after.held
        self._bookings += [(retained.seq, nodeid, booking) for booking in retained.bookings]
        if retained.cleared is not None:
            self._cleared = (self._cleared or 0) + retained.cleared
        self._cleared_by.update(dict.fromkeys(retained.cleared_by))
        if retained.named_bytes is not None and retained.bytes > 0:
            self.weighed_tests += 1
            self.weighed_bytes += retained.bytes
            self.named_bytes += min(retained.named_bytes, retained.bytes)
        self._heaviest.append(Retainer(TEST, nodeid, retained.bytes, "; ".join(retained.stayed), worker=self.worker))
        if len(self._heaviest) >= 2 * HEAVIEST_KEPT:  # sorted and cut now and then: a sort per test would cost more
            self._heaviest = sorted(self._heaviest, key=_heaviest_first)[:HEAVIEST_KEPT]

    @property
    def start(self) -> Level:
        assert self._first is not None, "an account of no test"
        return self._first[1]

    @property
    def end(self) -> Level:
        assert self._last is not None, "an account of no test"
        return self._last[1]

    @property
    def growth(self) -> int:
        """RSS at the end less RSS at the start, the running descendants' included."""
        return self.end.total - self.start.total

    def bookings(self, kind: str) -> list[tuple[str, Booking]]:
        """The bookings of ``kind`` with their tests' node ids, in the order the tests ran."""
        ordered = sorted(self._bookings, key=lambda entry: entry[0])
        return [(nodeid, booking) for _, nodeid, booking in ordered if booking.kind == kind]

    def booked_bytes(self, kind: str) -> int:
        return sum(b.bytes for _, b in self.bookings(kind))

    @property
    def pool_free_growth(self) -> int:
        """Growth of TensorFlow's pool's free part: memory TensorFlow keeps for reuse."""
        return self.end.pool_free - self.start.pool_free

    @property
    def between_tests(self) -> int:
        """What grew between one measured test's end and the next one's start: the sum over
        neighbours of (next before - this after) is every test's before but the first's, less
        every test's after but the last's."""
        return (self._held_before - self.start.held) - (self._held_after - self.end.held)

    @property
    def explained(self) -> int:
        """The growth the tests, the bookings and TensorFlow's pool account for."""
        return self.growth - self.between_tests

    @property
    def explained_share(self) -> float | None:
        return _share(self.explained, self.growth)

    @property
    def has_pool(self) -> bool:
        """TensorFlow's CPU allocator was read in this process (a pool exists to account for)."""
        return self.end.tf_pool > 0 or self.start.tf_pool > 0

    @property
    def cleared(self) -> int | None:
        return self._cleared

    @property
    def cleared_by(self) -> list[str]:
        return list(self._cleared_by)

    def retainers(self) -> list[Retainer]:
        """The heaviest tests, every fixture and first import, with what they left, largest first."""
        found = list(self._heaviest)
        fixtures: dict[str, list[Booking]] = {}
        for _, booking in self.bookings(FIXTURE):
            fixtures.setdefault(booking.name, []).append(booking)
        for name, bookings in fixtures.items():
            held = sum(b.bytes for b in bookings if b.detail == "setup")
            left = sum(b.bytes for b in bookings)
            what = f"held {format_size(held, signed=True)} from its setup to its teardown"
            found.append(Retainer(FIXTURE, name, left, what, held, self.worker))
        for kind in (IMPORT, RUNTIME, FIRST_USE, RERUN):
            found += [Retainer(kind, b.name, b.bytes, b.detail, worker=self.worker) for _, b in self.bookings(kind)]
        return sorted(found, key=_heaviest_first)

    def to_dict(self) -> dict[str, Any]:
        fixtures, imports, runtime, first_use, reruns = (
            [{"test": nodeid, **asdict(b), "bytes": b.bytes} for nodeid, b in self.bookings(kind)]
            for kind in (FIXTURE, IMPORT, RUNTIME, FIRST_USE, RERUN)
        )
        return {
            "worker": self.worker,
            "tests": self.tests,
            "skipped": self.skipped,
            "start_bytes": self.start.total,
            "end_bytes": self.end.total,
            "growth_bytes": self.growth,
            "start": self.start.to_dict(),
            "end": self.end.to_dict(),
            "tests_retained_bytes": self.tests_bytes,
            "fixtures": fixtures,
            "imports": imports,
            "runtime": runtime,
            "first_use": first_use,
            "reruns": reruns,
            "tf_pool_free_growth_bytes": self.pool_free_growth,
            "between_tests_bytes": self.between_tests,
            "explained_bytes": self.explained,
            "explained_share": self.explained_share,
            "cleared_bytes": self.cleared,
        }


class SessionAccount:
    """The whole session: one ``ProcessAccount`` per process that ran tests (pytest-xdist workers,
    replacement processes), merged; fed one test at a time, in any order."""

    def __init__(self) -> None:
        self._by_worker: dict[str | None, ProcessAccount] = {}
        self.one_time = OneTimeCosts()  # what re-runs told apart from the tests' own need (``core.confirm``)

    def add(self, nodeid: str, retained: Retained, skipped: bool = False) -> None:
        process = self._by_worker.get(retained.worker)
        if process is None:
            process = self._by_worker[retained.worker] = ProcessAccount(retained.worker)
        process.add(nodeid, retained, skipped)

    @property
    def processes(self) -> list[ProcessAccount]:
        """The processes' accounts, by worker name (the session's own process first)."""
        return sorted(self._by_worker.values(), key=lambda process: process.worker or "")

    def total(self, figure: Callable[[ProcessAccount], int]) -> int:
        return sum(figure(process) for process in self.processes)

    @property
    def growth(self) -> int:
        return self.total(lambda p: p.growth)

    @property
    def explained_share(self) -> float | None:
        return _share(self.total(lambda p: p.explained), self.growth)

    @property
    def cleared(self) -> int | None:
        figures = [p.cleared for p in self.processes if p.cleared is not None]
        return sum(figures) if figures else None

    @property
    def cleared_by(self) -> list[str]:
        """What the clearing did in any test, in the order first seen."""
        return list(dict.fromkeys(action for process in self.processes for action in process.cleared_by))

    def top_retainers(self, count: int, at_least: int = NOTABLE_RETAINER) -> list[Retainer]:
        """Who had left the most (or, for a fixture, held), at least ``at_least``, over every process."""
        every = [r for p in self.processes for r in p.retainers() if r.weight >= at_least]
        return sorted(every, key=_heaviest_first)[:count]

    def to_dict(self) -> dict[str, Any] | None:
        if not self.processes:  # isolated tests only: what re-runs told apart, where any
            return {"one_time_costs": self.one_time.to_dict()} if self.one_time.count else None
        return {
            "one_time_costs": self.one_time.to_dict(),
            "start_bytes": self.total(lambda p: p.start.total),
            "end_bytes": self.total(lambda p: p.end.total),
            "growth_bytes": self.growth,
            "tests_retained_bytes": self.total(lambda p: p.tests_bytes),
            "fixtures_bytes": self.total(lambda p: p.booked_bytes(FIXTURE)),
            "imports_bytes": self.total(lambda p: p.booked_bytes(IMPORT)),
            "runtime_bytes": self.total(lambda p: p.booked_bytes(RUNTIME)),
            "first_use_bytes": self.total(lambda p: p.booked_bytes(FIRST_USE)),
            "reruns_bytes": self.total(lambda p: p.booked_bytes(RERUN)),
            "tf_pool_free_growth_bytes": self.total(lambda p: p.pool_free_growth),
            "between_tests_bytes": self.total(lambda p: p.between_tests),
            "explained_share": self.explained_share,
            "cleared_bytes": self.cleared,
            "workers": [process.to_dict() for process in self.processes],
        }

