"""``tfmem run``: run a script, a module or any command under the watchdog, and say what memory it took.

    tfmem run [OPTIONS] script.py [ARGS]      a Python script, with the agent (``agent.py``)
    tfmem run [OPTIONS] -m module [ARGS]      a Python module, with the agent
    tfmem run [OPTIONS] -- COMMAND [ARGS]     any program: the outside view only

The child inherits the terminal (its output passes through untouched) and this process's
process group, so Ctrl-C reaches it from the terminal as it reaches any foreground program;
like ``time`` and ``system(3)``, this process ignores SIGINT and SIGQUIT meanwhile. SIGTERM,
SIGHUP, SIGUSR1 and SIGUSR2 sent to ``tfmem run`` are passed on to the child (those of them the
platform has: SIGTERM alone on Windows). The exit code is
the child's; for a child ended by signal N the shell's ``128 + N`` (137 for SIGKILL); 1 when
the child exited 0 but a budget was passed.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from pytest_tfmem import frameworks, platforms
from pytest_tfmem.core.sessions import Session
from pytest_tfmem.journal.format import DEFAULT_PATH, JournalFile, reading_due
from pytest_tfmem.platforms.fork_sizes import ForkSizes, told_sizes_path
from pytest_tfmem.probes import nvml as nvml_probe, system
from pytest_tfmem.probes.watchdog import Watchdog, WatchResult
from pytest_tfmem.run import summary

AGENT = Path(__file__).resolve().parent / "agent.py"
WATCH_INTERVAL_S = 0.05  # a long script pays for each reading for longer
KILL_AT_INTERVAL_S = 0.02  # with --kill-at, as for isolated tests: a fast script passes the limit by less
NVML_INTERVAL_S = 0.05
# By name: the platform has those it has (Windows: SIGTERM and SIGINT).
PASSED_ON = ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")
IGNORED = ("SIGINT", "SIGQUIT")
EXIT_OVER_BUDGET = 1
USAGE = "tfmem run [OPTIONS] (script.py | -m module | -- COMMAND) [ARGS]"


class TargetError(ValueError):
    """What to run is missing or cannot be found."""


@dataclass(frozen=True)
class Target:
    """What to run: ``kind`` "script" (``argv[0]`` the path), "module" (the name) or "command"."""

    kind: str
    argv: tuple[str, ...]

    @classmethod
    def parse(cls, tokens: list[str]) -> Target:
        """``script.py ARGS``, ``-m module ARGS`` or ``-- COMMAND ARGS``, checked to exist."""
        if not tokens or tokens == ["--"] or tokens == ["-m"]:
            raise TargetError("nothing to run: give script.py, -m module or -- COMMAND")
        if tokens[0] == "--":
            program = shutil.which(tokens[1])
            if program is None:
                raise TargetError(f"no such command: {tokens[1]!r} (not a file, not on PATH)")
            return cls("command", tuple(tokens[1:]))
        if tokens[0] == "-m" or tokens[0].startswith("-m"):
            rest = tokens[1:] if tokens[0] == "-m" else [tokens[0][2:], *tokens[1:]]
            top = rest[0].split(".")[0]
            if importlib.machinery.PathFinder.find_spec(top, [os.getcwd(), *sys.path[1:]]) is None:
                raise TargetError(f"no module named {top!r} (looked in the current directory and sys.path)")
            return cls("module", tuple(rest))
        if not Path(tokens[0]).is_file():
            raise TargetError(f"no such script: {tokens[0]!r} (for a program on PATH: tfmem run -- {tokens[0]} ...)")
        return cls("script", tuple(tokens))

    @property
    def label(self) -> tuple[str, ...]:
        return ("-m", *self.argv) if self.kind == "module" else self.argv

    def child_argv(self, readings: Path) -> list[str]:
        if self.kind == "command":
            return list(self.argv)
        return [sys.executable, str(AGENT), str(readings), *self.label]


def split_argv(tokens: list[str], valued: set[str]) -> tuple[list[str], list[str]]:
    """``tfmem run``'s own options, and what to run (from the script, ``-m`` or ``--`` on).

    ``valued``: the options that take a value (``--budget 1GB``), so the value is not taken
    for the script.
    """
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token == "--" or token.startswith("-m") or not token.startswith("-"):
            return tokens[:index], tokens[index:]
        index += 2 if token in valued else 1
    return tokens, []


@dataclass(frozen=True)
class RunOptions:
    budget: int | None = None
    kill_at: int | None = None
    gpu_budget: int | None = None
    report: Path | None = None
    plot: Path | None = None
    results: Path | None = None  # the journal (default .tfmem/results.jsonl here)
    pynvml: Any = None  # the pynvml module (a stand-in in tests); None: import it if installed

    @property
    def watch_interval_s(self) -> float:
        """How often the watchdog reads the tree: more often when it is to kill at a limit."""
        return WATCH_INTERVAL_S if self.kill_at is None else KILL_AT_INTERVAL_S


class RunJournal:
    """The run in the results journal, written as it goes, so ``tfmem last`` tells a killed run's story."""

    def __init__(self, path: Path, target: Target) -> None:
        me = psutil.Process()
        session = Session(round(time.time(), 3), me.pid, me.create_time(), os.getcwd(), ("run", *target.label))
        self.nodeid = " ".join(target.label)
        self.header = {"event": "session", "session": session.id, "kind": "run", **session.to_dict()}
        self.file = JournalFile(path, self.header)
        self._peak = self._written_peak = 0
        self._written_at = time.monotonic()
        self._lock = threading.Lock()

    def open(self) -> bool:
        try:
            self.file.open()
        except OSError as error:
            print(f"tfmem run: warning: cannot write the results journal {self.file.path}: {error}", file=sys.stderr)
            return False
        self.file.append({"event": "start", "worker": None, "nodeid": self.nodeid, "rss": 0})
        return True

    def reading(self, elapsed: float, rss: int, place: Callable[[], summary.Place | None]) -> None:
        """Write a reading when one is due (``place``, where the script is, is asked only then)."""
        with self._lock:
            self._peak = max(self._peak, rss)
            now = time.monotonic()
            if not reading_due(self._peak, self._written_peak, now - self._written_at):
                return
            self._written_peak, self._written_at = self._peak, now
            entry = {"event": "reading", "worker": None, "nodeid": self.nodeid, "elapsed_s": round(elapsed, 3),
                     "rss": rss, "peak": self._peak}
            if (where := place()) is not None:
                entry["where"] = str(where)
            self.file.append(entry)

    def finish(self, result: summary.RunSummary) -> None:
        outcome = "killed" if result.death else ("passed" if result.exit_code == 0 else "failed")
        message = result.death.headline() if result.death else "; ".join(result.verdicts) or None
        self.file.append({
            "event": "finish", "worker": None, "nodeid": self.nodeid, "outcome": outcome,
            "duration_s": round(result.duration_s, 3), "sampled_peak": result.sampled_peak, "peak": result.peak,
            "message": message, "record": None,
        }, sync=True)
        self.file.append({"event": "end", "exitstatus": result.exit_code}, sync=True)
        self.file.close()


class AgentTail:
    """The agent's readings file, read as it grows: the last place the script was seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._pending = b""
        self.last: summary.Place | None = None

    def poll(self) -> summary.Place | None:
        try:
            with open(self.path, "rb") as readings:
                readings.seek(self._offset)
                chunk = readings.read()
        except OSError:
            return self.last
        self._offset += len(chunk)
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in reversed(lines):
            if b'"event": "reading"' in line:
                self.last = summary.Place.from_reading(json.loads(line))
                break
        return self.last


def _numbers(names: tuple[str, ...]) -> list[int]:
    return [getattr(signal, name) for name in names if hasattr(signal, name)]


class PassedSignals:
    """The signals ``tfmem run`` passed on to its child, in order; one that came before the child
    existed is passed on as soon as it does."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None
        self._waiting: list[int] = []

    def pass_on(self, number: int, _frame: object) -> None:
        self.names.append(signal.Signals(number).name)
        if self.process is None:
            self._waiting.append(number)
        else:
            self._send(number)

    def started(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        while self._waiting:
            self._send(self._waiting.pop(0))

    def _send(self, number: int) -> None:
        assert self.process is not None
        try:
            self.process.send_signal(number)
        except ProcessLookupError:
            pass


def _not_ours(_number: int, _frame: object) -> None:
    """SIGINT and SIGQUIT come from the terminal to the child too: the child answers them."""


@contextmanager
def _signals_passed_on() -> Iterator[PassedSignals]:
    """From before the child starts until it ends: leave SIGINT/SIGQUIT to the child, pass SIGTERM,
    SIGHUP, SIGUSR1 and SIGUSR2 on. Python handlers, not SIG_IGN: exec resets a handler to the
    default, so the child answers Ctrl-C as it would alone, while an ignored signal would stay
    ignored in it."""
    passed = PassedSignals()
    before = {number: signal.signal(number, _not_ours) for number in _numbers(IGNORED)}
    before.update({number: signal.signal(number, passed.pass_on) for number in _numbers(PASSED_ON)})
    try:
        yield passed
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def _open_gpu(options: RunOptions, pid: int) -> tuple[nvml_probe.Nvml | None, nvml_probe.NvmlSampler | None]:
    """NVML's view of the script's process on each GPU, sampled, where NVML sees a GPU."""
    session, _ = nvml_probe.Nvml.open(options.pynvml, pid=pid)
    if session is None:
        return None, None
    return session, nvml_probe.NvmlSampler(nvml_probe.process_sources(session), NVML_INTERVAL_S).start()


def run(target: Target, options: RunOptions) -> int:
    """Run ``target`` to its end under the watchdog; print and write what was seen; the exit code
    (the script's, or ``EXIT_OVER_BUDGET`` for a script that passed over its budget)."""
    with tempfile.TemporaryDirectory(prefix="tfmem-run-") as directory:
        readings = Path(directory) / "agent.jsonl"
        journal = RunJournal(options.results or Path.cwd() / DEFAULT_PATH, target)
        journaling = journal.open()
        tail = AgentTail(readings)
        limit = system.applicable_memory_limit()
        started = time.time()
        # what the script's forks tell (the agent's page)
        told = ForkSizes(platforms.current().current_size, told_sizes_path(str(readings)))
        environment, gpu_environment = None, []
        if options.gpu_budget is not None:  # GPU figures of a framework's pool would say nothing
            environment = dict(os.environ)
            gpu_environment = frameworks.set_gpu_environment(environment)

        def on_reading(elapsed: float, rss: int) -> None:
            if journaling:
                journal.reading(elapsed, rss, tail.poll)

        # in place before the child starts: a Ctrl-C while tfmem run still opens its GPU view is the child's
        with _signals_passed_on() as passed:
            process = subprocess.Popen(target.child_argv(readings), env=environment)
            passed.started(process)
            gpu, gpu_sampler = _open_gpu(options, process.pid)
            result = Watchdog(process, options.kill_at, options.watch_interval_s, on_reading, told.size).wait()
        gpu_peaks: dict[str, int] = {}
        if gpu_sampler is not None and gpu is not None:
            gpu_sampler.stop()
            gpu_peaks = {source.name: source.peak() for source in gpu_sampler.sources}
            gpu.close()
        agent = summary.AgentView.read(readings)
        try:
            outcome = summarise(target, options, result, process.pid, passed.names, limit, agent, gpu_peaks, started,
                                gpu_environment)
            lines = outcome.lines()
        except Exception as error:  # the figures were cut short in a way not foreseen: the exit code stands
            code = summary.shell_exit_code(result.returncode)
            print(f"tfmem run: {' '.join(target.label)}: exit code {code}; no summary: the readings could not be read "
                  f"({error!r})", file=sys.stderr)
            return code
    print("\n".join(lines), file=sys.stderr)
    if journaling:
        journal.finish(outcome)
    if options.report is not None:
        summary.RUN_REPORT.write(options.report, outcome.to_dict())
    if options.plot is not None:
        from pytest_tfmem.run.plot import plot_run

        plot_run(outcome, options.plot)
    return outcome.exit_code


def summarise(target: Target, options: RunOptions, result: WatchResult, pid: int, passed: list[str],
              limit: system.MemoryLimit, agent: summary.AgentView, gpu_peaks: dict[str, int],
              started: float, gpu_environment: list[str]) -> summary.RunSummary:
    marks = dict(result.high_water_marks)
    if agent.high_water_mark is not None:  # read by the script's process itself as it exited: exact
        marks[pid] = max(marks.get(pid, 0), agent.high_water_mark)
    peak = sum(marks.values()) or result.peak_rss
    peak_at = max(result.timeline, key=lambda reading: reading[1])[0] if result.timeline else 0.0
    place_at_peak = agent.place_at(started + peak_at) if agent.readings else None
    device_peaks = agent.device_peaks()
    runtimes = agent.runtimes()
    host_share = max(0, marks.get(pid, 0) - summary.host_view_total(device_peaks)) if runtimes else None
    gpu_views = {view: value for view, value in device_peaks.items() if frameworks.is_gpu_view(view)}
    verdicts = summary.budget_verdicts(peak, options.budget, {**gpu_peaks, **gpu_views}, options.gpu_budget)
    death = summary.explain_death(result, pid, passed[-1] if passed else None, limit, agent)
    exit_code = summary.shell_exit_code(result.returncode)
    if exit_code == 0 and verdicts:
        exit_code = EXIT_OVER_BUDGET
    before_runtime = agent.rss_when_started()
    host_data = None if host_share is None or before_runtime is None else max(0, host_share - before_runtime)
    advice = summary.advise(peak, host_data, device_peaks, agent.place_at_device_peak(), runtimes)
    # the script's own figure: what the imports done by its peak kept is theirs, as in a test's figure
    imports = agent.imports_by(started + peak_at)
    own_peak = None
    if agent.pid is not None:
        own_peak = max(0, marks.get(pid, 0) - agent.start_rss - sum(kept for _, kept in imports))
    return summary.RunSummary(
        command=target.label, kind=target.kind, returncode=result.returncode, exit_code=exit_code,
        duration_s=result.elapsed_s, peak=peak, high_water_marks=marks, script_pid=pid,
        sampled_peak=result.peak_rss, interval_s=options.watch_interval_s, device_peaks=device_peaks,
        host_share=host_share,
        gpu_peaks=gpu_peaks, budget=options.budget, kill_at=options.kill_at, gpu_budget=options.gpu_budget,
        verdicts=tuple(verdicts), death=death, place_at_peak=place_at_peak, advice=tuple(advice),
        runtimes=tuple(runtimes), gpu_environment=tuple(gpu_environment),
        own_peak=own_peak, first_imports=tuple(imports),
        timeline=result.timeline, device_timeline=agent.device_timeline(started),
    )
