"""Scenario suite glue: the ``scenario``/``variant`` markers and the side-by-side summary table.

Each variant test carries ``@pytest.mark.variant(role, description)`` (role ``problem``, ``fix``,
or ``no help`` for advice that saved nothing here) in a module marked
``pytestmark = pytest.mark.scenario(name)``. Role ``measured`` leaves the role to the test: it
measures, then states with the ``measured_variant`` fixture the role its numbers earned (``fix``
or ``no help``), and may add notes printed under the table. The variant rides on the test report
(so the pytest-xdist controller and isolated runs see it too) and is joined with the test's tfmem
record at the end of the session into one table: per scenario, each variant's peak, its ratio to
the problem's peak, its leak per iteration where a leak check ran, and the outcome.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable, Generator, Iterator
from types import ModuleType
from typing import Any

import pytest

from pytest_tfmem.core.manager import manager
from pytest_tfmem.core.record import TestRecord, record_from_report
from pytest_tfmem.core.summary import render_table
from pytest_tfmem.units import format_size

from . import keras_3, scale

# TensorFlow keeps CPU allocator statistics only with oneDNN on, its default on some x86 CPUs and
# not on others: on, the scenarios measure the same TensorFlow on every machine (before any
# scenario module imports it).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
# TensorFlow logs from C++ to standard error, at its runtime's start among others (`E0000 ... failed
# call to cuInit` on a machine without a GPU): printed between the progress dots of the workers, an
# `E` reads as the scenarios' error. Where the user has not set its level, only fatal lines are shown.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

VARIANT_PROPERTY = "tfmem_scenario_variant"
NOTE_PROPERTY = "tfmem_scenario_note"
MEASURED = "measured"  # the role of a variant whose test decides it from its own numbers
DECIDED_ROLES = ("fix", "no help")
ROLE_ORDER = {"problem": 0, "fix": 1, "no help": 2}  # the table's order within a scenario
TABLE_PLUGIN = "tfmem-scenario-table"
# How a failed check reads in the table's outcome column.
CHECK_WORDS = {"budget": "over budget", "leak": "leak", "kill_at": "killed at kill_at", "signal": "killed by a signal"}
# One variant's result: its marker data, its tfmem record (if measured), its outcome.
Row = tuple[dict[str, Any], "TestRecord | None", str]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``longest`` first, the rest in their order: pytest-xdist hands tests out in
    that order, and a long one started last keeps one worker busy while the other has finished."""
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "scenario(name): the scenario a module's tests belong to")
    config.addinivalue_line(
        "markers", "variant(role, description): a scenario's variant; role 'problem', 'fix' or 'no help'"
    )
    config.addinivalue_line("markers", "longest: a scenario test that takes several seconds: run first")
    try:
        scale()
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    if not config.pluginmanager.has_plugin(TABLE_PLUGIN):
        config.pluginmanager.register(ScenarioTable(), TABLE_PLUGIN)


@pytest.fixture(scope="session")
def keras_warmed_up(request: pytest.FixtureRequest) -> None:
    """Keras's one-time costs paid before any scenario is measured (set-up is not charged), where
    pytest-tfmem did not pay them in this process (an isolated test's, --no-tfmem-first-use-warmup)."""
    if not (manager(request.config).warmed("Keras") and keras_3()):  # tf.keras is tf-keras: not warmed
        from .warmup import warm_up_keras

        warm_up_keras()


@pytest.fixture
def keras(keras_warmed_up: None) -> Iterator[ModuleType]:
    """``tf.keras``, warmed up; Keras's global state (name counters, dtype policy) cleared after
    the test. (What TensorFlow 2.21 keeps of a fitted model stays: scenario 4 measures it.)"""
    import tensorflow as tf

    yield tf.keras
    tf.keras.backend.clear_session()
    gc.collect()


class MeasuredVariant:
    """What a ``variant("measured", ...)`` test decided from its numbers, and its notes."""

    def __init__(self) -> None:
        self.role: str | None = None
        self.reason = ""
        self.notes: list[str] = []

    def decide(self, role: str, reason: str) -> None:
        """The role the numbers earned (``fix`` or ``no help``) and why, in a few words."""
        if role not in DECIDED_ROLES:
            raise ValueError(f"invalid variant role {role!r}: expected one of {', '.join(DECIDED_ROLES)}")
        self.role, self.reason = role, reason

    def note(self, text: str) -> None:
        """A line printed under the scenario table."""
        self.notes.append(text)


MEASURED_KEY = pytest.StashKey[MeasuredVariant]()
LEAK_KEY = pytest.StashKey[dict]()


@pytest.fixture
def leak_in_a_child(request: pytest.FixtureRequest) -> Callable[[dict], None]:
    """For a variant whose leak check ran in a process of its own: ``leak_in_a_child(report)``
    (``{"per_iteration": bytes, "leaked": bool}``) puts its growth per iteration and its verdict
    in the table, where tfmem's own leak check would put them."""

    def record(report: dict) -> None:
        request.node.stash[LEAK_KEY] = {"growth_per_iteration": report["per_iteration"], "leaked": report["leaked"]}

    return record


@pytest.fixture
def measured_variant(request: pytest.FixtureRequest) -> MeasuredVariant:
    variant = request.node.get_closest_marker("variant")
    if variant is None or variant.args[0] != MEASURED:
        pytest.fail(f"measured_variant needs @pytest.mark.variant({MEASURED!r}, description) on the test",
                    pytrace=False)
    return request.node.stash.setdefault(MEASURED_KEY, MeasuredVariant())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    scenario, variant = item.get_closest_marker("scenario"), item.get_closest_marker("variant")
    if call.when == "call" and scenario is not None and variant is not None:
        role, description = variant.args
        data = {"scenario": scenario.args[0], "role": role, "description": description}
        if LEAK_KEY in item.stash:
            data["leak"] = item.stash[LEAK_KEY]
        measured = item.stash.get(MEASURED_KEY, None)
        if role == MEASURED and measured is not None:
            if measured.role is not None:
                data.update(role=measured.role, reason=measured.reason)
            for text in measured.notes:
                report.user_properties.append((NOTE_PROPERTY, json.dumps({"scenario": scenario.args[0], "text": text})))
        report.user_properties.append((VARIANT_PROPERTY, json.dumps(data)))
    return report


class ScenarioTable:
    """Gathers variant results from reports; prints them side by side after pytest-tfmem's table."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.notes: list[tuple[str, str]] = []  # (scenario, text)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == VARIANT_PROPERTY:
                # where the test is defined: the order within a role, whichever worker ran it first
                variant = {**json.loads(str(value)), "place": [report.location[0], report.location[1] or 0]}
                self.rows.append((variant, record_from_report(report), _outcome(report, variant)))
            elif name == NOTE_PROPERTY:
                note = json.loads(str(value))
                self.notes.append((note["scenario"], note["text"]))

    @pytest.hookimpl(tryfirst=True)  # first: what the suite is for, before tfmem's own sections
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.rows:
            return
        terminalreporter.write_sep("=", "tfmem scenarios: what was caught, and what fixed it")
        for line in self.cases():
            terminalreporter.write_line(line)
        terminalreporter.write_sep("-", "each variant side by side")
        for line in render_table(self.table()):
            terminalreporter.write_line(line)
        for scenario, text in sorted(self.notes):
            terminalreporter.write_line(f"{scenario}: {text}")

    def cases(self) -> list[str]:
        """One line per scenario: what caught each problem, and each fix's figure against it:
        ``1. large dataset: caught numpy arrays + ... (over budget, 249.1 MiB); fixed by ... (23.9 MiB, 0.10x)``."""
        lines = []
        for scenario, variants in self._by_scenario().items():
            reference = _problem_peak(variants)
            parts = []
            for variant, record, outcome in variants:
                figure = _case_figure(variant, record, reference)
                words = _explain(outcome, variant, record).removeprefix("caught: ").removeprefix("passed").strip()
                words = words[1:-1] if words.startswith("(") and words.endswith(")") else words  # "(isolated)"
                words = f"{words}, " if words else ""
                if variant["role"] == "problem":
                    parts.append(f"caught {variant['description']} ({words}{figure})")
                elif variant["role"] == "fix":
                    parts.append(f"fixed by {variant['description']} ({words}{figure})")
            lines.append(f"{scenario}: " + "; ".join(parts))
        return lines

    def _by_scenario(self) -> dict[str, list[Row]]:
        by_scenario: dict[str, list[Row]] = {}
        for row in self.rows:
            by_scenario.setdefault(row[0]["scenario"], []).append(row)
        return {scenario: sorted(by_scenario[scenario], key=_table_order) for scenario in sorted(by_scenario)}

    def table(self) -> list[list[str]]:
        header = ["scenario / variant", "peak", "vs problem", "leak/iter", "outcome"]
        rows = [header]
        for scenario, variants in self._by_scenario().items():
            reference = _problem_peak(variants)
            rows.append([scenario, "", "", "", ""])
            for variant, record, outcome in variants:
                peak = _peak(record)
                ratio = f"{peak / reference:.2f}x" if peak is not None and reference else "-"
                rows.append([f"  {variant['role']}: {variant['description']}", format_size(peak), ratio,
                             _leak_per_iteration(_leak(variant, record)), _explain(outcome, variant, record)])
        return rows


def _case_figure(variant: dict, record: TestRecord | None, reference: int | None) -> str:
    """``+4.0 MiB per iteration`` for a variant a leak check judged, else its peak, with its ratio
    to the problem's for a fix: ``26.4 MiB, 0.09x``."""
    leak = _leak(variant, record)
    if leak is not None and leak.get("growth_per_iteration") is not None:
        return f"{_leak_per_iteration(leak)} per iteration"
    peak = _peak(record)
    if peak is None or not reference or variant["role"] == "problem":
        return format_size(peak)
    return f"{format_size(peak)}, {peak / reference:.2f}x"


def _table_order(row: Row) -> tuple[int, str, int]:
    """Problems, then fixes, then no help; within a role, in the order the tests are defined (the
    same under pytest-xdist, where they finish in another order)."""
    variant = row[0]
    path, line = variant["place"]
    return ROLE_ORDER.get(variant["role"], len(ROLE_ORDER)), path, line


def _peak(record: TestRecord | None) -> int | None:
    return record.measurement.peak if record is not None and record.measurement is not None else None


def _problem_peak(variants: list[Row]) -> int | None:
    """The peak a scenario's fixes are compared with: its problem's."""
    return next((_peak(record) for variant, record, _ in variants if variant["role"] == "problem"), None)


def _leak(variant: dict, record: TestRecord | None) -> dict | None:
    """The variant's leak check: tfmem's record of it, or the one its child ran (``leak_in_a_child``)."""
    leak = record.extra.get("leak") if record is not None else None
    leak = leak if isinstance(leak, dict) else variant.get("leak")
    return leak if isinstance(leak, dict) else None


def _leak_per_iteration(leak: dict | None) -> str:
    growth = leak.get("growth_per_iteration") if leak is not None else None
    return "-" if growth is None else format_size(growth, signed=True)


def _outcome(report: pytest.TestReport, variant: dict[str, str]) -> str:
    role = variant["role"]
    if report.passed and "reason" in variant:  # a measured variant: the role its numbers earned
        return f"{role}: {variant['reason']}"
    if hasattr(report, "wasxfail"):
        return "no help" if role == "no help" else "caught"
    if report.passed:
        return "passed"
    if report.skipped:
        return "skipped"
    if role != "fix" and "XPASS(strict)" in str(report.longrepr):
        return "NOT CAUGHT" if role == "problem" else "SAVED MEMORY: update docs/scenarios.md"
    return "FAILED"


def _explain(outcome: str, variant: dict, record: TestRecord | None) -> str:
    """``caught: over budget`` -- what failed, in words: failed checks, a leak found in the body
    (or in the variant's child)."""
    if record is None:
        return outcome
    where = " (isolated)" if "isolated" in record.extra else ""
    if outcome not in ("caught", "no help", "FAILED"):
        return outcome + where
    failed = [CHECK_WORDS.get(v.check, v.check) for v in record.failed_verdicts]
    leak = _leak(variant, record)
    if leak is not None and leak.get("leaked") and "leak" not in failed:
        failed.append("leak")  # raised by tfmem.assert_no_leak in the test body
    return (f"{outcome}: {', '.join(failed)}" if failed else outcome) + where
