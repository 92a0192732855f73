"""The session as a loop: what each measured test leaves behind, who holds it, the account.

The process is read at every boundary between measured tests (``core.retained``): once before
a test's setup, once after its teardown (that reading is the next test's start). A fixture of
module, class, package or session scope is read around its setup and its teardown, and what
those changed is booked to the fixture by name, not to the test in whose span it happened. A
test's retained figure goes on its record (so on its teardown report: it travels to the
pytest-xdist controller like every figure), and the checks on it (``--tfmem-max-retained``, a
baseline's retained figure) fail the test as an error at its teardown.

``--tfmem-clear-session`` cleans up after each test (Keras's ``clear_session``, TensorFlow's
default graph, a collection) and the summary says what the clearings freed in all, beside how
the process grew.

What other parts of a session read here: ``manager(config).last_boundary`` (a
``core.retained.Boundary``), the process after the last measured test's teardown with that
test's retained figure (read once; a limit on the process reads it rather than the process
again), and ``manager(config).reader(RetainedFigures).account()``, the books (who left the
most: ``top_retainers(n)``), fed one record at a time and the same size however many tests ran.
Books are kept wherever tests run one after the other (``processes.keeps_books``): the session's
process, pytest-xdist workers, replacement processes (their figures come back on the reports they
send); not in an isolated test's process.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_tfmem import frameworks
from pytest_tfmem.core import features, measure, processes, settings
from pytest_tfmem.core.confirm import REPRODUCED
from pytest_tfmem.core.features import Summary, Teardown, TeardownStep
from pytest_tfmem.core.manager import ARGUMENTS, RECORD, manager
from pytest_tfmem.core.pytest_internals import release_fixture_values
from pytest_tfmem.core.record import RetainedFigures, TestRecord, publish
from pytest_tfmem.core.retained import (
    FIRST_USE,
    FIXTURE,
    IMPORT,
    RERUN_BOOKING,
    RUNTIME,
    Booking,
    Boundary,
    Level,
    ResidentPool,
    Retained,
    current_level,
    read_collected_level,
)
from pytest_tfmem.core.verdict import Verdict, what_kept_line
from pytest_tfmem.errors import TfmemFailure, failure_for
from pytest_tfmem.probes import children, host
from pytest_tfmem.session.stayed import Snapshot, Stayed, Watcher
from pytest_tfmem.session.summary import account_lines
from pytest_tfmem.units import SIZE_FORMS, format_limit, format_size

DEFAULT_STAYED_THRESHOLD = "16MB"
# What only a test's first run kept, where a re-run told it apart (a booking of kind ``FIRST_USE``).
ONE_TIME_COST = "one-time costs of first runs"
# The line under the account's heading: what its figures are, and where they are told in full.
HOW_TO_READ = (
    "how to read it: each process from before its first measured test to after its last, the growth split "
    "into what its tests kept and what was booked apart (fixtures, first imports, the frameworks' start and "
    "first use); then who left the most (docs/session.md)"
)

MAX_RETAINED = settings.Option(
    "max_retained",
    f"a test that leaves more than this behind after its teardown fails there (marker: max_retained=; "
    f"None exempts); {SIZE_FORMS}",
    settings.parse_optional_size,
)
STAYED_THRESHOLD = settings.Option(
    "stayed_threshold",
    f"say what stayed after a test that leaves more than this (default {DEFAULT_STAYED_THRESHOLD})",
    settings.parse_optional_size,
    settings.parse_optional_size(DEFAULT_STAYED_THRESHOLD, "default"),
)
CLEAR_SESSION = settings.Option(
    "clear_session",
    "after each test: keras.backend.clear_session() (Keras 3 and tf-keras, where loaded), TensorFlow's "
    "default graph reset, a garbage collection; the summary says what the clearings freed (default off)",
    settings.parse_bool,
    False,
    flag=True,
)
OPTIONS = [MAX_RETAINED, STAYED_THRESHOLD, CLEAR_SESSION]
_BOOKS = pytest.StashKey["SessionBooks"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser, OPTIONS)


TFMEM_DECLARATIONS = features.Declarations(marker_keywords={"max_retained": settings.parse_optional_size})


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_BOOKS] = SessionBooks(config)
    config.pluginmanager.register(config.stash[_BOOKS], "tfmem-session")
    manager(config).add_teardown_step(TeardownStep(Teardown.BOOKS, config.stash[_BOOKS].close))
    manager(config).add_summary(Summary.SESSION, config.stash[_BOOKS].write_summary)
    manager(config).add_reader(RetainedFigures, RetainedFigures)


def books(config: pytest.Config) -> SessionBooks:
    """The session's books: the last boundary's reading, the tests' retained figures."""
    return config.stash[_BOOKS]


@dataclass
class _Span:
    """A measured test in progress: its start, and what was booked elsewhere since."""

    nodeid: str
    before: Level
    snapshot: Snapshot
    bookings: list[Booking] = field(default_factory=list)
    import_mark: int = 0  # where the first imports' ledger stood at the start
    # Where a check on what it leaves behind applies and verdicts are confirmed: the most it may
    # leave (``ceiling``), the level as its call began, what its first run's call kept, and what
    # the test had kept by then (``so_far``: the teardown's figure were the teardown to free nothing).
    ceiling: int | None = None
    call_start: Level | None = None
    call_kept: Booking | None = None
    so_far: int = 0
    reproduced: str = ""  # where the re-run kept as much again: both runs' figures, for the failure
    ended_in_fixtures: set[int] = field(default_factory=set)  # processes a fixture's teardown booking covers


@dataclass
class _Weighed:
    stayed: Stayed | None = None  # what stayed after the test, where it left more than the threshold
    failed: str = ""  # why what stayed could not be read
    # The process as read to weigh the test (freed heap handed back), before the survivors were frozen.
    reading: Level | None = None


@dataclass
class _FixtureWindow:
    inner: list[Booking] = field(default_factory=list)  # fixtures set up inside this one's setup, at any depth


class SessionBooks:
    """Per-process state: the reading at the last boundary, the test in progress, the options."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        values = {option.name: settings.read_option(config, option) for option in OPTIONS}
        self.max_retained: int | None = values["max_retained"][0]
        self.stayed_threshold: int | None = values["stayed_threshold"][0]
        self.clear_session: bool = values["clear_session"][0]
        self.options_set = values["max_retained"][1] or self.clear_session
        self.watcher = Watcher()
        self._pool = ResidentPool()
        self._level: Level | None = None  # after the last measured test, if the next test is measured
        self._span: _Span | None = None
        self._seq = 0
        self._fixtures: list[_FixtureWindow] = []
        self._fixture_teardowns: dict[int, Level] = {}
        # A fixture torn down whose value pytest still holds: booked at the next reading.
        self._torn_down: tuple[pytest.FixtureDef[Any], Level] | None = None

    def _read(self, before_freeze: Callable[[], object] | None = None, weighed: _Weighed | None = None,
              between_tests: bool = False) -> Level:
        """The process after a collection (``before_freeze``: see ``Collector.collect``). Where
        ``before_freeze`` weighed the test (``weighed``) and neither a full collection nor the
        look at what stayed came after its reading, that reading is the level: only the freeze
        came between."""
        collector = manager(self.config).collector
        full_collections = collector.full_collections
        collector.collect(before_freeze)
        reading = weighed.reading if weighed is not None and weighed.stayed is None and not weighed.failed else None
        if reading is None or collector.full_collections != full_collections:
            reading = read_collected_level(between_tests)
        level = self._pool.level(reading)
        manager(self.config).note_collected()
        if self._torn_down is not None:
            fixturedef, before = self._torn_down
            self._torn_down = None
            self._book_fixture(fixturedef, "teardown", before, level, [])
        return level

    def pytest_tfmem_measure_all(self) -> bool:
        return self.options_set

    # One test's span

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        tfmem = manager(self.config)
        # Asked at each test: a fork of the template becomes a replacement process after configuring.
        if not (processes.keeps_books(self.config) and tfmem.is_measured(item)):
            self._level = None  # what this test leaves falls between measured tests
            return (yield)
        if self._level is None and tfmem.last_boundary is None:
            tfmem.trackers()  # the first test's window would start them: not the test's memory
            measure.probes().trackers()
        before = self._level if self._level is not None else self._read()
        prepared = tfmem.prepare_frameworks(item)  # imported since: their runtimes start now
        level = self._read() if prepared else before
        bookings = []
        if prepared:
            names = " and ".join(framework.name for framework in prepared)
            bookings.append(Booking.between(RUNTIME, f"{names}'s runtime start", "", before, level))
        for first_use in tfmem.first_uses_due():  # each booked on its own: "Keras's first use"
            tfmem.warm_up(first_use)
            level, warmed_from = self._read(), level
            bookings.append(Booking.between(FIRST_USE, f"{first_use.name}'s first use", "", warmed_from, level))
        span = _Span(item.nodeid, before, self.watcher.snapshot(), bookings)
        span.import_mark = tfmem.imports.mark()
        self._span = span
        return (yield)

    def close(self, item: pytest.Item, nextitem: pytest.Item | None) -> TfmemFailure | None:
        """After the test's teardown (``Teardown.BOOKS``): read the boundary; the test's retained
        figure and the checks on it, whose failure is the teardown's error."""
        if self._span is None:
            return None
        release_fixture_values(item)
        if self._torn_down is not None:
            self._read()  # book the fixture torn down last before what stayed is weighed
        self._span.bookings += [
            Booking(IMPORT, booked.module, "first import", booked.host_bytes)
            for booked in manager(self.config).imports.since(self._span.import_mark)
        ]
        if RERUN_BOOKING in item.stash:  # what the body kept when tfmem ran it again is not the test's
            self._span.bookings.append(item.stash[RERUN_BOOKING])
            del item.stash[RERUN_BOOKING]
        before_clearing, cleared_by = None, []
        if self.clear_session:
            before_clearing = self._read()
            cleared_by = frameworks.clear()
        weighed = _Weighed()
        level = self._read(functools.partial(self._what_stayed, item, self._span, weighed), weighed, between_tests=True)
        ended = ended_processes(self._span.before, level, self._span.ended_in_fixtures)
        if ended is not None:
            self._span.bookings.append(ended)
        span, self._span = self._span, None
        self._level = level
        tfmem = manager(self.config)
        tfmem.last_boundary = Boundary(item.nodeid, level)
        record = item.stash.get(RECORD, None)
        if record is None:  # not measured after all (setup failed, skipped)
            return None
        self._seq += 1
        cleared = None if before_clearing is None else before_clearing.held - level.held
        retained = Retained(
            span.before, level, tuple(span.bookings), self._seq, processes.process_label(self.config),
            cleared=cleared, cleared_by=tuple(cleared_by),
        )
        lines = weighed.stayed.lines(retained.bytes) if weighed.stayed is not None else ()
        lines = (*still_running(record), *((weighed.failed,) if weighed.failed else lines))
        named = weighed.stayed.named_within(retained.bytes) if weighed.stayed is not None else None
        record.retained = dataclasses.replace(retained, stayed=lines, named_bytes=named)
        tfmem.last_boundary = Boundary(item.nodeid, level, record.retained)
        verdicts = [v for v in self.config.hook.pytest_tfmem_check_retained(item=item, record=record) if v is not None]
        failed_already = bool(record.failed_verdicts)  # its call failed a tfmem check
        record.verdicts += verdicts
        publish(item, record)
        failed = [v for v in verdicts if not v.ok]
        if not failed or failed_already:  # one outcome a test: the call's failure names these too
            return None
        shown = [f"tfmem: {v.message}" for v in failed] + ([span.reproduced] if span.reproduced else [])
        shown.append(f"tfmem: {what_kept_line(record.retained)}")
        return failure_for(failed[0].check, "\n".join(shown))

    # What a test leaves behind, confirmed while its fixtures still stand (``core.confirm``)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        """Where a check on the test's retained figure applies, read the process as its call
        begins (the call's window then needs no collection of its own): what the call keeps is
        known at its end, while a re-run can still tell a one-time cost from the test's own."""
        span = self._span
        if span is not None and manager(self.config).settings.confirm:
            ceilings = [c for c in self.config.hook.pytest_tfmem_retained_ceiling(item=item) if c is not None]
            if ceilings:
                span.ceiling = min(ceilings)
                span.call_start = self._read()
        return (yield)

    @pytest.hookimpl
    def pytest_tfmem_departure(self, item: pytest.Item, record: TestRecord) -> str | None:
        """A call that kept more than the test may leave behind runs again before the check at its
        teardown: what only the first run kept (a cache filled once, a function traced once) is
        booked as a one-time cost, not the test's; what the re-run keeps again stands."""
        span = self._span
        if span is None or span.call_start is None or span.ceiling is None:
            return None
        rerun = item.stash.get(RERUN_BOOKING, None)
        if rerun is None:  # the first run's end
            now = self._read()
            span.call_kept = Booking.between(FIRST_USE, ONE_TIME_COST, f"paid in {item.nodeid}", span.call_start, now)
            span.so_far = Retained(span.before, now, tuple(span.bookings)).bytes
            if span.so_far <= span.ceiling:
                span.call_kept = None
                return None
            return f"it kept {format_size(span.so_far)}, above the {format_size(span.ceiling)} it may leave behind"
        if span.call_kept is None:  # another departure's re-run
            return None
        kept = span.call_kept
        one_time = Booking(FIRST_USE, ONE_TIME_COST, kept.detail, kept.host_bytes - rerun.host_bytes,
                           kept.tf_bytes - rerun.tf_bytes)
        warm = span.so_far - max(0, one_time.bytes)
        if warm > span.ceiling:
            span.reproduced = (f"{REPRODUCED}: its call kept {format_size(kept.bytes, signed=True)} in the first run, "
                               f"{format_size(rerun.bytes, signed=True)} in the re-run")
            return f"it kept {format_size(warm)} warm, above the {format_size(span.ceiling)} it may leave behind"
        if one_time.bytes > 0:
            span.bookings.append(one_time)
        return None

    def _what_stayed(self, item: pytest.Item, span: _Span, weighed: _Weighed) -> None:
        """For a test over the threshold, what stayed: run after the young objects were collected
        and before the survivors are frozen, so ``gc.get_objects()`` lists the test's survivors."""
        threshold = min(
            (limit for limit in (self.stayed_threshold, self._limit(item)) if limit is not None), default=None
        )
        if threshold is None:
            return
        host.trims().between_tests()  # where it pays (``host.HeapTrims``)
        weighed.reading = current_level()
        now = self._pool.level(weighed.reading, keep=False)
        booked = sum(booking.bytes for booking in span.bookings)
        if now.held - span.before.held - booked > threshold:
            try:
                weighed.stayed = self.watcher.what_stayed(span.snapshot, gc.get_objects())
            except Exception as error:  # the diagnosis must never fail the test
                weighed.failed = f"what stayed could not be read: {error!r}"

    def _limit(self, item: pytest.Item) -> int | None:
        arguments = item.stash.get(ARGUMENTS, {})
        return arguments.get("max_retained", self.max_retained)

    @pytest.hookimpl
    def pytest_tfmem_retained_ceiling(self, item: pytest.Item) -> int | None:
        return self._limit(item)

    @pytest.hookimpl
    def pytest_tfmem_check_retained(self, item: pytest.Item, record: TestRecord) -> Verdict | None:
        """``--tfmem-max-retained`` (or the marker's ``max_retained=``)."""
        limit = self._limit(item)
        retained = record.retained
        if limit is None or retained is None:
            return None
        relation = ">" if retained.bytes > limit else "<="
        message = (
            f"retained {format_size(retained.bytes)} {relation} max_retained {format_limit(limit)} after the "
            f"teardown (host outside TensorFlow's pool {format_size(retained.host_bytes, signed=True)}, TF CPU "
            f"allocator {format_size(retained.tf_bytes, signed=True)})"
        )
        if retained.stayed:
            message += "; what stayed: " + "; ".join(retained.stayed)
        return Verdict("max_retained", retained.bytes <= limit, message)

    # Fixtures of wider scope

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[Any]) -> Generator[None, Any, Any]:
        if self._span is None or fixturedef.scope == "function":
            return (yield)
        imports = manager(self.config).imports
        before = self._read()
        mark = imports.mark()
        window = _FixtureWindow()
        self._fixtures.append(window)
        try:
            return (yield)
        finally:
            self._fixtures.pop()
            # First imports in its setup are booked to the import, not to the fixture as well
            imported = [Booking(IMPORT, b.module, "first import", b.host_bytes) for b in imports.since(mark)]
            booking = self._book_fixture(fixturedef, "setup", before, self._read(), [*window.inner, *imported])
            if self._fixtures and booking is not None:  # set up inside another fixture's setup
                self._fixtures[-1].inner += [booking, *window.inner]
            fixturedef.addfinalizer(functools.partial(self._before_fixture_teardown, fixturedef))

    def _before_fixture_teardown(self, fixturedef: pytest.FixtureDef[Any]) -> None:
        """Added after the fixture's own finalizers, so it runs before them."""
        if self._span is not None:
            self._fixture_teardowns[id(fixturedef)] = self._read()

    @pytest.hookimpl
    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef[Any]) -> None:
        """pytest lets go of the fixture's value after this hook: the next reading books its teardown."""
        before = self._fixture_teardowns.pop(id(fixturedef), None)
        if before is not None and self._span is not None:
            self._torn_down = (fixturedef, before)

    def _book_fixture(
        self, fixturedef: pytest.FixtureDef[Any], detail: str, before: Level, after: Level, inner: list[Booking]
    ) -> Booking | None:
        """Book what changed from ``before`` to ``after``, less what ``inner`` booked elsewhere."""
        if self._span is None:
            return None
        whole = Booking.between(FIXTURE, fixture_label(fixturedef), detail, before, after)
        if detail == "teardown":  # what it stopped is booked here, not again as a process that ended
            self._span.ended_in_fixtures |= {pid for pid, _ in before.processes} - {pid for pid, _ in after.processes}
        booking = Booking(
            FIXTURE, whole.name, detail,
            whole.host_bytes - sum(b.host_bytes for b in inner), whole.tf_bytes - sum(b.tf_bytes for b in inner),
        )
        self._span.bookings.append(booking)
        return booking

    # The account

    def write_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not processes.role(self.config).writes_session_outputs:
            return
        account = manager(self.config).reader(RetainedFigures).account()
        lines = account_lines(account, always=self.clear_session)
        if lines:
            terminalreporter.write_sep("=", "tfmem: what the tests left behind")
            terminalreporter.write_line(HOW_TO_READ)
            for line in lines:
                terminalreporter.write_line(line)


def ended_processes(before: Level, after: Level, booked: set[int]) -> Booking | None:
    """Processes that ran as the test's span began and ended within it, outside a fixture's
    teardown (``booked``: the kernel nbval stops after a notebook's last cell): what they held
    then left with them, which is not the test's."""
    running = {pid for pid, _ in after.processes} | booked
    ended = [(pid, size) for pid, size in before.processes if pid not in running]
    if not ended:
        return None
    pids = ", ".join(str(pid) for pid, _ in ended)
    return Booking(FIXTURE, f"process{'es' if len(ended) > 1 else ''} {pids}, running before it",
                   "ended", -sum(size for _, size in ended))


_UNITTEST_CLASS_FIXTURE = "_unittest_setUpClass_fixture_"


def fixture_label(fixturedef: pytest.FixtureDef[Any]) -> str:
    """``big_table (module scope)``; a ``unittest.TestCase``'s ``TestX.setUpClass (class scope)``."""
    name = fixturedef.argname
    if name.startswith(_UNITTEST_CLASS_FIXTURE):
        name = name[len(_UNITTEST_CLASS_FIXTURE):] + ".setUpClass"
    return f"{name} ({fixturedef.scope} scope)"


def still_running(record: TestRecord) -> list[str]:
    """``process pid 4242 `fork of python ...` still running: 30.0 MiB``, for each process the
    test's call started that is still running after its teardown."""
    started = record.measurement.children if record.measurement is not None else None
    if started is None:
        return []
    running = {mark.pid: mark for mark in children.watch().running()}
    return [
        f"process pid {figure.pid} `{figure.command}` still running: "
        f"{format_size(running[figure.pid].own_size)}"
        for figure in started.processes
        if figure.running and figure.pid in running
    ]
