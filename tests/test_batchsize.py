"""find_max_batch_size: bounded bisection, one process per trial, clear errors.

The step functions allocate exactly ``batch_size`` MiB, so the true limit of a budget is known.
They live at module level because the trials' server unpickles its step in a fresh interpreter.
"""

from __future__ import annotations

import math
import os
import signal

import mapped_step
import numpy as np
import pytest

from pytest_tfmem import BatchSizeReport, Monitor, find_max_batch_size, platforms

MiB = 2**20
_pool: list[np.ndarray] = []
_held: list[np.ndarray] = []


def one_mib_per_sample(batch_size: int) -> None:
    block = np.ones(batch_size * MiB, dtype=np.uint8)  # every page touched
    del block


def pooled_one_mib_per_sample(batch_size: int) -> None:
    """Like TensorFlow's allocator: keeps its largest buffer and reuses it for smaller requests."""
    need = batch_size * MiB
    if not _pool or _pool[0].size < need:
        _pool[:] = [np.ones(need, dtype=np.uint8)]
    else:
        _pool[0][:need] = 2


def hold_50_mib() -> None:
    _held.append(np.ones(50 * MiB, dtype=np.uint8))


def memory_error_above_20(batch_size: int) -> None:
    if batch_size > 20:
        raise MemoryError(f"cannot allocate {batch_size} MiB")
    one_mib_per_sample(batch_size)


def killed_above_10(batch_size: int) -> None:
    if batch_size > 10:
        os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
    one_mib_per_sample(batch_size)


def broken_step(batch_size: int) -> None:
    raise KeyError("no such layer")


def assert_trial_peaks_are_exact(report: BatchSizeReport) -> None:
    """Every trial that ran to the end measured its own batch (within the heap's slack), whatever ran before."""
    for trial in report.trials:
        if trial.measurement is not None:
            assert abs(trial.peak - trial.batch_size * MiB) <= MiB, (trial, str(report))


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
@pytest.mark.parametrize(
    ("budget_mib", "low", "high", "resolution"),
    [(37.5, 1, 128, 1), (150.5, 4, 512, 4)],
)
def test_finds_the_known_limit_within_one_step_in_at_most_log2_range_plus_2_trials(budget_mib, low, high, resolution):
    report = find_max_batch_size(one_mib_per_sample, budget_mib * MiB, low=low, high=high, resolution=resolution)

    true_limit = math.floor(budget_mib)  # 1 MiB per sample, well under 0.5 MiB of overhead
    assert report.batch_size is not None
    assert abs(report.batch_size - true_limit) <= resolution, str(report)
    assert len(report.trials) <= math.log2((high - low) / resolution) + 2, str(report)
    assert all(trial.fits == (trial.peak <= report.budget) for trial in report.trials)
    assert_trial_peaks_are_exact(report)
    text = str(report)
    assert f"largest batch that fits: {report.batch_size}" in text
    assert all(f"  {trial.batch_size}  " in text for trial in report.trials)


def test_trials_are_isolated_so_a_pooling_allocator_cannot_distort_later_trials():
    # In one process, a pool left by a larger run hides the next run's memory need entirely.
    with Monitor() as first:
        pooled_one_mib_per_sample(64)
    with Monitor() as second:
        pooled_one_mib_per_sample(48)
    _pool.clear()
    assert first.measurement.peak >= 64 * MiB
    assert second.measurement.peak < 2 * MiB

    report = find_max_batch_size(pooled_one_mib_per_sample, 37.5 * MiB, low=1, high=128)
    assert abs(report.batch_size - 37) <= 1, str(report)
    assert_trial_peaks_are_exact(report)


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_setup_runs_in_each_trial_outside_the_measurement():
    report = find_max_batch_size(one_mib_per_sample, 20.5 * MiB, low=1, high=32, setup=hold_50_mib)
    assert abs(report.batch_size - 20) <= 1, str(report)
    assert_trial_peaks_are_exact(report)


def test_an_out_of_memory_error_means_the_batch_does_not_fit():
    report = find_max_batch_size(memory_error_above_20, "1GB", low=1, high=64)
    assert report.batch_size == 20, str(report)
    failed = [trial for trial in report.trials if not trial.fits]
    assert failed and all(trial.outcome == f"out of memory: MemoryError: cannot allocate {trial.batch_size} MiB"
                          for trial in failed)


def test_a_trial_killed_by_the_kernel_is_named_and_does_not_fit():
    report = find_max_batch_size(killed_above_10, "1GB", low=1, high=32)
    assert report.batch_size == 10, str(report)
    assert any(trial.outcome == "died: trial process killed by SIGKILL (out of memory?)" for trial in report.trials)


def test_where_the_trial_server_cannot_fork_each_trial_is_a_fresh_interpreter():
    """The server says why it will not fork (here the portable platform, as on Windows): each trial
    is spawned, and the search finds what the forked trials find."""
    before = platforms.select("portable")  # this process and the processes it starts
    try:
        report = find_max_batch_size(memory_error_above_20, "1GB", low=16, high=24)
    finally:
        platforms.restore(before)
    assert report.processes == (
        "a fresh interpreter each (the portable platform starts every process by spawning a fresh interpreter)"
    ), str(report)
    assert report.batch_size == 20, str(report)
    assert {trial.batch_size: trial.fits for trial in report.trials}[21] is False, str(report)


def test_a_step_failing_for_another_reason_is_an_error_not_a_limit():
    with pytest.raises(RuntimeError, match=r"step\(\d+\) raised KeyError: 'no such layer'(.|\n)*broken_step"):
        find_max_batch_size(broken_step, "1GB", low=1, high=8)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"budget": "12 parsecs"}, "invalid find_max_batch_size budget '12 parsecs'"),
        ({"budget": -1}, "invalid find_max_batch_size budget -1"),
        ({"budget": 0}, "invalid find_max_batch_size budget 0: expected a size above 0"),
        ({"low": 0}, "invalid find_max_batch_size low 0: expected a whole number >= 1"),
        ({"low": 2.5}, "invalid find_max_batch_size low 2.5"),
        ({"resolution": True}, "invalid find_max_batch_size resolution True"),
        ({"low": 64, "high": 32}, r"invalid find_max_batch_size high 32: expected a whole number >= low \(64\)"),
        ({"step": "train"}, "invalid find_max_batch_size step 'train': expected a callable"),
        ({"step": lambda batch_size: None}, "invalid find_max_batch_size step <function .*must be picklable"),
        ({"setup": lambda: None}, "invalid find_max_batch_size setup <function .*must be picklable"),
    ],
)
def test_bad_arguments_are_named(arguments, message):
    call = {"step": one_mib_per_sample, "budget": "1GB", **arguments}
    with pytest.raises(ValueError, match=message):
        find_max_batch_size(call.pop("step"), call.pop("budget"), **call)


@pytest.mark.linux  # forks, and the kernel's marks
def test_a_trials_fork_counts_in_the_tests_tree_only_what_it_grew_above_the_trial_server(tmp_path, monkeypatch):
    """The server imported the step's module, which mapped 128 MiB of a file; each fork maps those
    pages again before its trial. The test's tree counts the server once, and of the fork only its
    40 MiB batch (and a little more of its own), not the pages it shares with the server."""
    mapped = tmp_path / "mapped"
    mapped.write_bytes(b"\1" * (128 * MiB))
    monkeypatch.setenv("MAPPED_STEP_FILE", str(mapped))
    with Monitor() as watched:
        report = find_max_batch_size(mapped_step.one_mib_per_sample, "1GB", low=40, high=40)
    assert report.processes == "forks of one interpreter that imported the step's modules", str(report)
    assert report.batch_size == 40 and abs(report.trials[0].peak - 40 * MiB) <= MiB, str(report)
    processes = watched.measurement.children.processes
    servers = [figure for figure in processes if figure.command.startswith("python") and "spawn_main" in figure.command]
    forks = [figure for figure in processes if figure.command.startswith("fork of")]
    assert len(servers) == 1 and servers[0].peak >= 128 * MiB, processes  # the mapped file's pages, counted once
    # a fork's figure is sampled (the server reaps it): at most its 40 MiB and a little of its own;
    # counted from its size as it was first read, it would be the 128 MiB of the file and more
    assert forks and all(fork.peak < 64 * MiB for fork in forks), processes
