"""``--tfmem-session-limit``: the most a process of the session may hold between two tests.

After each test's teardown, the process that ran it (the session's own, a pytest-xdist
worker, or a replacement process) takes what it holds from the boundary the session's books
read there (``manager(config).last_boundary``: its RSS after the collection and ``malloc_trim``
that give every test its retained figure; one reading per boundary), or, where no books are
kept for the test, reads it itself (``read_level``: its RSS once the heap glibc keeps free went
back to the OS). Past the limit, with tests left to run, the process has
*crossed* it: it finishes every fixture it still holds (as pytest would after its last test,
within that test's teardown, so an error there is that test's), and the session runs the
tests that remain in a fresh process (``recycle.py``, ``replacement.py``), replaced in turn
when it crosses the limit itself. Crossing is no failure; the crossing's teardown report
carries a ``LimitCrossing`` that the session's summary shows: when, at what size, and which
tests had left the most in that process (their retained figures; the growth of its level over
the test where it has none).

``auto`` is the process's level at its first test plus 40% of the room left above it in its
share of the memory limit it runs under (the cgroup's limit, else physical memory; divided
evenly among pytest-xdist workers). Under half, because the process that crossed keeps what
it grew (module globals, caches) while its replacement grows beside it, and each may pass the
limit by what one test leaves.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass
from typing import Any

import pytest

from pytest_tfmem.core import processes, pytest_internals, settings
from pytest_tfmem.core.features import Teardown, TeardownStep
from pytest_tfmem.core.manager import manager
from pytest_tfmem.core.retained import Boundary
from pytest_tfmem.errors import MemoryLimitWarning
from pytest_tfmem.probes import host
from pytest_tfmem.probes.system import MemoryLimit
from pytest_tfmem.units import SIZE_FORMS, format_size, parse_size

AUTO = "auto"
AUTO_SHARE_OF_ROOM = 0.4
TOP_LEFT = 3  # tests named as having left the most
CROSSING_PROPERTY = "tfmem_limit_crossing"  # on the teardown report of the test after which it happened
STARTED_PROPERTY = "tfmem_replacement_started"  # on the setup report of a replacement's first test


def parse_session_limit(value: object, what: str) -> int | str:
    """A size, or ``auto``."""
    if str(value).strip().lower() == AUTO:
        return AUTO
    try:
        return parse_size(value, what=what)
    except ValueError as error:
        raise ValueError(f"{error}; or {AUTO}") from None


SESSION_LIMIT = settings.Option(
    "session_limit",
    "after a test's teardown, when the process (or pytest-xdist worker) holds more than this, run "
    "the remaining tests in a fresh process (a fork of the template made before the first test), "
    f"replaced in turn when it holds more; {SIZE_FORMS}; or {AUTO}: the process's size at its first "
    "test plus 40% of the room left under the memory limit (cgroup, else physical memory; shared "
    "among pytest-xdist workers)",
    parse_session_limit,
)


def auto_limit(start: int, memory: MemoryLimit, workers: int) -> int:
    """``auto`` for a process that held ``start`` bytes at its first test (module docstring)."""
    share = memory.bytes // max(1, workers)
    return start + int(max(0, share - start) * AUTO_SHARE_OF_ROOM)


def read_level() -> int:
    """What this process holds between two tests: RSS once glibc's free heap went back to the OS."""
    host.return_freed_heap()
    return host.current_rss()


@dataclass(frozen=True)
class LimitCrossing:
    """A process of the session held more than the limit after a test's teardown."""

    nodeid: str  # the test after whose teardown
    held: int  # bytes, then
    limit: int
    start: int  # what the process held before its first test
    tests: int  # tests it had run
    top: tuple[tuple[str, int], ...]  # (node id, bytes retained) of the tests that had left the most
    replacement: int  # 0: the session's own process (or worker); N: its Nth replacement process
    pid: int
    worker: str | None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LimitCrossing:
        data = json.loads(text)
        return cls(**{**data, "top": tuple((nodeid, left) for nodeid, left in data["top"])})


@dataclass(frozen=True)
class ReplacementStarted:
    """A replacement process started, and how long it took to be ready for its first test."""

    number: int
    pid: int
    worker: str | None
    seconds: float  # from the request to the end of its collection
    method: str  # "fork" (of the template) or "spawn" (a fresh interpreter)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ReplacementStarted:
        return cls(**json.loads(text))


_CROSSED = pytest.StashKey[LimitCrossing]()


class LimitWatch:
    """The plugin that reads this process's level after each test's teardown and tells when
    it passes the limit (in the session's process or worker, and in each replacement)."""

    def __init__(
        self,
        limit: int | Callable[[int], int],
        replacement: int,
        pid: int,
        worker: str | None,
        read: Callable[[], int] = read_level,
    ) -> None:
        self._limit = limit  # bytes, or how to make them from the level at the first test (auto)
        self.limit: int | None = limit if isinstance(limit, int) else None
        self.replacement = replacement
        self.pid = pid
        self.worker = worker
        self._read = read
        self.start: int | None = None
        self._last = 0
        self.tests = 0
        self.top: list[tuple[int, str]] = []  # (bytes left, node id), the largest first
        self.crossing: LimitCrossing | None = None
        self._boundary: Boundary | None = None  # the books' last boundary, once used

    def pytest_runtest_logstart(self) -> None:
        if self.start is None:
            self.start = self._last = self._read()
            self.limit = self._limit if isinstance(self._limit, int) else self._limit(self.start)
            if self.replacement == 0 and self.start >= self.limit:
                warnings.warn(
                    MemoryLimitWarning(
                        f"pytest-tfmem: the process holds {format_size(self.start)} before its first test, more "
                        f"than the session limit {format_size(self.limit)}: every test will run in a fresh process"
                    ),
                    stacklevel=1,
                )

    def pytest_configure(self, config: pytest.Config) -> None:
        """Registered before or after pytest configures (historic): its step after the books'."""
        manager(config).add_teardown_step(TeardownStep(Teardown.LIMIT, self._after_teardown))

    def _after_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        if self.start is None or self.limit is None:  # a test run without its logstart (not by pytest)
            return
        level, left = self._level_after(item)
        self.tests += 1
        self.top = sorted([*self.top, (left, item.nodeid)], reverse=True)[:TOP_LEFT]
        self._last = level
        if nextitem is None or self.crossing is not None or level <= self.limit:
            return
        self.crossing = LimitCrossing(
            nodeid=item.nodeid,
            held=level,
            limit=self.limit,
            start=self.start,
            tests=self.tests,
            top=tuple((nodeid, left) for left, nodeid in self.top),
            replacement=self.replacement,
            pid=self.pid,
            worker=self.worker,
        )
        item.stash[_CROSSED] = self.crossing
        pytest_internals.teardown_exact(item, None)  # no test runs here any more: free what it can

    def _level_after(self, item: pytest.Item) -> tuple[int, int]:
        """What the process holds after ``item``'s teardown, and what the test left: the books'
        boundary and retained figure where they read this teardown, else a reading of its own."""
        boundary = manager(item.config).last_boundary
        fresh = boundary is not None and boundary is not self._boundary and boundary.nodeid == item.nodeid
        self._boundary = boundary
        if not fresh:
            level = self._read()
            return level, level - self._last
        assert boundary is not None
        level = boundary.level.rss
        return level, boundary.retained.bytes if boundary.retained is not None else level - self._last

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        crossing = item.stash.get(_CROSSED, None) if call.when == "teardown" else None
        if crossing is not None:
            report.user_properties.append((CROSSING_PROPERTY, crossing.to_json()))
        return report


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def process_name(replacement: int, worker: str | None) -> str:
    own = f"worker {worker}" if worker else "the session's process"
    return own if replacement == 0 else processes.replacement_label(replacement, worker)


class LimitSummary:
    """What the session saw of its limit: crossings and replacement starts, from the reports."""

    def __init__(self, setting: int | str) -> None:
        self.setting = setting
        self.crossings: list[LimitCrossing] = []
        self.started: list[ReplacementStarted] = []

    def read(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == CROSSING_PROPERTY:
                self.crossings.append(LimitCrossing.from_json(str(value)))
            elif name == STARTED_PROPERTY:
                self.started.append(ReplacementStarted.from_json(str(value)))

    def title(self) -> str:
        if self.setting == AUTO:
            limits = sorted({crossing.limit for crossing in self.crossings})
            shown = ", ".join(format_size(limit) for limit in limits) if limits else "not passed"
            return f"tfmem: session limit {AUTO} ({shown})"
        assert isinstance(self.setting, int)
        return f"tfmem: session limit {format_size(self.setting)}"

    def lines(self) -> list[str]:
        if not self.crossings:
            return ["no process of the session held more than the limit after a test"]
        lines = []
        for crossing in self.crossings:
            name = process_name(crossing.replacement, crossing.worker)
            then = "the tests that remained ran on in a fresh process" if crossing.replacement == 0 else "replaced"
            lines.append(
                f"{name} (pid {crossing.pid}) held {format_size(crossing.held)} after the teardown of "
                f"{crossing.nodeid} (its {_ordinal(crossing.tests)} test; {format_size(crossing.start)} "
                f"before its first), above {format_size(crossing.limit)}: {then}"
            )
            left = ", ".join(f"{nodeid} {format_size(size, signed=True)}" for nodeid, size in crossing.top)
            lines.append(f"  left the most there: {left}")
        if self.started:
            seconds = [started.seconds for started in self.started]
            methods = sorted({started.method for started in self.started})
            how = " and ".join("forks of the template" if m == "fork" else "fresh interpreters" for m in methods)
            lines.append(
                f"{len(self.started)} replacement process(es) started ({how}), ready in "
                f"{sum(seconds) / len(seconds):.2f} s on average, {max(seconds):.2f} s at most; "
                "crossing the limit fails no test"
            )
        return lines


def limit_setting(config: pytest.Config) -> int | str | None:
    """``--tfmem-session-limit`` as given: bytes, ``auto`` or ``None``."""
    value: Any = settings.read_option(config, SESSION_LIMIT)[0]
    return value
