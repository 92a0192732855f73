"""The ``tfmem`` command: read pytest-tfmem reports and baselines without running pytest.

    tfmem compare BASELINE REPORT [--tolerance 10%+16MB] [--markdown] [--all]
    tfmem show REPORT [--top N]
    tfmem plot REPORT -o memory.png [--baseline BASELINE] [--top N] [--session]
    tfmem last [RESULTS] [--all]
    tfmem run [OPTIONS] (script.py | -m module | -- COMMAND) [ARGS]
    tfmem merge -o BASELINE INPUT... [--prefer first|last|max|min|spread]

Exit codes: 0 fine; 1 ``compare`` found a regression beyond tolerance, or the session
``last`` describes did not finish; 2 bad input (a missing, unreadable or corrupt file, a
bad option value, shards that measured a test differently and no ``--prefer``); 141 the reader
of the output closed it early (``tfmem show r.json | head``). ``run`` exits with the code of what
it ran (``run.command``).

Each subcommand is a ``Command`` in ``COMMANDS``: its name, the ``run_*`` function that
runs it, its help and its arguments; adding one is adding a ``Command``. Each ``run_*`` imports
what it needs itself, so ``tfmem run`` starts without pytest and the report code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_tfmem import __version__
from pytest_tfmem.core.settings import parse_positive_int
from pytest_tfmem.files import IMAGE, FileFormatError, Output, overwrite_refusal, prepare_output
from pytest_tfmem.units import (
    DEFAULT_MIN_STEP,
    DEFAULT_TOLERANCE,
    SIZE_FORMS,
    TOLERANCE_FORMS,
    Tolerance,
    parse_size,
    parse_tolerance,
)

if TYPE_CHECKING:
    from pytest_tfmem.gates.compare import Comparison
    from pytest_tfmem.gates.reports import SessionReport

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_BAD_INPUT = 2
EXIT_READER_GONE = 141  # as a shell reports a command that SIGPIPE ended


class CliError(Exception):
    """Bad input the user can fix; printed without a traceback, exit code 2."""


def _option_type(parse: Callable[[object, str], Any], what: str) -> Callable[[str], Any]:
    """An argparse ``type`` from one of the plugin's parsers, so both accept the same forms."""

    def convert(text: str) -> Any:
        try:
            return parse(text, what)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


_TOP = _option_type(parse_positive_int, "number")


def _size(what: str) -> Callable[[str], int]:
    return _option_type(lambda text, name: parse_size(text, what=name), what)


@dataclass(frozen=True)
class Argument:
    """One ``add_argument`` call: the names, then the keywords."""

    names: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)


def argument(*names: str, **options: Any) -> Argument:
    return Argument(names, options)


@dataclass(frozen=True)
class Command:
    """A subcommand: ``tfmem NAME ARGUMENTS...`` calls ``run`` with the parsed arguments."""

    name: str
    run: Callable[[argparse.Namespace], int]
    help: str
    description: str
    arguments: tuple[Argument, ...]
    usage: str | None = None
    # Splits the arguments after the name into the command's options and a rest argparse must not
    # read (``tfmem run``'s script and its arguments); the rest becomes ``args.rest``.
    split: Callable[[list[str], set[str]], tuple[list[str], list[str]]] | None = None

    @property
    def valued_options(self) -> set[str]:
        """The option names that take a value."""
        return {name for each in self.arguments if each.names[0].startswith("-")
                and each.options.get("action") not in ("store_true", "store_false") for name in each.names}

    def add_to(self, subparsers: argparse._SubParsersAction) -> None:
        parser = subparsers.add_parser(self.name, help=self.help, description=self.description, usage=self.usage,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
        for each in self.arguments:
            parser.add_argument(*each.names, **each.options)
        parser.set_defaults(run=self.run)


REPORT = argument("report", metavar="REPORT", help="JSON report (pytest --tfmem-report=PATH)")


def _output(text: str, kind: Output, flag: str) -> Path:
    """Where a command writes ``kind``, its missing directories made (``files.prepare_output``):
    refused, as bad input, where that would replace a file of another kind
    (``files.overwrite_refusal``) or cannot be written."""
    path = Path(text)
    reason = overwrite_refusal(path, kind)
    if reason is not None:
        raise CliError(f"{flag} would write the {kind.name} over {path}: {reason}; it was left unchanged. "
                       f"Give it a path of its own: {flag}=PATH")
    reason = prepare_output(path)
    if reason is not None:
        raise CliError(f"{flag} cannot write the {kind.name} to {path}: {reason}")
    return path


# compare


def _tolerance_for(record_extra: dict[str, Any], report: SessionReport, chosen: Tolerance | None) -> Tolerance:
    if chosen is not None:
        return chosen
    text = record_extra.get("tolerance") or (report.baseline or {}).get("tolerance") or DEFAULT_TOLERANCE
    try:
        return parse_tolerance(text)
    except ValueError as error:
        raise CliError(f"the report holds a bad tolerance: {error}") from None


def run_compare(args: argparse.Namespace) -> int:
    from pytest_tfmem.core.summary import render_table
    from pytest_tfmem.gates.baseline import load_baseline
    from pytest_tfmem.gates.compare import IMPROVEMENT, NEW, REGRESSION, WITHIN, compare, not_run_note
    from pytest_tfmem.gates.environment import environment_differences, unlike_memory
    from pytest_tfmem.gates.reports import (
        comparison_markdown,
        comparison_rows,
        load_report,
        sort_comparisons,
        statuses_by_test,
    )

    baseline = _load(load_baseline, args.baseline)
    report = _load(load_report, args.report)
    unlike = unlike_memory(baseline.environment, report.environment, current_label="in the report")
    comparisons: list[Comparison] = []
    for record in report.tests:
        if record.measurement is not None and unlike is None:
            tolerance = _tolerance_for(record.extra, report, args.tolerance)
            retained = record.retained.bytes if record.retained is not None else None
            entry = baseline.tests.get(record.nodeid)
            comparisons += compare(record.nodeid, record.measurement, entry, tolerance, retained)
    notes = []
    differences = environment_differences(baseline.environment, report.environment, current_label="in the report")
    if differences:
        notes.append("the baseline was recorded in a different environment: " + "; ".join(differences))
    if unlike is not None:
        notes.append(unlike)
    measured = [record.nodeid for record in report.tests if record.measurement is not None]
    not_run = not_run_note(baseline.tests, measured, where="in the report's session")
    if not_run:
        notes.append(not_run)
    shown = sort_comparisons(comparisons if args.all else [c for c in comparisons if c.status != WITHIN])
    if args.markdown:
        title = "pytest-tfmem: memory compared with the baseline"
        print(comparison_markdown(comparisons, title=title, notes=notes), end="")
    else:
        for note in notes:
            print(f"tfmem: warning: {note}", file=sys.stderr)
        if shown:
            print("\n".join(render_table(comparison_rows(shown))))
        statuses = statuses_by_test(comparisons)  # tests, not their quantities
        print(
            f"{statuses.count(REGRESSION)} regression(s), "
            f"{statuses.count(IMPROVEMENT)} improvement(s) beyond tolerance, "
            f"{statuses.count(WITHIN)} within tolerance, {statuses.count(NEW)} not in the baseline"
        )
    return EXIT_REGRESSION if REGRESSION in {c.status for c in comparisons} else EXIT_OK


# show


def run_show(args: argparse.Namespace) -> int:
    from pytest_tfmem.core.summary import render_table, summary_rows
    from pytest_tfmem.gates.compare import IMPROVEMENT, REGRESSION, comparisons_from_record
    from pytest_tfmem.gates.reports import (
        comparison_rows,
        counts_sentence,
        load_report,
        sort_comparisons,
        summary_counts,
    )

    report = _load(load_report, args.report)
    environment = ", ".join(
        f"{key} {value}" for key, value in sorted(report.environment.items()) if value not in (None, [])
    )
    print(f"report {args.report}: created {report.created or '?'}, pytest exit status {report.exitstatus}")
    if environment:
        print(f"environment: {environment}")
    comparisons = [c for record in report.tests for c in comparisons_from_record(record)]
    print(counts_sentence(summary_counts(report.tests), compared=bool(comparisons)))
    if any(record.measurement is not None for record in report.tests):
        print("\n".join(render_table(summary_rows(report.tests, args.top or len(report.tests)))))
    moved = sort_comparisons([c for c in comparisons if c.status in (REGRESSION, IMPROVEMENT)])
    if moved:
        print(f"beyond tolerance of the baseline {(report.baseline or {}).get('path', '')}:")
        print("\n".join(render_table(comparison_rows(moved))))
    return EXIT_OK


# plot


def run_plot(args: argparse.Namespace) -> int:
    from pytest_tfmem.gates.baseline import load_baseline
    from pytest_tfmem.gates.compare import REGRESSION, comparisons_from_record
    from pytest_tfmem.gates.reports import load_report

    try:
        import matplotlib  # noqa: F401

        from pytest_tfmem.cli.plot import plot_peaks, plot_session
    except ImportError:
        raise CliError("tfmem plot needs matplotlib: pip install matplotlib") from None
    _output(args.output, IMAGE, "--output")
    report = _load(load_report, args.report)
    if args.session:
        if all(record.retained is None for record in report.tests):
            raise CliError(f"{args.report} holds no retained figures (written before pytest-tfmem measured them)")
        try:
            drawn = plot_session(report.tests, args.output, top=args.top)
        except OSError as error:
            raise CliError(f"cannot write {args.output!r}: {error.strerror or error}") from None
        print(f"{args.output}: the process after each of {drawn} test(s)")
        return EXIT_OK
    comparisons = [c for record in report.tests for c in comparisons_from_record(record)]
    if args.baseline:
        baseline = _load(load_baseline, args.baseline)
        baseline_peaks = {nodeid: entry.peak for nodeid, entry in baseline.tests.items()}
    else:
        baseline_peaks = {c.nodeid: c.baseline for c in comparisons if c.quantity == "peak" and c.baseline is not None}
    regressed = {c.nodeid for c in comparisons if c.status == REGRESSION}
    try:
        drawn = plot_peaks(report.tests, args.output, baseline_peaks=baseline_peaks, regressed=regressed, top=args.top)
    except OSError as error:
        raise CliError(f"cannot write {args.output!r}: {error.strerror or error}") from None
    print(f"{args.output}: {drawn} test(s) drawn")
    return EXIT_OK


# last


def run_last(args: argparse.Namespace) -> int:
    from pytest_tfmem.journal.reader import describe_last, find_results, project_root

    path = Path(args.results) if args.results else find_results()
    if path is None:
        raise CliError(
            f"no .tfmem/results.jsonl here or in a parent directory up to the project's root "
            f"({project_root(Path.cwd().resolve())}); give the journal's path"
        )
    text, code = describe_last(path, show_all=args.all)
    print(text, file=sys.stdout if code != EXIT_BAD_INPUT else sys.stderr)
    return code


# run


def run_run(args: argparse.Namespace) -> int:
    from pytest_tfmem.run.command import RunOptions, Target, TargetError, run
    from pytest_tfmem.run.summary import RUN_REPORT

    try:
        target = Target.parse(args.rest)
    except TargetError as error:
        raise CliError(str(error)) from None
    options = RunOptions(
        budget=args.budget, kill_at=args.kill_at, gpu_budget=args.gpu_budget,
        report=_output(args.report, RUN_REPORT.output, "--report") if args.report else None,
        plot=_output(args.plot, IMAGE, "--plot") if args.plot else None,
        results=Path(args.results) if args.results else None,
    )
    if options.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError("tfmem run --plot needs matplotlib: pip install matplotlib") from None
    try:
        return run(target, options)
    except OSError as error:
        raise CliError(f"cannot write {error.filename!r}: {error.strerror or error}") from None


def _split_run(tokens: list[str], valued: set[str]) -> tuple[list[str], list[str]]:
    from pytest_tfmem.run.command import split_argv

    return split_argv(tokens, valued)


RUN_DESCRIPTION = """Run a Python script, a Python module or any program; say at the end what memory it took, and
why it died if it was killed.

  tfmem run [OPTIONS] script.py [ARGS]    a Python script, with an agent in its process (where
                                          it was, the frameworks' device figures) from its first line
  tfmem run [OPTIONS] -m module [ARGS]    a Python module, the same way
  tfmem run [OPTIONS] -- COMMAND [ARGS]   any program: its process tree seen from outside only

The peak is each process's own high-water mark (the kernel's, exact). Output, exit code and
signals pass through: the exit code is the program's (128 + N when signal N ended it, 137 for
SIGKILL), 1 when it exited 0 but a budget was passed, 2 for bad input. Ctrl-C reaches the
program; SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to tfmem run are passed on to it."""


# merge


def run_merge(args: argparse.Namespace) -> int:
    from pytest_tfmem.gates import history

    if any(history.is_history(Path(path)) for path in args.inputs):
        return _merge_histories(args)
    from pytest_tfmem.gates.baseline import FORMAT, save_baseline
    from pytest_tfmem.gates.merge import MergeConflict, merge_shards, read_shard

    _output(args.output, FORMAT.output, "--output")
    shards = [_load(read_shard, path) for path in args.inputs]
    try:
        merged = merge_shards(shards, args.prefer)
    except MergeConflict as error:
        raise CliError(f"{error}\n{args.output} was not written") from None
    try:
        save_baseline(merged.baseline, args.output)
    except OSError as error:
        raise CliError(f"cannot write {args.output!r}: {error.strerror or error}") from None
    for note in merged.environment_notes:
        print(f"tfmem: warning: {note}", file=sys.stderr)
    kinds = [shard.kind for shard in shards]
    parts = [f"{kinds.count('report')} report(s)", f"{kinds.count('baseline')} baseline(s)"]
    print(f"{args.output}: {len(merged.baseline.tests)} test(s) from {' and '.join(parts)}")
    left_out = sum(shard.left_out for shard in shards)
    if left_out:
        print(f"{left_out} measured test(s) of the reports did not pass: not taken (a failing run says little)")
    spread = [entry.spread.runs for entry in merged.baseline.tests.values() if entry.spread is not None]
    if spread:
        print(f"{len(spread)} test(s) measured by several inputs keep their spread "
              f"({min(spread)}-{max(spread)} runs each): the gates read it as their noise")
    if merged.conflicts:
        print(f"{len(merged.conflicts)} test(s) measured differently by several inputs: --prefer={args.prefer} chose")
        for conflict in merged.conflicts[:10]:
            print(f"  {conflict.describe()}")
    return EXIT_OK


def _merge_histories(args: argparse.Namespace) -> int:
    """Memory histories (each shard's, copies): folded into one, a line per commit and environment."""
    from pytest_tfmem.files import write_text_atomic
    from pytest_tfmem.gates import history

    others = [path for path in args.inputs if not history.is_history(Path(path))]
    if others:
        raise CliError(f"{', '.join(others)}: not a memory history; histories merge only with histories")
    output = _output(args.output, history.OUTPUT, "--output")
    read = _load(lambda _: history.read_history(*map(Path, args.inputs)), "")
    _say_skipped(read.skipped)
    try:
        write_text_atomic(output, "".join(entry.to_line() for entry in read.entries))
    except OSError as error:
        raise CliError(f"cannot write {str(output)!r}: {error.strerror or error}") from None
    sessions = sum(len(entry.sessions) for entry in read.entries)
    left_out = f"; {len(read.skipped)} line(s) that could not be read left out" if read.skipped else ""
    print(f"{output}: {len(read.entries)} commit(s) and environment(s), {sessions} session(s), "
          f"from {len(args.inputs)} file(s){left_out}")
    return EXIT_OK


def _say_skipped(skipped: list[str]) -> None:
    """Each history line a reader skipped, once, on standard error."""
    for line in skipped:
        print(f"tfmem: warning: line skipped: {line}", file=sys.stderr)


# history


def run_history(args: argparse.Namespace) -> int:
    import fnmatch

    from pytest_tfmem.files import write_text_atomic
    from pytest_tfmem.gates import history_page
    from pytest_tfmem.gates.history import read_history, series, series_key, series_label
    from pytest_tfmem.gates.steps import creep, steps

    page_path = _output(args.html, history_page.OUTPUT, "--html") if args.html else None
    read = _load(lambda _: read_history(*map(Path, args.histories)), "")
    _say_skipped(read.skipped)
    groups: dict[str, list[history_page.Drawn]] = {}
    for nodeid, per_environment in sorted(series(read.entries, args.quantity).items()):
        if args.test and not fnmatch.fnmatchcase(nodeid, args.test):
            continue
        for one in per_environment:
            points = one.points[-args.window :] if args.window else one.points
            drawn = history_page.Drawn(one, tuple(steps(points, args.min_step)), creep(points))
            groups.setdefault(series_key(one.environment), []).append(drawn)
    if not groups:
        print(f"no {args.quantity} figures in {', '.join(args.histories)}" + (f" for {args.test}" if args.test else ""))
    lines: list[str] = []
    for drawn_tests in groups.values():
        commits = {point.commit for drawn in drawn_tests for point in drawn.series.points}
        lines.append(f"{series_label(drawn_tests[0].series.environment)}: {len(commits)} commit(s), "
                     f"{len(drawn_tests)} test(s)")
        quiet = 0
        for drawn in sorted(drawn_tests, key=lambda d: -d.creep_share):
            found = drawn.creep
            crept = drawn.crept(args.min_step)
            if not drawn.steps and not crept:
                quiet += 1
                continue
            lines.append(f"  {drawn.series.nodeid}")
            for step in drawn.steps:
                lines.append(f"    step {step.describe()}")
                advice = step.bisect_advice(drawn.series.nodeid)
                if advice:
                    lines.append(f"      not measured between them; to find the commit: {advice}")
            if crept and found is not None:
                lines.append(f"    since its best: {found.describe()}")
        lines.append(f"  {quiet} test(s) without a step or creep beyond {args.min_step}")
    if args.markdown:
        print(history_page.markdown(list(groups.values()), args.min_step), end="")
    else:
        print("\n".join(lines))
    if page_path is not None:
        text = history_page.page(list(groups.values()), ", ".join(args.histories), args.quantity)
        try:
            write_text_atomic(page_path, text)
        except OSError as error:
            raise CliError(f"cannot write {str(page_path)!r}: {error.strerror or error}") from None
        charts = sum(len(drawn_tests) for drawn_tests in groups.values())
        print(f"{page_path}: {charts} chart(s)", file=sys.stderr)
    return EXIT_OK


# the command


COMMANDS = [
    Command(
        "compare",
        run_compare,
        help="compare a report with a baseline; exit code 1 on a regression",
        description="Compare each test's peak in REPORT (pytest --tfmem-report) with its entry in BASELINE "
        "(pytest --tfmem-save-baseline). Exit code 0: nothing grew beyond tolerance; 1: a regression; "
        "2: bad input.",
        arguments=(
            argument("baseline", metavar="BASELINE", help="baseline file (pytest --tfmem-save-baseline=PATH)"),
            REPORT,
            argument(
                "--tolerance",
                type=_option_type(parse_tolerance, "--tolerance value"),
                help=f"{TOLERANCE_FORMS}; default: each test's marker tolerance, else the report's, else "
                f"{DEFAULT_TOLERANCE}".replace("%", "%%"),  # argparse %-formats help
            ),
            argument("--markdown", action="store_true", help="print Markdown (for a pull-request comment)"),
            argument("--all", action="store_true", help="list every test, not only those beyond tolerance or new"),
        ),
    ),
    Command(
        "show",
        run_show,
        help="print a report as a table",
        description="Print the tests of a JSON report, heaviest first.",
        arguments=(REPORT, argument("--top", type=_TOP, help="show only the N heaviest tests")),
    ),
    Command(
        "plot",
        run_plot,
        help="draw a PNG bar chart of the peaks, or the process's size after each test",
        description="Draw the heaviest tests' peaks as a PNG bar chart, with each test's baseline and budget "
        "marked; with --session, the process's size after each test (one line per pytest-xdist worker) with "
        "the tests and fixtures that left the most marked. Needs matplotlib.",
        arguments=(
            REPORT,
            argument("-o", "--output", required=True, metavar="PNG", help="where to write the chart"),
            argument(
                "--baseline",
                metavar="BASELINE",
                help="baseline file to mark (default: what the report was compared with)",
            ),
            argument("--top", type=_TOP, default=30, help="the N heaviest tests (default 30)"),
            argument(
                "--session",
                action="store_true",
                help="draw the process's size after each test instead, the top retainers marked "
                "(at most 10, from --top)",
            ),
        ),
    ),
    Command(
        "last",
        run_last,
        help="what the last pytest session did, even if it was killed",
        description="Read the results journal pytest-tfmem writes while tests run: the test that was "
        "running when the session stopped, with its last memory reading, and the tests that had "
        "finished. Exit code 0: the session finished; 1: it did not (killed, crashed or still running); "
        "2: no results.",
        arguments=(
            argument(
                "results",
                nargs="?",
                metavar="RESULTS",
                help="the journal (default: .tfmem/results.jsonl here or in the nearest parent directory, up to "
                "the project's root: the nearest holding pytest.ini, pyproject.toml, tox.ini, setup.cfg, setup.py "
                "or .git)",
            ),
            argument("--all", action="store_true", help="list every finished test, not only the last 20"),
        ),
    ),
    Command(
        "run",
        run_run,
        help="run a script (or any command), then say what memory it took and why it died",
        description=RUN_DESCRIPTION,
        usage="tfmem run [OPTIONS] (script.py | -m module | -- COMMAND) [ARGS]",
        split=_split_run,
        arguments=(
            argument("--budget", type=_size("--budget size"), metavar="SIZE",
                     help="exit code 1 (if it exited 0) when the peak passes SIZE; " + SIZE_FORMS.replace("%", "%%")),
            argument("--kill-at", type=_size("--kill-at size"), metavar="SIZE",
                     help="kill the process tree (SIGKILL) as soon as its RSS reaches SIZE"),
            argument("--gpu-budget", type=_size("--gpu-budget size"), metavar="SIZE",
                     help="exit code 1 when the program's memory on a GPU (NVML, or a framework's GPU view) "
                          "passes SIZE"),
            argument("--report", metavar="PATH", help="write the figures as JSON (format: docs/ci.md)"),
            argument("--plot", metavar="PNG",
                     help="draw the memory timeline, host and the frameworks' device views (matplotlib)"),
            argument("--results", metavar="PATH",
                     help="the results journal tfmem last reads (default .tfmem/results.jsonl here)"),
        ),
    ),
    Command(
        "history",
        run_history,
        help="each test's steps and creep across commits, from a memory history (pytest --tfmem-history)",
        description="Read memory histories (pytest --tfmem-history=PATH; several are folded as tfmem merge "
        "does) and name, for each test in each environment, the steps of its figure (a level change larger "
        "than the noise that holds for two commits; its first commit, or the range with git bisect "
        "commands where commits between were not measured) and its creep (the latest level against its "
        "best). --html draws a static page with a chart per test.",
        arguments=(
            argument("histories", nargs="+", metavar="HISTORY", help="memory history file"),
            argument("--html", metavar="PAGE", help="also write a self-contained HTML page, a chart per test"),
            argument("--markdown", action="store_true", help="print Markdown (a sparkline per test that moved)"),
            argument("--min-step", type=_option_type(parse_tolerance, "--min-step value"),
                     default=parse_tolerance(DEFAULT_MIN_STEP),
                     help="the smallest change that is a step or creep, beyond the measured noise: "
                          f"{TOLERANCE_FORMS} (default {DEFAULT_MIN_STEP})".replace("%", "%%")),
            argument("--window", type=_TOP, help="only the last N commits of each series (default all)"),
            argument("--quantity", default="peak",
                     help="the figure: peak (default), retained, or a GPU view's name (tf:GPU:0)"),
            argument("--test", metavar="PATTERN", help="only the tests whose node id matches (fnmatch: '*test_fit*')"),
        ),
    ),
    Command(
        "merge",
        run_merge,
        help="merge the reports or baselines of a suite's shards into one baseline, or memory histories into one",
        description="Write one baseline from the JSON reports (pytest --tfmem-report; their passed tests) "
        "and baselines of a suite's shards. A test two inputs measured with different figures stops the "
        "merge (exit code 2) unless --prefer says which wins, or --prefer=spread says the inputs are runs of "
        "the same code (each test keeps their median and spread, read by the gates as its noise). Memory "
        "histories (pytest --tfmem-history) "
        "merge into one history instead: a line per commit and environment, shards' tests together, each "
        "session once. The output is written atomically and may be one of the inputs.",
        arguments=(
            argument("inputs", nargs="+", metavar="INPUT", help="JSON report, baseline or memory history file"),
            argument("-o", "--output", required=True, metavar="OUTPUT", help="the baseline (or history) file to write"),
            argument(
                "--prefer",
                # gates.merge.PREFER_RULES, not imported here: it brings pytest (tests/test_run.py checks)
                choices=("first", "last", "max", "min", "spread"),
                help="which input wins a test measured differently by several: the first or last named, "
                "or the highest or lowest peak; or spread: every input's figures, as runs of the same code "
                "(default: refuse)",
            ),
        ),
    ),
]


def _load(load: Callable[[str], Any], path: str) -> Any:
    try:
        return load(path)
    except FileFormatError as error:
        raise CliError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfmem",
        description="pytest-tfmem without pytest: compare a JSON report with a baseline (a CI gate), show "
        "and plot reports, merge them into a baseline, read the memory history and the results journal "
        "(what the last session was running), and run a script under a memory budget.",
        epilog="exit codes: 0 fine; 1 a regression beyond tolerance (compare), or the session `last` describes "
        "did not finish; 2 bad input; 141 the reader of the output closed it (tfmem show ... | head); "
        "`run` exits with the code of what it ran",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s (pytest-tfmem) {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for command in COMMANDS:
        command.add_to(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    tokens = list(sys.argv[1:] if argv is None else argv)
    command = next((c for c in COMMANDS if tokens and c.name == tokens[0] and c.split is not None), None)
    rest: list[str] = []
    if command is not None and command.split is not None:
        own, rest = command.split(tokens[1:], command.valued_options)
        tokens = [tokens[0], *own]
    args = parser.parse_args(tokens)
    args.rest = rest
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return args.run(args)
    except CliError as error:
        print(f"tfmem: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # the reader stopped early (``| head``): no traceback, and none at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_READER_GONE


if __name__ == "__main__":
    sys.exit(main())
