"""The core plugin: options, the ``tfmem`` marker and fixture, and the manager that measures
each test, applies the checks and writes the summary. Thin glue: no arithmetic here.

Inert unless a tfmem option or ini value is set, or a test uses a tfmem marker or the ``tfmem``
fixture. Features reach the manager with ``manager(config)`` and plug into it with declarations
(``core.features``), the few hooks of ``hookspecs.py`` and the manager's own registrations
(``known_peak``, ``tracker_sources``, ``runtime_setups``).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import sys
from collections.abc import Callable, Generator, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

import pytest

from pytest_tfmem import frameworks, hookspecs, platforms
from pytest_tfmem.core import attempts, features, processes, pytest_internals, settings
from pytest_tfmem.core.confirm import (
    FIGURE_CHECKS,
    REPRODUCED,
    Confirmation,
    comparable_rerun,
    confirmable,
    runs_differ,
    still_settling,
)
from pytest_tfmem.core.failsafe import warn_instead
from pytest_tfmem.core.features import CallStep, Step, Summary, TeardownStep
from pytest_tfmem.core.first_imports import LeaveOutFirstImports, remove_inherited_ledgers
from pytest_tfmem.core.fixture import FIXTURE_TYPE, TfmemFixture
from pytest_tfmem.core.handoffs import PROFILER_IN_USE
from pytest_tfmem.core.measure import Measurement, Monitor, PeakTracker, probes
from pytest_tfmem.core.record import TestRecord, publish, record_from_report, slim_for_junit, unpublish
from pytest_tfmem.core.record_store import RecordStore
from pytest_tfmem.core.rerun import (
    RERUN_KEYWORD,
    Rerun,
    RerunResult,
    RerunUse,
    read_output,
    rerun_refusal,
    rerun_test_body,
    separate_output,
)
from pytest_tfmem.core.retained import RERUN, RERUN_BOOKING, Booking, Boundary, Level, read_collected_level
from pytest_tfmem.core.subtests import SubtestFigure, SubtestWindows
from pytest_tfmem.core.summary import HeaviestTests, render_table, section_text
from pytest_tfmem.core.timeout import timeout_note
from pytest_tfmem.core.verdict import (
    PEAK_CHECKS,
    WHAT_USED,
    Verdict,
    check_budget,
    describe_views,
    what_used_line,
)
from pytest_tfmem.errors import FIGURES_HELP, TfmemFailure, failure_for, session_configured
from pytest_tfmem.frameworks import FirstUse, Framework
from pytest_tfmem.frameworks.native_log import HeldLog
from pytest_tfmem.probes import children as children_probe, garbage, host
from pytest_tfmem.probes.garbage import Collector
from pytest_tfmem.probes.imports import ImportLedger
from pytest_tfmem.probes.objects import instance_dict

MONITOR = pytest.StashKey[Monitor]()
RECORD = pytest.StashKey[TestRecord]()
ARGUMENTS = pytest.StashKey[dict]()
_MANAGER = pytest.StashKey["TfmemManager"]()
_PLATFORM_BEFORE = pytest.StashKey[platforms.Chosen]()
# On a call report whose test should have been measured but was not: why (the summary lists them).
NOT_MEASURED = "tfmem_not_measured"
# On a pytest-xdist worker's first measured call report: a view its frameworks could not give (the
# controller, which imports no framework, says it once at the end).
MISSING_VIEW = "tfmem_missing_view"
# On a pytest-xdist worker's measured call reports: what its frameworks logged while tfmem started
# them, where it matters (``frameworks.native_log``); the controller says it at the end.
NATIVE_LOG = "tfmem_native_log"
R = TypeVar("R")  # a reader of every record at the session's end (``TfmemManager.reader``)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser, settings.CORE_OPTIONS)


def pytest_load_initial_conftests(early_config: pytest.Config, args: list[str]) -> None:
    """A misspelled ``--tfmem-*`` option is named with its nearest spelling, before pytest's own
    ``unrecognized arguments``; a misspelled ``tfmem_*`` ini key too (pytest only warns)."""
    lines = settings.misspelled_options(args)
    lines += settings.misspelled_ini_keys(pytest_internals.unknown_ini_keys(early_config), early_config.inipath)
    if lines:
        raise pytest.UsageError("\n".join(f"pytest-tfmem: {line}" for line in lines))


@pytest.hookimpl(tryfirst=True)  # before pytest configures any plugin: every reading is the chosen platform's
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``--tfmem-platform`` (or its ini value): the platform every reading of this process, and of
    the processes it starts, goes through (``platforms``)."""
    choice, given = settings.read_option(config, settings.PLATFORM)
    if given:
        config.stash[_PLATFORM_BEFORE] = platforms.select(choice)
    # Registered before any plugin is configured, so run after every other clean-up (pytest's
    # collections at the end, which report finalizers' errors, among them): see Collector.settle.
    config.add_cleanup(functools.partial(_thaw, config))


def _thaw(config: pytest.Config) -> None:
    """The objects the session's collector froze, given back to the collector at the very end."""
    tfmem = config.stash.get(_MANAGER, None)
    if tfmem is not None and tfmem.collector.freezing:
        tfmem.collector.thaw()


def pytest_unconfigure(config: pytest.Config) -> None:
    """The platform and ``TFMEM_PLATFORM`` as they were before ``--tfmem-platform`` (a session run
    inside another process, as pytester's are, leaves it as it found it)."""
    before = config.stash.get(_PLATFORM_BEFORE, None)
    if before is not None:
        platforms.restore(before)


def _is_tfmem_section(title: str) -> bool:
    """The core's ``tfmem`` section and the features' (``tfmem trace``, ``tfmem explain``)."""
    return title == "tfmem" or title.startswith("tfmem ")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "tfmem(budget=None, ...): memory policy for this test; budget='512MB' overrides "
        "--tfmem-budget, budget=None exempts the test (pytest-tfmem)",
    )
    # Registered here, whichever feature made it first: its hooks keep their place among the
    # features' (its terminal summary after the CI gates', before the GPU notes).
    config.pluginmanager.register(manager(config), "tfmem-manager")
    session_configured(True)  # the library API's failures fail this session's tests


TFMEM_DECLARATIONS = features.Declarations(
    marker_keywords={"budget": settings.parse_optional_size, RERUN_KEYWORD: settings.parse_bool}
)


@pytest.fixture
def tfmem(request: pytest.FixtureRequest) -> TfmemFixture:
    """Measure blocks (``with tfmem.measure() as m``), read ``peak()``/``current()``, ``clean()``."""
    item = request.node
    fixture_type = request.config.stash.get(FIXTURE_TYPE, TfmemFixture)
    return fixture_type(lambda: item.stash.get(MONITOR, None), manager(request.config).trackers)


def _is_failure_detail(line: str) -> bool:
    """A failure's line besides its verdicts (both runs' figures, what used the memory): in its
    block under FAILURES, not in the short summary."""
    return line.startswith((REPRODUCED, f"tfmem: {WHAT_USED}"))


def manager(config: pytest.Config) -> TfmemManager:
    """The session's manager: what every feature reads the measured tests and records from.

    Made at its first use, so that a feature's ``pytest_configure`` can add its steps to it
    whichever plugin pytest configures first."""
    if _MANAGER not in config.stash:
        config.stash[_MANAGER] = TfmemManager(config)
    return config.stash[_MANAGER]


def _no_known_peak(item: pytest.Item) -> int | None:
    return None


class TfmemManager:
    """Measures tests, applies checks, gathers records (also from xdist workers), summarises."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.settings = settings.CoreSettings.from_config(config)
        # Every measured test's record, on disk once complete: each pass over them reads them back
        # (the files CI reads go through them; the summaries read them with ``reader``).
        self.records = RecordStore()
        # Readers of every record at the session's end, by kind (``add_reader``), and the last
        # pass that fed them (the store's changes when it ran).
        self._reader_factories: dict[type[Any], Callable[[], Any]] = {HeaviestTests: self._heaviest_tests}
        self._readers: tuple[int, dict[type[Any], Any]] = (-1, {})
        self.not_measured: list[tuple[str, str]] = []  # (node id, why), from the call reports
        # the views the frameworks could not give: said in the header (or after collection, once
        # the tests' modules loaded them), or by pytest-xdist's workers on their first measured report
        self.missing_views: dict[str, None] = {}
        self._missing_views_said = False
        # What the frameworks' C++ code logged while tfmem started or warmed them (said at the end,
        # where it matters: ``frameworks.native_log``); a pytest-xdist worker's, on its reports.
        self.native_log = HeldLog()
        self._native_lines_sent = 0
        self.workers_native_lines: dict[str, None] = {}
        # call reports failed by a tfmem check, until their teardown's report: a check on what the
        # test left behind fails it there, in the same message, not as a second outcome
        self._failed_calls: dict[str, pytest.TestReport] = {}
        self._measure_all: bool | None = None
        self._prepared: set[str] = set()  # the frameworks whose runtime was prepared (by module)
        self._warmed: set[str] = set()  # the first uses warmed up (``FirstUse.name``)
        # What the last look for first uses to warm up saw when it found none: the same again finds none.
        self._nothing_to_warm: tuple[int, int] | None = None
        self._named_by_module: dict[tuple[int, int], set[str]] = {}  # a test module's named modules
        # What the last call found nothing to prepare for: the same again prepares nothing.
        self._nothing_to_prepare: tuple[object, ...] | None = None
        self.collector = Collector(host.current_rss)
        self.subtests = SubtestWindows(self.trackers)
        self.first_reruns = attempts.FirstReruns()
        self._keras_said = False  # the Keras backend's header line (``_keras_backend_line``)
        declarations = features.declared(config)
        self.marker_keywords: dict[str, features.KeywordParser] = {}
        for declared in declarations:
            self.marker_keywords.update(declared.marker_keywords)
        self.measuring_markers = {settings.MARKER}.union(*(declared.measuring_markers for declared in declarations))
        self.marker_readers = [
            self._read_tfmem_marker, *(read for declared in declarations for read in declared.marker_readers)
        ]
        # What one feature provides for others, registered by it when pytest is configured:
        # the peak a test is known to reach (bytes; the baseline's), to size xdist workers;
        self.known_peak: Callable[[pytest.Item], int | None] = _no_known_peak
        # more peak trackers for every window (NVML's per-GPU views): each source returns the
        # same trackers at every call, so nested windows fold their peaks into each other; a
        # test's headline peak reads only the host and TensorFlow CPU views;
        self.tracker_sources: list[Callable[[], list[PeakTracker]]] = []
        # device settings, applied once a framework is found loaded (before the first measured
        # test, or right after a test's own first import of it), before tfmem starts its runtime:
        # memory limits apply only while the second argument (the runtime started) is false.
        self.runtime_setups: list[Callable[[Framework, bool], None]] = []
        self.steps = [CallStep(Step.MEASURE, self._measured_call)]  # in Step order: add_step
        self.teardown_steps: list[TeardownStep] = []  # in Teardown order: add_teardown_step
        self.summaries: list[tuple[Summary, Callable[[pytest.TerminalReporter], None]]] = [
            (Summary.TABLE, self._write_table)
        ]
        self._imports: ImportLedger | None = None
        # The process after the last measured test's teardown, read once by the session's books
        # (the session feature, where it keeps them); a limit on the process (isolate) reads
        # this rather than the process again.
        self.last_boundary: Boundary | None = None
        self._fixture_setups = 0  # fixtures set up so far (``pytest_fixture_setup``)
        self._collected_at: int | None = None  # that count when the books last collected the process
        self._fixtures_at_window: int | None = None  # that count when the last test's window opened
        remove_inherited_ledgers()

    def add_reader(self, kind: type[R], factory: Callable[[], R]) -> None:
        """A feature's reader of every record at the session's end: an object with ``add(record)``
        that keeps what its summary needs (``reader``). One pass over the records feeds them all."""
        self._reader_factories[kind] = factory

    def reader(self, kind: type[R]) -> R:
        """The reader of ``kind``, fed every record: the first to ask runs the one pass (again
        only if a record came since)."""
        if self._readers[0] != self.records.changes:
            readers = {known: factory() for known, factory in self._reader_factories.items()}
            for record in self.records:
                for reader in readers.values():
                    reader.add(record)
            self._readers = (self.records.changes, readers)
        found: R = self._readers[1][kind]
        return found

    def _heaviest_tests(self) -> HeaviestTests:
        return HeaviestTests(self.settings.top)

    @property
    def template_pids(self) -> set[int]:
        """The isolation templates this process started: readings of its process tree (the
        journal's) leave them out; isolation adds and removes them."""
        return children_probe.watch().helpers

    @property
    def imports(self) -> ImportLedger:
        """The process's ledger of first imports (``probes.imports``): installed before the first
        measured test's setup, unless ``--no-tfmem-book-imports``; its bookings are left out of
        the open windows' figures as they happen."""
        if self._imports is None:
            self._imports = ImportLedger(probes().host.source)
            self._imports.add_listener(LeaveOutFirstImports(self._prepare_inside_import))
        return self._imports

    def add_step(self, step: CallStep) -> None:
        """A feature's part in every test's call phase, run in ``Step`` order (``core.features``)."""
        self.steps = sorted([*self.steps, step], key=lambda known: known.step)

    def add_teardown_step(self, step: TeardownStep) -> None:
        """A feature's part after every test's teardown, run in ``Teardown`` order."""
        self.teardown_steps = sorted([*self.teardown_steps, step], key=lambda known: known.step)

    def add_summary(self, part: Summary, write: Callable[[pytest.TerminalReporter], None]) -> None:
        """A feature's part of the terminal summary, written in ``Summary`` order."""
        self.summaries = sorted([*self.summaries, (part, write)], key=lambda known: known[0])

    @property
    def measure_all(self) -> bool:
        """A tfmem option was given (budget, baseline, report, GPU budget...): measure every test."""
        if self._measure_all is None:
            asked = self.config.hook.pytest_tfmem_measure_all(config=self.config)
            self._measure_all = self.settings.any_set or any(asked)
        return self._measure_all

    def is_measured(self, item: pytest.Item) -> bool:
        return (
            self.measure_all
            or any(item.get_closest_marker(name) for name in self.measuring_markers)
            or "tfmem" in getattr(item, "fixturenames", ())
        )

    def trackers(self) -> list[PeakTracker]:
        """The features' own peak trackers, for every window besides host and TensorFlow's."""
        return [tracker for source in self.tracker_sources for tracker in source()]

    def budget_for(self, item: pytest.Item) -> int | None:
        arguments = item.stash.get(ARGUMENTS, {})
        return arguments.get("budget", self.settings.budget)

    def prepare_frameworks(self, item: pytest.Item | None = None, imported: str = "") -> list[Framework]:
        """For each framework loaded and in use since the last call (``frameworks.in_use``: the
        Keras backend, or named by ``item``'s module or by the module a test ``imported``): let
        features configure its devices, then start its runtime (``--tfmem-tf-warmup``). Returns
        the frameworks prepared now."""
        namespace = instance_dict(getattr(item, "module", None)) if item is not None else None
        # Asked twice a test: while no module was imported, the test's module and the Keras
        # backend variable are the same, the answer is (a framework a library loaded, unused).
        state = (len(sys.modules), id(namespace), len(namespace or ()), imported, os.environ.get("KERAS_BACKEND"))
        if state == self._nothing_to_prepare:
            return []
        loaded = [framework for framework in frameworks.loaded() if framework.module not in self._prepared]
        if not loaded:  # every loaded framework was prepared
            self._nothing_to_prepare = state
            return []
        named = {imported.split(".", 1)[0]} if imported else set()
        if namespace is not None:
            # asked at every test while a loaded framework is not in use: read once per module state
            key = (id(namespace), len(namespace))
            if key not in self._named_by_module:
                self._named_by_module[key] = frameworks.named_modules(namespace)
            named |= self._named_by_module[key]
        prepared = []
        for framework in loaded:
            if not frameworks.in_use(framework, named):
                continue
            self._prepared.add(framework.module)
            runtime_started = framework.runtime_started()
            for setup in self.runtime_setups:
                setup(framework, runtime_started)
            if self.settings.tf_warmup:
                with self.native_log.held():
                    framework.start_runtime()
            prepared.append(framework)
        if not prepared:
            self._nothing_to_prepare = state
        return prepared

    def first_uses_due(self, finishing: str = "") -> list[FirstUse]:
        """The first uses to warm up now (``--tfmem-first-use-warmup``): of each framework whose
        runtime tfmem started, and Keras's on one of them, each once a process that runs the
        session's tests one after the other (not an isolated test's: its figure is the test's in a
        process of its own, and each would pay it again) (``finishing``: the module whose first
        import is ending, as ``frameworks.first_uses`` reads it)."""
        settings = self.settings
        state = (len(sys.modules), len(self._prepared))
        if not (settings.first_use_warmup and settings.tf_warmup) or state == self._nothing_to_warm:
            return []
        if not processes.keeps_books(self.config):  # an isolated test's process: its test is its first
            self._nothing_to_warm = state
            return []
        due = [use for use in frameworks.first_uses(self._prepared, finishing) if use.name not in self._warmed]
        if not due and not finishing:
            self._nothing_to_warm = state
        return due

    def warmed(self, name: str) -> bool:
        """The first use of ``name`` (``Keras``, ``TensorFlow``) was paid in this process."""
        return name in self._warmed

    def warm_up(self, first_use: FirstUse) -> None:
        """Pay ``first_use`` now, once a session (``frameworks.warm_up``)."""
        self._warmed.add(first_use.name)
        with self.native_log.held():
            frameworks.warm_up(first_use)

    def prepare_and_warm_up(self, item: pytest.Item) -> bool:
        """Before a measured test where no books are kept: the frameworks' runtimes, their first
        uses; whether anything ran."""
        prepared = bool(self.prepare_frameworks(item))
        return self._warm_up_due() or prepared

    def note_collected(self) -> None:
        """The process was just collected and its freed heap handed back (the session's books read a
        boundary): a window that opens before any fixture is set up need not do it again."""
        self._collected_at = self._fixture_setups

    # tryfirst: before pytest's own, which returns the fixture's value and so ends the call (firstresult)
    @pytest.hookimpl(tryfirst=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef[object]) -> None:
        """Counted: a fixture set up since the process was last collected may have freed memory (a
        ``parametrize`` argument's runs no code)."""
        if not pytest_internals.is_direct_parameter(fixturedef):
            self._fixture_setups += 1

    def _collected_since_fixtures(self) -> bool:
        """Nothing but pytest's own set-up ran since the process was last collected and trimmed."""
        return self._collected_at == self._fixture_setups

    def _prepare_inside_import(self, imported: str) -> None:
        """A test's own first import of a framework (or of Keras) ends: its runtime starts and its
        first use is paid inside the import, which every window leaves out."""
        self.prepare_frameworks(imported=imported)
        if self._warm_up_due(finishing=imported):  # what it freed is handed back, as between two tests
            host.release_freed_memory()

    def _warm_up_due(self, finishing: str = "") -> bool:
        """Pay every first use due now (``first_uses_due``); whether there was any."""
        due = self.first_uses_due(finishing)
        for first_use in due:
            self.warm_up(first_use)
        return bool(due)

    def finish(
        self,
        item: pytest.Item,
        measurement: Measurement,
        error: BaseException | None,
        subtests: list[SubtestFigure] | None = None,
    ) -> TestRecord:
        """Apply the checks to a measurement and attach the record to the item's report."""
        record = TestRecord(item.nodeid, measurement, budget=self.budget_for(item), subtests=subtests or [],
                            raised=type(error).__name__ if error is not None else None)
        verdicts: list[Verdict | None] = [check_budget(measurement, record.budget)]
        verdicts += self.config.hook.pytest_tfmem_check(item=item, record=record, error=error)
        record.verdicts = [v for v in verdicts if v is not None]
        stopped = timeout_note(error)
        if stopped is not None:
            record.notes.append(stopped)
        item.stash[RECORD] = record
        # On the item, so the call and teardown reports both carry it (JUnit XML reads teardown's)
        publish(item, record)
        return record

    def fail_if_needed(self, record: TestRecord) -> None:
        failed = record.failed_verdicts
        if failed:
            lines = [f"tfmem: {v.message}" for v in failed]
            if record.confirmation is not None:  # both runs' figures
                lines.append(record.confirmation.reproduced_line())
            if record.measurement is not None and any(v.check in PEAK_CHECKS for v in failed):
                explained = record.extra.get("explain")
                largest = explained.get("largest") if isinstance(explained, dict) else None
                lines.append(f"tfmem: {what_used_line(record.measurement, largest)}")
            raise failure_for(failed[0].check, "\n".join(lines))

    @pytest.hookimpl
    def pytest_report_header(self) -> list[str]:
        """How a measured session reads memory on this platform, what the platform does not give
        (one line), and the Keras backend it runs on where Keras is loaded already."""
        if not self.measure_all:
            return []
        platform = platforms.current()
        lines = [f"tfmem: platform {platform.name}: {platform.describe()}"]
        missing = platform.missing()
        if missing:
            lines.append(f"tfmem: not on {platform.name}: " + "; ".join(f"{m.feature} ({m.why})" for m in missing))
        return [*lines, *self._keras_backend_line(), *self._missing_view_lines()]

    @pytest.hookimpl
    def pytest_report_collectionfinish(self) -> list[str]:
        """The Keras backend and the views the frameworks the test modules loaded cannot give (the
        header's, where they were loaded after it)."""
        return [*self._keras_backend_line(), *self._missing_view_lines()] if self.measure_all else []

    def _keras_backend_line(self) -> list[str]:
        """``tfmem: Keras backend jax (KERAS_BACKEND)``, once, and only in a session that loaded Keras
        (a notebook of NumPy under nbmake has nothing to say of it)."""
        if self._keras_said or "keras" not in sys.modules:
            return []
        self._keras_said = True
        backend, source = frameworks.keras_backend()
        return [f"tfmem: Keras backend {backend} ({source})"]

    def _missing_view_lines(self) -> list[str]:
        if self._missing_views_said or processes.role(self.config) is processes.Role.WORKER:
            return []  # a worker's terminal shows nothing: its first measured report carries them
        lines = frameworks.missing_views()
        self._missing_views_said = bool(lines)
        return [f"tfmem: {line}" for line in lines]

    @pytest.hookimpl(trylast=True)  # once the tests are selected: a deselected test's markers are not read
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Read the tfmem markers of every selected test (the core's, the features' readers); a
        usage error names every bad one at once."""
        bad = []
        for item in items:
            for read in self.marker_readers:
                try:
                    read(item)
                except pytest.UsageError as error:
                    bad.append(str(error))
        if bad:
            raise pytest.UsageError("\n".join(bad))

    def _read_tfmem_marker(self, item: pytest.Item) -> None:
        arguments = settings.marker_arguments(item, self.marker_keywords)
        if arguments:  # kept on the item to the session's end: an unmarked test keeps nothing
            item.stash[ARGUMENTS] = arguments

    @pytest.hookimpl
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Book first imports from the first measured test's setup on (before its fixtures run)."""
        if self.settings.book_imports and self.is_measured(item) and not self.imports.installed:
            self.imports.install()

    # trylast: inside pytest's own wrappers (output capture, log capture), as the test is.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        """Every test's call phase goes through the features' steps, in ``Step`` order."""
        with ExitStack() as stack:
            profiler = next((known.step for known in self.steps if known.profiles(item)), None)
            if profiler is not None:
                item.stash[PROFILER_IN_USE] = profiler.name.lower()
                stack.callback(item.stash.__delitem__, PROFILER_IN_USE)
            for known in self.steps:
                if known.around is not None:
                    stack.enter_context(known.around(item))
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
        """After every test's teardown, the features' teardown steps, in ``Teardown`` order."""
        try:
            yield
        except BaseException:
            for known in self.teardown_steps:
                known.after(item, nextitem)  # the teardown's own error stands
            raise
        errors = [known.after(item, nextitem) for known in self.teardown_steps]
        first = next((error for error in errors if error is not None), None)
        if first is not None:
            raise first

    @contextmanager
    def _measured_call(self, item: pytest.Item) -> Iterator[None]:
        """Measure the call phase of every kind of test: a function's body, a ``unittest.TestCase``
        method with its ``setUp`` and ``tearDown``, a doctest (README, "Which phase is budgeted")."""
        if not self.is_measured(item):
            yield
            return
        ran = self.prepare_and_warm_up(item)
        # A collection and malloc_trim walk the whole heap (a trim ~2.7 ms in a 1.3 GiB process): not
        # twice in a row with nothing in between (docs/measurement.md, "What measuring costs").
        # A fixture set up since the last window may have freed what an earlier test made: then the
        # trim is done whatever it gave back before; otherwise it is done where it pays (host.HeapTrims).
        between_tests = not ran and self._fixtures_at_window == self._fixture_setups
        self._fixtures_at_window = self._fixture_setups
        monitor = self._new_monitor(release_first=ran or not self._collected_since_fixtures(),
                                    between_tests=between_tests)
        item.stash[MONITOR] = monitor
        if RECORD in item.stash:  # an earlier attempt's (pytest-rerunfailures)
            del item.stash[RECORD]
        imports = self.imports.mark()
        monitor.start()
        self.subtests.begin(item, monitor)
        try:
            yield
        except BaseException as raised:
            self._after_call(item, monitor, imports, raised)
            raise
        record = self._after_call(item, monitor, imports, pytest_internals.unittest_error(item))
        self.fail_if_needed(record)

    def _after_call(
        self, item: pytest.Item, monitor: Monitor, imports: int, error: BaseException | None
    ) -> TestRecord:
        """Close the window (with the first imports it left out), check the figures; after a
        memory failure, or a figure far above the test's recorded level, the one re-run."""
        del item.stash[MONITOR]
        subtests = self.subtests.end(item.nodeid)
        measurement = dataclasses.replace(monitor.stop(), first_imports=self.imports.since(imports))
        record = self.finish(item, measurement, error, subtests)
        # A re-run of a test pytest-timeout stopped would run without its timer: it could hang.
        interrupted = isinstance(error, (KeyboardInterrupt, pytest.exit.Exception)) or timeout_note(error) is not None
        if not interrupted:
            self.rerun_to_confirm(item, record, error)
        return record

    def _collected_level(self) -> Level:
        """The process once its garbage is collected (as a window's start collects it) and freed
        heap handed back: what a re-run kept is the difference of two such levels."""
        self.collector.collect()
        return read_collected_level()

    def _new_monitor(self, release_first: bool = True, between_tests: bool = False) -> Monitor:
        """A test's window: garbage collected first (``release_first``: unless that was just done;
        ``between_tests``: its trim where it pays), host and TensorFlow memory sampled together too."""
        return Monitor(release_first=release_first, collect=self.collector.collect, sample_mixed=True,
                       trackers=self.trackers(), between_tests=between_tests)

    def rerun_to_confirm(self, item: pytest.Item, record: TestRecord, error: BaseException | None) -> None:
        """Run the body once more where a verdict on the test's figures must reproduce to stand, or
        its figure departs from its recorded level (``core.confirm``); the features that asked
        (trace, explain) take part in that one re-run after a failure. Or say why it did not run."""
        failed = record.failed_verdicts
        # Only a test that would pass but for its figures has a verdict a second figure can change.
        confirm = self.settings.confirm
        to_confirm = confirm and bool(failed) and error is None and confirmable(failed)
        departures: list[str] = []
        if confirm and not failed and error is None:
            departures = [why for why in self.config.hook.pytest_tfmem_departure(item=item, record=record) if why]
        uses: list[RerunUse] = self.config.hook.pytest_tfmem_rerun_wanted(item=item, record=record) if failed else []
        if not (uses or to_confirm or departures):
            return
        earlier = self.first_reruns.earlier(item.nodeid)
        if earlier is not None and failed:  # pytest-rerunfailures' later attempt: itself a second run
            record.extra.update(earlier)
            if uses:
                shown = " and the ".join(use.gives for use in uses)
                record.notes.append(
                    f"not re-run again: the {shown} below {'are' if len(uses) > 1 else 'is'} from its first "
                    "memory failure, in an earlier attempt (pytest-rerunfailures)"
                )
            if to_confirm:
                record.notes.append("the verdict stands unconfirmed: an earlier attempt ran the test already "
                                    "(pytest-rerunfailures)")
            publish(item, record)
            return
        extra_before = dict(record.extra)
        refusal = rerun_refusal(item, item.stash.get(ARGUMENTS, {}).get(RERUN_KEYWORD, True))
        if refusal is not None:
            if uses:
                record.notes.append(f"not re-run, so no {' and no '.join(use.gives for use in uses)}: {refusal}")
            if to_confirm:
                record.notes.append(f"the verdict is the first run's, not confirmed by a re-run: {refusal}")
            if departures:
                record.unconfirmed = "; ".join(departures)
                record.notes.append(f"its figure is kept unconfirmed ({record.unconfirmed}): {refusal}; the "
                                    "history marks it, and a baseline save keeps the test's old entry")
            publish(item, record)
            return
        rerun = Rerun(tuple(uses))
        books = processes.keeps_books(self.config)
        before = None
        if books:  # a full collection now: one the re-run's growth makes due would free older garbage too
            if self.collector.freezing:
                self.collector.collect_full()
            else:
                gc.collect()
            before = self._collected_level()
        settling_from = None
        with warn_instead(item, f"the re-run of {item.nodeid} failed"), separate_output(item):
            self._rerun(item, rerun)
            if to_confirm and self._still_settling(item, record, rerun.result):
                # the re-run read far below the first run and still fails: what the first run paid once
                # was not all paid by then (a cache the second run fills in turn); one more run settles it
                assert rerun.result is not None and isinstance(item, pytest.Function)  # rerun_refusal let it through
                settling_from = rerun.result.measurement
                rerun.result = rerun_test_body(item, MONITOR, self._new_monitor())
                rerun.output += read_output(item)
        if before is not None:  # what the second run kept is booked apart from the test's retained figure
            after = self._collected_level()
            item.stash[RERUN_BOOKING] = Booking.between(RERUN, "tfmem's re-run", f"of {item.nodeid}", before, after)
        self.first_reruns.remember(item.nodeid, extra_before, record.extra)
        result = rerun.result
        if to_confirm or departures:
            if result is None or result.error is not None:
                why = f"it raised {result.error.splitlines()[0][:200]}" if result and result.error else "it did not run"
                record.notes.append(f"the first run's figure stands, unconfirmed: its re-run in the same process {why}")
                record.unconfirmed = "; ".join(departures)
            else:
                traced = any(use.profiles for use in rerun.uses)
                self._judge_rerun(item, record, result.measurement, tuple(departures), settling_from, traced)
        publish(item, record)

    def _rerun_verdicts(
        self, item: pytest.Item, record: TestRecord, judged: Measurement
    ) -> tuple[TestRecord, dict[str, Verdict]]:
        """The checks on a test's figures, applied to a re-run's measurement ``judged``."""
        rerun_record = TestRecord(item.nodeid, judged, budget=record.budget, subtests=record.subtests)
        verdicts = [check_budget(judged, record.budget)]
        verdicts += self.config.hook.pytest_tfmem_check(item=item, record=rerun_record, error=None)
        return rerun_record, {v.check: v for v in verdicts if v is not None and v.check in FIGURE_CHECKS}

    def _still_settling(self, item: pytest.Item, record: TestRecord, result: RerunResult | None) -> bool:
        """The re-run read far below the first run (``core.confirm.still_settling``) and still fails
        a check the first run failed."""
        first = record.measurement
        if result is None or result.error is not None or first is None:
            return False
        judged = comparable_rerun(first, result.measurement).measurement
        if not still_settling(first.peak, judged.peak):
            return False
        _, verdicts = self._rerun_verdicts(item, record, judged)
        return any(not verdicts[v.check].ok for v in record.failed_verdicts if v.check in verdicts)

    def _judge_rerun(
        self, item: pytest.Item, record: TestRecord, again: Measurement, departures: tuple[str, ...],
        settling_from: Measurement | None = None, traced: bool = False,
    ) -> None:
        """The verdict from the two runs: the re-run's where it passes (its figures are the record's,
        what the first run took beyond them booked as a one-time cost), the first's where the re-run
        fails too (or departs too), with both figures."""
        first = record.measurement
        assert first is not None
        # What the re-run could not read as the first run did is the first run's (core.confirm).
        comparable = comparable_rerun(first, again)
        judged = comparable.measurement
        # the re-run read lower by more than a step: the first run paid one-time costs beyond it. A
        # re-run under the profiler carries the tracer's own memory: it confirms or overturns, but a
        # verdict that stands keeps the untraced first run's figures (docs/traces.md)
        lower = runs_differ(first.peak, judged.peak) and not traced
        if departures:
            asked_by = departures
            rerun_record = TestRecord(item.nodeid, judged, budget=record.budget, subtests=record.subtests)
            departs_again = any(self.config.hook.pytest_tfmem_departure(item=item, record=rerun_record))
            reproduced = departs_again and not lower
        else:
            asked_by = tuple(verdict.check for verdict in record.failed_verdicts)
            rerun_record, rerun_verdicts = self._rerun_verdicts(item, record, judged)
            # reproduced: the re-run fails a check the first run failed, not merely some check
            reproduced = any(not rerun_verdicts[check].ok for check in asked_by if check in rerun_verdicts)
            if not reproduced or lower:
                record.verdicts = [rerun_verdicts.get(verdict.check, verdict) for verdict in record.verdicts]
                record.extra.update(rerun_record.extra)
        rerun_kept = not reproduced or lower
        record.confirmation = Confirmation(first.peak, judged.peak, asked_by, reproduced,
                                           describe_views(first, name_largest=False),
                                           describe_views(again, name_largest=False), comparable.taken, rerun_kept,
                                           settling_from.peak if settling_from is not None else None)
        if rerun_kept:  # the test's own need, warm; a verdict that stands on its first run keeps those figures
            record.measurement = dataclasses.replace(judged, first_imports=first.first_imports)
        record.notes.append(record.confirmation.note())

    def _rerun(self, item: pytest.Item, rerun: Rerun) -> None:
        """The body once more, inside every use's set-up in ``Step`` order; its output is kept
        apart from the first run's."""
        assert isinstance(item, pytest.Function)  # rerun_refusal let only functions through
        profiler = next((use.gives for use in rerun.uses if use.profiles), None)
        with ExitStack() as stack:
            if profiler is not None:
                item.stash[PROFILER_IN_USE] = profiler
                stack.callback(item.stash.__delitem__, PROFILER_IN_USE)
            for use in sorted(rerun.uses, key=lambda use: use.step):
                stack.enter_context(use.around(rerun))
            rerun.result = rerun_test_body(item, MONITOR, self._new_monitor())
            rerun.output = read_output(item)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """pytest-xdist: every worker serves this session."""
        processes.hand_to_worker(self.config, node.workerinput)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        # A call-phase report made while the test's window is open is a subtest's (core.subtests).
        subtest = call.when == "call" and MONITOR in item.stash
        record = item.stash.get(RECORD, None) if call.when == "call" and not subtest else None
        # Asked before the report is made, so that what features publish now reaches it.
        added = [] if record is None else self._report_sections(item, record)
        report = yield
        if call.excinfo is not None and isinstance(call.excinfo.value, TfmemFailure):
            pytest_internals.shown_as_a_test_failure(item, report, call.excinfo)
            # ``FAILED test - tfmem: peak 598.0 MiB > budget 512.0 MiB``: the figures first, not the class's
            # path; the re-run's figures in the failure's block, not in the short summary
            pytest_internals.set_failure_message(report, str(call.excinfo.value).splitlines(), FIGURES_HELP,
                                                 leave_out=_is_failure_detail)
        if call.when == "teardown":  # the reports made from the item carry the record now
            unpublish(item)
            if RECORD in item.stash:
                del item.stash[RECORD]
        if record is not None:
            if processes.role(self.config) is processes.Role.WORKER:
                if not self._missing_views_said:
                    report.user_properties += [(MISSING_VIEW, line) for line in frameworks.missing_views()]
                    self._missing_views_said = True
                if len(self.native_log.lines) > self._native_lines_sent:  # held since the last report
                    report.user_properties += [(NATIVE_LOG, line) for line in self._native_lines()[1:]]
                    self._native_lines_sent = len(self.native_log.lines)
            if not report.passed or self._passed_sections_read:
                report.sections.append(("tfmem", section_text(record)))
                for sections in added:
                    report.sections.extend(sections)
        elif call.when == "call" and not subtest and self.is_measured(item) and not report.skipped:
            # The call phase ran without passing through pytest_runtest_call (another plugin
            # ran the test its own way): say so rather than leave the test silently unmeasured.
            report.user_properties.append((NOT_MEASURED, "its call phase did not go through pytest_runtest_call"))
        return report

    def _report_sections(self, item: pytest.Item, record: TestRecord) -> list[list[tuple[str, str]]]:
        """The features' sections in ``Step`` order, then those of ``pytest_tfmem_report_sections``."""
        added = [known.sections(item, record) for known in self.steps if known.sections is not None]
        added += self.config.hook.pytest_tfmem_report_sections(item=item, record=record)
        return [sections for sections in added if sections]

    # tryfirst: the outermost wrapper, so every plugin has read the record when it is taken off
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> Generator[None, None, None]:
        self._gather(report)
        if report.when == "teardown" and self._writes_junit:  # the teardown's properties are its <testcase>'s
            slim_for_junit(report)
        try:
            return (yield)
        finally:
            unpublish(report)
            if report.passed and not self._passes_shown:
                report.sections[:] = [kept for kept in report.sections if not _is_tfmem_section(kept[0])]

    @functools.cached_property
    def _writes_junit(self) -> bool:
        """pytest writes a JUnit XML file from this process (on the controller under pytest-xdist)."""
        return pytest_internals.writes_junit_xml(self.config)

    @functools.cached_property
    def _passes_shown(self) -> bool:
        """Whether the terminal shows passed tests' output at the session's end (``-rP``, ``-rA``,
        ``-rX``). Where it does not, a passed test's tfmem sections are taken off its report once
        every plugin has logged it (pytest-html, pytest-xdist's sending read them there): pytest
        keeps every report to the session's end, and nothing shows them again."""
        shown = pytest_internals.shown_at_the_end(self.config)
        return "P" in shown or "X" in shown

    @functools.cached_property
    def _passed_sections_read(self) -> bool:
        """Whether anything shows a passed test's tfmem sections: the terminal at the end, or
        tfmem's block in pytest-html's report, which holds the features' sections (under
        pytest-xdist a worker has the same options). Otherwise a passed test's are not made."""
        return self._passes_shown or bool(self.config.getoption("htmlpath", None))

    def _gather(self, report: pytest.TestReport) -> None:
        """Keep the record a call report carries; add what its teardown report adds to it."""
        if report.when == "call" and not self.subtests.ended(report):
            record = record_from_report(report)
            if record is not None:
                self.records.add(record)
                if report.failed and record.failed_verdicts:
                    self._failed_calls[report.nodeid] = report
            for name, value in report.user_properties:
                if name == NOT_MEASURED:
                    self.not_measured.append((report.nodeid, str(value)))
                elif name == MISSING_VIEW:
                    self.missing_views[str(value)] = None
                elif name == NATIVE_LOG:
                    self.workers_native_lines[str(value)] = None
        elif report.when == "teardown":
            self._add_retained(report)
            self.records.close(report.nodeid)

    def _add_retained(self, report: pytest.TestReport) -> None:
        """What the test left behind, and the verdicts on it, come with its teardown report."""
        after_teardown = record_from_report(report)
        if after_teardown is None or after_teardown.retained is None:
            return
        record = self.records.open_record(report.nodeid)
        failed_call = self._failed_calls.pop(report.nodeid, None)
        if record is not None:
            added = [v for v in after_teardown.verdicts[len(record.verdicts):] if not v.ok]
            if failed_call is not None and added:  # the test failed once: its failure names every figure
                lines = [f"tfmem: {verdict.message}" for verdict in (*record.failed_verdicts, *added)]
                pytest_internals.set_failure_message(failed_call, lines, FIGURES_HELP)
            record.retained = after_teardown.retained
            record.verdicts = after_teardown.verdicts
            record.extra = after_teardown.extra

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for _, write in self.summaries:
            write(terminalreporter)

    def _write_table(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.records:
            terminalreporter.write_sep("=", "tfmem: peak memory need per test (heaviest first)")
            for line in render_table(self.reader(HeaviestTests).rows(subtests=self.settings.subtests)):
                terminalreporter.write_line(line)
        native = self._native_lines()
        if self.workers_native_lines and not native:
            native = [self.native_log.heading(self._verbose), *self.workers_native_lines]
        for line in native:
            terminalreporter.write_line(line)
        for line in self.missing_views:  # pytest-xdist's workers': the controller said no header line of it
            terminalreporter.write_line(f"tfmem: on the workers: {line}", yellow=True)
        if self.not_measured:
            terminalreporter.write_line(f"tfmem: {len(self.not_measured)} test(s) not measured:", yellow=True)
            for nodeid, why in self.not_measured:
                terminalreporter.write_line(f"  {nodeid}: {why}")

    @property
    def _verbose(self) -> bool:
        return self.config.get_verbosity() > 0

    def _native_lines(self) -> list[str]:
        """The heading and the lines of what the frameworks logged while tfmem started them, or nothing."""
        return self.native_log.summary_lines(self._verbose)

    def pytest_unconfigure(self) -> None:
        session_configured(False)
        if self.settings.freeze_at_exit and (self.records or self.collector.freezing):
            garbage.freeze_at_exit()  # a measured session's process: its exit skips what is alive then
        self.records.remove()
        if self._imports is not None:
            self._imports.uninstall()
        if self.collector.freezing:
            self.collector.settle()  # thawed once pytest's own collections are done (_thaw)
