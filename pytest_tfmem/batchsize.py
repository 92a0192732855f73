"""``find_max_batch_size``: the largest batch whose training step fits a memory budget.

Each trial runs the step once, at one batch size, in a process of its own that starts as a
fresh interpreter would (a fork of one spawned interpreter that imported the step's modules, or
a spawned interpreter: ``batch_trials``), measured there by ``Monitor``. A process per trial
means an earlier trial's pooled allocator memory, traced functions or leaks cannot lower or
raise a later trial's figure. The search is a bisection over the candidate batch
sizes ``low, low + resolution, ..., <= high``: at most ``ceil(log2(candidates + 1))``
trials, and the answer is the largest candidate that fitted. While a trial runs, the parent's
watchdog (``probes.watchdog``) reads the trial's process tree and stops it as soon as its RSS
increase passes the budget, so a trial far above the limit costs neither the time to finish
nor the memory it was heading for.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from pytest_tfmem import platforms
from pytest_tfmem.batch_trials import TrialServer
from pytest_tfmem.core.measure import Measurement
from pytest_tfmem.probes.watchdog import Watchdog
from pytest_tfmem.units import format_size, parse_size

_WATCH_INTERVAL_S = 0.005


@dataclass(frozen=True)
class BatchTrial:
    """One trial: a batch size, whether it fitted, and the peak memory need measured."""

    batch_size: int
    fits: bool
    peak: int  # bytes; a lower bound when the trial was stopped or died
    outcome: str  # "fits", "over budget", "stopped: ...", "out of memory: ...", "died: ..."
    measurement: Measurement | None = None


@dataclass(frozen=True)
class BatchSizeReport:
    """The search's answer and every trial, in the order they ran."""

    batch_size: int | None  # the largest candidate that fitted; None if even ``low`` did not
    budget: int
    low: int
    high: int
    resolution: int
    trials: tuple[BatchTrial, ...]
    processes: str  # where the trials ran (``batch_trials``)

    def __str__(self) -> str:
        found = "no batch size fits" if self.batch_size is None else f"largest batch that fits: {self.batch_size}"
        lines = [
            (
                f"{found} (budget {format_size(self.budget)}, searched {self.low}..{self.high} "
                f"in steps of {self.resolution}, {len(self.trials)} trials)"
            ),
            f"trials: {self.processes}",
            f"{'trial':>5}  {'batch':>7}  {'peak':>11}  outcome",
        ]
        for number, trial in enumerate(self.trials, 1):
            lines.append(f"{number:>5}  {trial.batch_size:>7}  {format_size(trial.peak):>11}  {trial.outcome}")
        return "\n".join(lines)


def find_max_batch_size(
    step: Callable[[int], object],
    budget: int | str,
    *,
    low: int = 1,
    high: int = 1024,
    resolution: int = 1,
    setup: Callable[[], object] | None = None,
) -> BatchSizeReport:
    """Find the largest batch size in ``[low, high]`` whose ``step(batch_size)`` fits ``budget``.

    ``step`` runs one training step at the given batch size; ``setup`` (optional, no
    arguments) runs first in the same trial process, outside the measurement: imports, data
    loading, anything whose memory should not count. Both must be picklable (module-level
    functions, or ``functools.partial`` of one), since the trials run in other processes.
    A trial fits when its measured peak memory need is at most ``budget``; a trial raising an
    out-of-memory error (``MemoryError``, TensorFlow's ``ResourceExhaustedError``) does not
    fit; any other exception is re-raised as ``RuntimeError`` with the trial's traceback.
    The answer is within ``resolution`` of the true limit when memory grows with batch size.
    """
    budget_bytes = _check_arguments(step, budget, low, high, resolution, setup)
    candidates = (high - low) // resolution + 1
    trials: list[BatchTrial] = []
    best: int | None = None
    first, last = 0, candidates - 1  # candidate indices still undecided
    server = TrialServer(step, setup)
    try:
        while first <= last:
            middle = (first + last) // 2
            trial = _run_trial(server, low + middle * resolution, budget_bytes)
            trials.append(trial)
            if trial.fits:
                best = middle
                first = middle + 1
            else:
                last = middle - 1
    finally:
        server.close()
    batch_size = None if best is None else low + best * resolution
    return BatchSizeReport(batch_size, budget_bytes, low, high, resolution, tuple(trials), server.processes)


def _is_whole_number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_arguments(
    step: object, budget: object, low: object, high: object, resolution: object, setup: object
) -> int:
    budget_bytes = parse_size(budget, what="find_max_batch_size budget")
    if budget_bytes <= 0:
        raise ValueError(f"invalid find_max_batch_size budget {budget!r}: expected a size above 0, e.g. '2GB'")
    for name, value in (("low", low), ("resolution", resolution)):
        if not _is_whole_number(value) or value < 1:  # type: ignore[operator]
            raise ValueError(f"invalid find_max_batch_size {name} {value!r}: expected a whole number >= 1")
    if not _is_whole_number(high) or high < low:  # type: ignore[operator]
        raise ValueError(f"invalid find_max_batch_size high {high!r}: expected a whole number >= low ({low})")
    for name, function in (("step", step), ("setup", setup)):
        if function is None and name == "setup":
            continue
        if not callable(function):
            raise ValueError(f"invalid find_max_batch_size {name} {function!r}: expected a callable")
        try:
            pickle.dumps(function)
        except Exception as error:  # pickle raises PicklingError, AttributeError or TypeError
            raise ValueError(
                f"invalid find_max_batch_size {name} {function!r}: each trial runs in a fresh process, so "
                f"{name} must be picklable (a module-level function, or functools.partial of one): {error}"
            ) from None
    return budget_bytes


def _run_trial(server: TrialServer, batch_size: int, budget: int) -> BatchTrial:
    process, receiver = server.start(batch_size)
    try:
        return _watch(process, receiver, batch_size, budget)
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        receiver.close()


@dataclass(frozen=True)
class _TrialProcess:
    """A trial's ``multiprocessing.Process`` as the watchdog sees a child process."""

    process: Any

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def wait(self) -> int:
        self.process.join()
        return int(self.process.exitcode)


def _watch(process: Any, receiver: Connection, batch_size: int, budget: int) -> BatchTrial:
    """Wait for the trial's result; the watchdog stops it once its RSS increase passes the budget
    (its limit is set when the trial says its RSS at the start of the step)."""
    watchdog = Watchdog(_TrialProcess(process), None, _WATCH_INTERVAL_S).start()
    try:
        return _wait_for_result(process, watchdog, receiver, batch_size, budget)
    finally:
        watchdog.stop()


def _wait_for_result(process: Any, watchdog: Watchdog, receiver: Connection, batch_size: int,
                     budget: int) -> BatchTrial:
    start_rss: int | None = None
    while True:
        seen = 0 if start_rss is None else max(0, watchdog.peak_rss - start_rss)
        if watchdog.killed_at_limit:
            process.join()
            return BatchTrial(batch_size, False, seen,
                              f"stopped: RSS grew {format_size(seen)} > budget {format_size(budget)}")
        if receiver.poll(_WATCH_INTERVAL_S):
            try:
                message = receiver.recv()
            except EOFError:  # the process ended without sending its result
                if watchdog.killed_at_limit:
                    continue
                return _died(process, batch_size, seen)
            if message[0] == "started":
                start_rss = message[1]
                watchdog.kill_at = start_rss + budget + 1  # stopped once the increase passes the budget
                continue
            return _trial_from_message(message, batch_size, budget)
        if not process.is_alive():
            if receiver.poll() or watchdog.killed_at_limit:
                continue
            return _died(process, batch_size, seen)


def _died(process: Any, batch_size: int, seen: int) -> BatchTrial:
    """A trial killed by a signal (the OOM killer sends SIGKILL) did not fit; any other end is an error."""
    process.join()
    code = process.exitcode
    platform = platforms.current()
    ending = None if code is None else platform.ending(code)
    if ending is None or (ending.signal is None and code != platform.killed_returncode):
        raise RuntimeError(
            f"find_max_batch_size: the trial process for batch size {batch_size} exited with code {code} "
            "without a result (could step be imported there? see its output above)"
        )
    cause = f"killed by {ending.signal}" if ending.signal is not None else ending.description
    if ending.signal == "SIGKILL" or code == platform.killed_returncode:
        cause += " (out of memory?)"
    return BatchTrial(batch_size, False, seen, f"died: trial process {cause}")


def _trial_from_message(message: tuple[Any, ...], batch_size: int, budget: int) -> BatchTrial:
    if message[0] == "setup failed":
        raise RuntimeError(f"find_max_batch_size: setup failed in the trial process for batch size {batch_size}:\n"
                           f"{message[1]}")
    measurement = Measurement.from_dict(message[1])
    if message[0] == "done":
        fits = measurement.peak <= budget
        return BatchTrial(batch_size, fits, measurement.peak, "fits" if fits else "over budget", measurement)
    _, _, out_of_memory, summary, trace = message
    if not out_of_memory:
        raise RuntimeError(f"find_max_batch_size: step({batch_size}) raised {summary} in its trial process:\n{trace}")
    return BatchTrial(batch_size, False, measurement.peak, f"out of memory: {summary}", measurement)
