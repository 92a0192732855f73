"""pytest hooks, options, markers and the ``tfmem`` fixture. Thin glue: no arithmetic here.

Registered through the ``pytest11`` entry point ``tfmem``. The plugin is inert unless a
tfmem option or ini value is set, or a test uses a tfmem marker or the ``tfmem`` fixture.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from . import hookspecs, settings
from .checks import Verdict, check_budget
from .errors import failure_for
from .fixture import TfmemFixture
from .measure import Measurement, Monitor
from .probes import tf as tf_probe
from .records import TestRecord, record_from_report
from .report import render_table, summary_rows

# Feature modules, each a pytest plugin of its own (options, markers, hooks).
pytest_plugins: list[str] = ["pytest_tfmem.gates", "pytest_tfmem.trace", "pytest_tfmem.isolate", "pytest_tfmem.journal", "pytest_tfmem.gpu", "pytest_tfmem.explain", "pytest_tfmem.leak_marker"]
MONITOR = pytest.StashKey[Monitor]()
RECORD = pytest.StashKey[TestRecord]()
ARGUMENTS = pytest.StashKey[dict]()
PLUGIN_NAME = "tfmem-manager"
# Markers besides ``tfmem`` that make a test measured; feature modules add theirs.
MEASURING_MARKERS = {settings.MARKER}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser, settings.CORE_OPTIONS)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "tfmem(budget=None, ...): memory policy for this test; budget='512MB' overrides "
        "--tfmem-budget, budget=None exempts the test (pytest-tfmem)",
    )
    config.pluginmanager.register(TfmemManager(config), PLUGIN_NAME)


@pytest.fixture
def tfmem(request: pytest.FixtureRequest) -> TfmemFixture:
    """Measure blocks (``with tfmem.measure() as m``), read ``peak()``/``current()``, ``clean()``."""
    item = request.node
    return TfmemFixture(lambda: item.stash.get(MONITOR, None))


def manager(config: pytest.Config) -> TfmemManager:
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    assert isinstance(plugin, TfmemManager)
    return plugin


class TfmemManager:
    """Measures tests, applies checks, gathers records (also from xdist workers), summarises."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.settings = settings.CoreSettings.from_config(config)
        self.records: list[TestRecord] = []
        # A tfmem option was given (budget, baseline, report, GPU budget...): measure every test
        self.measure_every_test = self.settings.any_set
        self._tensorflow_prepared = False

    def is_measured(self, item: pytest.Item) -> bool:
        return (
            self.measure_every_test
            or any(item.get_closest_marker(name) for name in MEASURING_MARKERS)
            or "tfmem" in getattr(item, "fixturenames", ())
        )

    def budget_for(self, item: pytest.Item) -> int | None:
        arguments = item.stash.get(ARGUMENTS, {})
        return arguments["budget"] if "budget" in arguments else self.settings.budget

    def prepare_tensorflow(self) -> None:
        """Once TF is loaded: let features configure devices, then start its runtime."""
        if self._tensorflow_prepared:
            return
        tf = tf_probe.loaded_tensorflow()
        if tf is None:
            return
        self._tensorflow_prepared = True
        self.config.hook.pytest_tfmem_configure_tensorflow(
            config=self.config, tf=tf, runtime_started=tf_probe.runtime_started()
        )
        if self.settings.tf_warmup:
            tf_probe.start_runtime(tf)

    def finish(self, item: pytest.Item, measurement: Measurement) -> TestRecord:
        """Apply the checks to a measurement and attach the record to the item's report."""
        record = TestRecord(item.nodeid, measurement, budget=self.budget_for(item))
        verdicts: list[Verdict | None] = [check_budget(measurement, record.budget)]
        verdicts += self.config.hook.pytest_tfmem_check(item=item, record=record)
        record.verdicts = [v for v in verdicts if v is not None]
        item.stash[RECORD] = record
        # On the item, so the call and teardown reports both carry it (JUnit XML reads teardown's)
        item.user_properties.extend(record.user_properties())
        return record

    def fail_if_needed(self, record: TestRecord) -> None:
        failed = record.failed_verdicts
        if failed:
            raise failure_for(failed[0].check, "\n".join(f"tfmem: {v.message}" for v in failed))

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            item.stash[ARGUMENTS] = settings.marker_arguments(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Generator[None, object, object]:
        """Measure the test body (the call phase; see README, "Which phase is budgeted")."""
        if not self.is_measured(pyfuncitem):
            return (yield)
        self.prepare_tensorflow()
        monitor = Monitor()
        pyfuncitem.stash[MONITOR] = monitor
        monitor.start()
        try:
            result = yield
        finally:
            del pyfuncitem.stash[MONITOR]
            record = self.finish(pyfuncitem, monitor.stop())
        self.fail_if_needed(record)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
        report: pytest.TestReport = yield
        record = item.stash.get(RECORD, None)
        if call.when == "call" and record is not None:
            report.sections.append(("tfmem", _section_text(record)))
        return report

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            record = record_from_report(report)
            if record is not None:
                self.records.append(record)

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.records:
            return
        terminalreporter.write_sep("=", "tfmem: peak memory need per test (heaviest first)")
        for line in render_table(summary_rows(self.records, self.settings.top)):
            terminalreporter.write_line(line)


def _section_text(record: TestRecord) -> str:
    assert record.measurement is not None
    rows = render_table(summary_rows([record], 1))
    return "\n".join([*rows, *record.measurement.notes])
