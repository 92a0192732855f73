"""CI gates, the pytest side: baselines with tolerance, the JSON report, the Markdown summary.

Under pytest-xdist every worker loads the baseline and judges its own tests (so verdicts
are the same as without xdist); only the controller, which gathers every test's record
from the test reports, saves baselines and writes reports.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from pytest_tfmem import __version__
from pytest_tfmem.core import features, processes, settings
from pytest_tfmem.core.features import Summary
from pytest_tfmem.core.manager import ARGUMENTS, manager
from pytest_tfmem.core.record import RetainedFigures, TestRecord
from pytest_tfmem.core.summary import HeaviestTests, render_table
from pytest_tfmem.core.verdict import Verdict
from pytest_tfmem.files import Output, set_aside, write_text_atomic
from pytest_tfmem.gates import history_plugin, reports
from pytest_tfmem.gates.baseline import Baseline, BaselineError, is_saved, load_baseline, save_baseline
from pytest_tfmem.gates.compare import (
    IMPROVEMENT,
    SECTION,
    baseline_verdict,
    compare,
    compare_retained,
    not_run_note,
    record_section,
    retained_ceiling,
)
from pytest_tfmem.gates.environment import (
    current_environment,
    environment_differences,
    memory_environment,
    unlike_memory,
)
from pytest_tfmem.gates.reports import (
    FORMAT as report_format,
    Comparisons,
    SessionReport,
    SummaryCounts,
    comparison_rows,
    counts_sentence,
    session_markdown,
    write_report,
)
from pytest_tfmem.units import DEFAULT_TOLERANCE, TOLERANCE_FORMS, Tolerance, format_size, parse_tolerance

STEP_SUMMARY = "GITHUB_STEP_SUMMARY"

BASELINE = settings.Option(
    "baseline",
    "compare each test with this baseline file: its peak, GPU views' peaks and what it left behind; a test "
    "grown beyond tolerance fails once, naming every figure that moved",
    settings.parse_path,
)
SAVE_BASELINE = settings.Option(
    "save_baseline",
    "save each passed test's figures into this baseline file (merged into it if it exists; written atomically)",
    settings.parse_path,
)
BASELINE_PRUNE = settings.Option(
    "baseline_prune",
    "with --tfmem-save-baseline: drop the entries of tests that did not run in this session",
    settings.parse_bool,
    False,
    flag=True,
)
TOLERANCE = settings.Option(
    "tolerance",
    f"how far a peak may move from its baseline: {TOLERANCE_FORMS} (default {DEFAULT_TOLERANCE})",
    parse_tolerance,
    parse_tolerance(DEFAULT_TOLERANCE),
)
REPORT = settings.Option("report", "write a JSON report of every measured test to this file", settings.parse_path)
MARKDOWN = settings.Option("markdown", "write a Markdown summary to this file", settings.parse_path)
GITHUB_SUMMARY = settings.Option(
    "github_summary",
    f"append the Markdown summary to the file named by ${STEP_SUMMARY} (GitHub Actions' job page); "
    "without it nothing is written there",
    settings.parse_bool,
    False,
    flag=True,
)
OPTIONS = [BASELINE, SAVE_BASELINE, BASELINE_PRUNE, TOLERANCE, REPORT, MARKDOWN, GITHUB_SUMMARY]
# A save merges into the file it names: an existing one is read, and refused in detail, before the run.
SAVED_BASELINE = Output("baseline", recognise=None)


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser, [*OPTIONS, *history_plugin.OPTIONS])


# A run that ended like this says nothing reliable about memory: no baseline or history is written from it.
UNFINISHED = {pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR}


TFMEM_DECLARATIONS = features.Declarations(marker_keywords={"tolerance": parse_tolerance})


def pytest_configure(config: pytest.Config) -> None:
    history = history_plugin.MemoryHistory(config)
    config.pluginmanager.register(history, "tfmem-history")
    gates = CiGates(config, history)
    config.pluginmanager.register(gates, "tfmem-gates")
    tfmem_manager = manager(config)
    tfmem_manager.known_peak = gates.known_peak
    tfmem_manager.add_summary(Summary.GATES, gates.write_summary)
    # what the JSON report says of every test, gathered in the one pass of the records at the end
    tfmem_manager.add_reader(SummaryCounts, SummaryCounts)
    tfmem_manager.add_reader(RetainedFigures, RetainedFigures)
    baseline_tests = gates.baseline.tests if gates.baseline is not None else {}
    tfmem_manager.add_reader(Comparisons, lambda: Comparisons(baseline_tests))  # the summaries' comparisons


class CiGates:
    """Per-session state: the loaded baseline, where to save and report, and what happened."""

    def __init__(self, config: pytest.Config, history: history_plugin.MemoryHistory) -> None:
        self.config = config
        self.history = history  # recorded, and drawn in the Markdown, at the session's end
        values = {option.name: settings.read_option(config, option)[0] for option in OPTIONS}
        # the files it writes: never over a file of another kind, a test file above all
        values.update({option.name: settings.read_output_option(config, option, kind) for option, kind in (
            (SAVE_BASELINE, SAVED_BASELINE), (REPORT, report_format.output), (MARKDOWN, reports.MARKDOWN))})
        self.tolerance: Tolerance = values["tolerance"]
        self.prune: bool = values["baseline_prune"]
        self.baseline_path: Path | None = values["baseline"]
        self.save_path: Path | None = values["save_baseline"]
        self.report_path: Path | None = values["report"]
        self.markdown_path: Path | None = values["markdown"]
        self.github_summary: bool = values["github_summary"]
        paths = (self.baseline_path, self.save_path, self.report_path, self.markdown_path)
        self.active = self.github_summary or any(p is not None for p in paths)
        self.baseline = self._load(self.baseline_path, missing_ok=False)
        # The file a save merges into: validated now, so a bad one stops the run before any test
        # (read by pytest-xdist's workers too: a figure far above its entry is measured again).
        self.save_into: Baseline | None = None
        writer = processes.role(config).writes_session_outputs  # xdist workers judge, they do not write
        if self.save_path is not None:
            same = self.save_path == self.baseline_path
            self.save_into = self.baseline if same else self._load(self.save_path, missing_ok=True)
        self.environment_notes: list[str] = []
        # figures that count something else (phys_footprint on macOS, RSS on Linux) are not compared
        self.unlike = None if self.baseline is None else unlike_memory(self.baseline.environment, memory_environment())
        if self.baseline is not None and writer:
            differences = environment_differences(self.baseline.environment, current_environment())
            if differences:
                self.environment_notes.append(
                    "the baseline was recorded in a different environment: " + "; ".join(differences)
                )
            if self.unlike is not None:
                self.environment_notes.append(self.unlike)
        self.outcome_lines: list[tuple[str, dict[str, bool]]] = []  # for the terminal summary

    def _load(self, path: Path | None, *, missing_ok: bool) -> Baseline | None:
        if path is None:
            return None
        try:
            return load_baseline(path, missing_ok=missing_ok)
        except BaselineError as error:
            advice = ""
            if missing_ok:  # the file --tfmem-save-baseline would merge into
                advice = (
                    " (--tfmem-save-baseline merges into an existing file: fix or remove it; it was left unchanged)"
                )
            raise pytest.UsageError(f"pytest-tfmem: {error}{advice}") from None

    def pytest_tfmem_measure_all(self) -> bool:
        return self.active

    def known_peak(self, item: pytest.Item) -> int | None:
        """The peak the test's baseline entry records (to size xdist workers), or ``None``."""
        entry = self.baseline.tests.get(item.nodeid) if self.baseline is not None else None
        return entry.peak if entry is not None else None

    def _tolerance(self, item: pytest.Item) -> Tolerance:
        return item.stash.get(ARGUMENTS, {}).get("tolerance", self.tolerance)

    @pytest.hookimpl
    def pytest_tfmem_check(self, item: pytest.Item, record: TestRecord) -> Verdict | None:
        """Hold the test to its baseline entry, with its marker's tolerance if it has one."""
        arguments = item.stash.get(ARGUMENTS, {})
        tolerance = self._tolerance(item)
        if "tolerance" in arguments:
            record.extra["tolerance"] = str(tolerance)  # so ``tfmem compare`` applies it too
        if self.baseline is None or record.measurement is None or self.unlike is not None:
            return None
        comparisons = compare(record.nodeid, record.measurement, self.baseline.tests.get(record.nodeid), tolerance)
        record.extra[SECTION] = record_section(comparisons, tolerance)
        return baseline_verdict(comparisons)

    @pytest.hookimpl
    def pytest_tfmem_departure(self, item: pytest.Item, record: TestRecord) -> str | None:
        """A peak above the test's baseline entry (the one compared with, or the one a save merges
        into) by more than the history's floor is measured again before it is compared or saved,
        and so is a first entry a save would make above the floor: a one-time cost of the process
        is no baseline."""
        if record.measurement is None or self.unlike is not None:
            return None
        peak = record.measurement.peak
        recorded = self.baseline if self.baseline is not None else self.save_into
        entry = recorded.tests.get(record.nodeid) if recorded is not None else None
        if entry is None:
            new = self.save_into is not None and record.nodeid not in self.save_into.tests
            if not new or peak <= history_plugin.MIN_STEP.allowance(0):
                return None
            return f"{format_size(peak)}, its first entry in the baseline"
        if peak - entry.peak <= history_plugin.MIN_STEP.allowance(entry.peak):
            return None
        return f"{format_size(peak)} above its baseline entry, {format_size(entry.peak)}"

    @pytest.hookimpl
    def pytest_tfmem_retained_ceiling(self, item: pytest.Item) -> int | None:
        """The most the test may leave behind before its baseline entry's retained figure fails it."""
        entry = self.baseline.tests.get(item.nodeid) if self.baseline is not None and self.unlike is None else None
        if entry is None or entry.retained is None:
            return None
        return retained_ceiling(entry, self._tolerance(item))

    @pytest.hookimpl
    def pytest_tfmem_check_retained(self, item: pytest.Item, record: TestRecord) -> Verdict | None:
        """Hold what the test left behind to its baseline entry's retained figure, where it has one."""
        entry = self.baseline.tests.get(record.nodeid) if self.baseline is not None and self.unlike is None else None
        if entry is None or entry.retained is None or record.retained is None or record.measurement is None:
            return None
        tolerance = self._tolerance(item)
        comparison = compare_retained(record.nodeid, record.retained.bytes, entry, tolerance)
        peak = compare(record.nodeid, record.measurement, entry, tolerance)
        record.extra[SECTION] = record_section([*peak, comparison], tolerance)
        verdict = baseline_verdict([comparison])
        return Verdict("retained_baseline", verdict.ok, verdict.message)

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        writes = (self.save_path, self.report_path, self.markdown_path)
        if not processes.role(self.config).writes_session_outputs or not (
            any(path is not None for path in writes) or self.history.active or self.github_summary
        ):
            return
        if self.report_path is not None:
            self._write(session, "JSON report", self.report_path, lambda path: self._write_report(path, exitstatus))
        if self.save_path is None and self.markdown_path is None and not (self.history.active or self.github_summary):
            return
        # the files CI reads hold every test: each reads the records back from the store's file
        records = manager(self.config).records
        if self.save_path is not None:
            self._save_baseline(session, records, exitstatus)
        if self.history.active:
            if self.history.gate is not None:
                self.history.past()  # read here too (pytest-xdist's workers gate): its skipped lines are said once
            self.history.record(session, records, finished=exitstatus not in UNFINISHED)
            self.outcome_lines += self.history.outcome_lines
        if self.markdown_path is None and not self.github_summary:
            return
        tfmem = manager(self.config)
        comparisons = tfmem.reader(Comparisons)
        markdown = session_markdown(
            tfmem.reader(SummaryCounts).counts, comparisons, tfmem.reader(HeaviestTests).rows(),
            top=tfmem.settings.top, notes=self.notes(comparisons.measured),
            history=self.history.markdown_lines(records),
        )
        if self.markdown_path is not None:
            self._write(session, "Markdown summary", self.markdown_path, lambda path: write_text_atomic(path, markdown))
        if self.github_summary:
            self._append_step_summary(session, bool(records), markdown)

    def not_run(self, measured: set[str]) -> str | None:
        """How many baseline tests this session did not measure (a shard runs only its share)."""
        if self.baseline is None:
            return None
        return not_run_note(self.baseline.tests, measured, where="in this session")

    def notes(self, measured: set[str]) -> list[str]:
        """What the Markdown summary says above its tables (``measured``: the baseline's tests measured)."""
        not_run = self.not_run(measured)
        return self.environment_notes + ([not_run] if not_run else [])

    def _append_step_summary(self, session: pytest.Session, any_records: bool, markdown: str) -> None:
        """``--tfmem-github-summary``: add the summary to the job's page (only when asked: the
        variable alone is set in every GitHub Actions step, also for sessions that never asked)."""
        step_summary = os.environ.get(STEP_SUMMARY)
        if not step_summary:
            self.outcome_lines.append((f"${STEP_SUMMARY} is not set: no summary appended to it", {"yellow": True}))
        elif any_records:
            self._write(session, f"${STEP_SUMMARY}", Path(step_summary), lambda path: _append_text(path, markdown))

    def _save_baseline(self, session: pytest.Session, records: Iterable[TestRecord], exitstatus: int) -> None:
        assert self.save_path is not None and self.save_into is not None
        if exitstatus in UNFINISHED:
            how = pytest.ExitCode(exitstatus).name.lower().replace("_", " ")
            message = f"baseline not saved: the run was {how}; {self.save_path} is unchanged"
            self.outcome_lines.append((message, {"yellow": True}))
            return
        updated = self.save_into.merged(records, prune=self.prune)
        saved = unconfirmed = 0
        for record in records:
            saved += is_saved(record)
            unconfirmed += bool(record.unconfirmed)
        kept = f", {unconfirmed} kept their entry (a departure left unconfirmed)" if unconfirmed else ""
        self._write(
            session,
            "baseline",
            self.save_path,
            lambda path: save_baseline(updated, path),
            done=f"baseline saved to {self.save_path}: {saved} test(s) updated{kept}, {len(updated.tests)} in the file",
        )

    def _write_report(self, path: Path, exitstatus: int) -> None:
        """The JSON report, its tests streamed from the record store in node-id order."""
        baseline = None
        if self.baseline_path is not None:
            baseline = {"path": str(self.baseline_path), "tolerance": str(self.tolerance)}
        report = SessionReport(
            tests=[], environment=current_environment(), baseline=baseline, exitstatus=int(exitstatus),
            version=__version__,
        )
        tfmem = manager(self.config)
        summary, account = tfmem.reader(SummaryCounts).counts, tfmem.reader(RetainedFigures).account()
        columns = tfmem.reader(HeaviestTests).rows()[0]
        write_report(report, path, tfmem.records.by_nodeid(), summary, account, columns)

    def _write(
        self, session: pytest.Session, what: str, path: Path, write: Callable[[Path], None], done: str | None = None
    ) -> None:
        """Write one output; where that fails (a full disk, permissions changed during the run), it
        goes to ``.tfmem/unwritten/`` instead, the session says where, and its exit code says that an
        output was not written where asked: the session's figures are never lost."""
        try:
            write(path)
        except OSError as error:
            message = f"could not write the {what} to {path}: {error.strerror or error}"
            message += set_aside(self.config.rootpath, path, write)
            self.outcome_lines.append((message, {"red": True}))
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return
        self.outcome_lines.append((done or f"{what} written to {path}", {}))

    @pytest.hookimpl
    def write_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tfmem = manager(self.config)
        if self.baseline is not None and tfmem.records:
            self._summarise_comparisons(terminalreporter, tfmem.reader(SummaryCounts).counts,
                                        tfmem.reader(Comparisons))
        elif self.outcome_lines:
            terminalreporter.write_sep("=", "tfmem: CI gates")
        for line, markup in self.outcome_lines:
            terminalreporter.write_line(f"tfmem: {line}", **markup)

    def _summarise_comparisons(
        self, terminalreporter: pytest.TerminalReporter, counts: dict[str, int], comparisons: Comparisons
    ) -> None:
        terminalreporter.write_sep("=", f"tfmem: baseline {self.baseline_path} (tolerance {self.tolerance})")
        for note in self.environment_notes:
            terminalreporter.write_line(f"tfmem: warning: {note}", yellow=True)
        not_run = self.not_run(comparisons.measured)
        if not_run:
            terminalreporter.write_line(f"tfmem: {not_run}")
        terminalreporter.write_line(counts_sentence(counts, compared=True))
        moved = comparisons.moved
        if moved:
            for line in render_table(comparison_rows(moved)):
                terminalreporter.write_line(line)
        if any(c.status == IMPROVEMENT for c in moved):
            terminalreporter.write_line(
                f"tests using less memory than their baseline beyond tolerance: refresh it with "
                f"--tfmem-save-baseline={self.baseline_path}"
            )
        new = sorted(comparisons.new)
        if new:
            terminalreporter.write_line(f"not in the baseline (not compared, they pass): {', '.join(new)}")


def _append_text(path: Path, text: str) -> None:
    """GitHub's step summary file is shared by the job's steps: add to it, never replace it."""
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(text)
