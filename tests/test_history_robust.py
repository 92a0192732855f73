"""A memory history survives what users do to it: a bad line costs only itself (in ``tfmem
history``, the page, ``tfmem merge`` and the gate), the gate never breaks a session, and a test
that failed a memory check is recorded at the very commit that regressed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import forked_sessions
import pytest

from pytest_tfmem.cli.main import main
from pytest_tfmem.gates import history
from pytest_tfmem.gates.history_plugin import MIN_STEP
from pytest_tfmem.gates.steps import creep, gate, steps
from pytest_tfmem.units import parse_tolerance

pytestmark = pytest.mark.any_os  # no TensorFlow, any system (.github/workflows/tests.yml)

MIB = 2**20
COMMITS = 12
STEP_AT = 7
ENVIRONMENT = {"python": "3.11", "platform": "Linux x86_64", "memory": "RSS"}


def good_lines() -> list[str]:
    """Twelve commits of two tests: one flat, one that steps up by half at ``STEP_AT``."""
    lines = []
    for number in range(COMMITS):
        commit = history.Commit(f"{number + 1:x}" * 40, f"{number:x}" * 40 if number else None, "main",
                                f"2026-12-01T00:{number:02d}:00+00:00", False)
        figures = {"t.py::test_flat": (40 * MIB + number * 1024, MIB, {}),
                   "t.py::test_step": (40 * MIB if number < STEP_AT else 60 * MIB, MIB, {})}
        lines.append(history.session_entry(commit, ENVIRONMENT, f"session-{number}", figures).to_line())
    return lines


BAD_LINES = {  # kind: (the line, what its name in the warning says)
    "cut short": ('{"format":"pytest-tfmem-history","version":1,"commit":"dead', "(cut short: the session"),
    "not JSON": ("<<<<<<< HEAD\n", "not valid JSON"),
    "another format": ('{"format": "something-else", "version": 1}\n', "not a pytest-tfmem history line"),
    "newer version": ('{"format": "pytest-tfmem-history", "version": 3, "commit": "f"}\n',
                      "written in history format version 3 by a newer pytest-tfmem"),
    "field missing": ('{"format": "pytest-tfmem-history", "version": 1, "commit": "f", "sessions": ["s"]}\n',
                      "a field is missing or of the wrong type"),
    "field wrong": ('{"format": "pytest-tfmem-history", "version": 1, "commit": "f", "sessions": ["s"], '
                    '"environment": {}, "tests": {"t.py::test_x": [[0, "big", null]]}}\n',
                    "a field is missing or of the wrong type"),
    "mark wrong": ('{"format": "pytest-tfmem-history", "version": 1, "commit": "f", "sessions": ["s"], '
                   '"environment": {}, "tests": {"t.py::test_x": [[0, 1, null]]}, "unconfirmed": {"t.py::test_x": "why"}}\n',
                   '"unconfirmed" is not {node id: [[session, why], ...]}'),
}
WHERE = {"start": 0, "middle": 6, "end": COMMITS}
CUT_LINE = '{"format":"pytest-tfmem-history","vers'  # what a session killed while it appended leaves


def tfmem(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", *args], cwd=folder, capture_output=True,
                          text=True, timeout=120)


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``tfmem ARGS`` run in this process (the command's own ``main``): exit code, output, errors."""
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("kind", BAD_LINES)
def test_a_bad_line_costs_only_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, where: str):
    lines = good_lines()
    clean = tmp_path / "clean.jsonl"
    clean.write_text("".join(lines))
    bad, named = BAD_LINES[kind]
    if kind == "cut short" and where != "end":
        bad += "\n"  # the next writer starts on a new line (history.append_entry)
    lines.insert(WHERE[where], bad)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("".join(lines))
    before = damaged.read_bytes()

    code, out, err = in_process(capsys, "history", str(damaged))
    assert code == 0, err
    assert out.replace("damaged", "clean") == in_process(capsys, "history", str(clean))[1]  # as if it were absent
    assert f"step +20.0 MiB (+50.0%) at {STEP_AT + 1}{STEP_AT + 1}{STEP_AT + 1}" in out
    (warning,) = err.splitlines()  # named once, with its file and line
    assert warning.startswith(f"tfmem: warning: line skipped: {damaged}:{WHERE[where] + 1}: ") and named in warning

    code, _, err = in_process(capsys, "history", str(damaged), "--html", str(tmp_path / "page.html"))
    assert code == 0 and "page.html: 2 chart(s)" in err
    code, out, _ = in_process(capsys, "merge", "-o", str(tmp_path / "merged.jsonl"), str(damaged))
    assert code == 0 and "1 line(s) that could not be read left out" in out
    assert history.read_history(tmp_path / "merged.jsonl") == history.read_history(clean)  # only good entries
    assert damaged.read_bytes() == before  # no reader rewrites the file


def test_a_history_with_no_good_line_or_no_file_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "bad.jsonl").write_text("".join(line for line, _ in BAD_LINES.values()) + "\n")
    code, _, err = in_process(capsys, "history", str(tmp_path / "bad.jsonl"))
    assert code == 2 and "holds no entry this pytest-tfmem can read: every line was skipped" in err
    code, _, err = in_process(capsys, "history", str(tmp_path / "none.jsonl"))
    assert code == 2 and "no such file (record one with pytest --tfmem-history=PATH)" in err


class Repository:
    """A git checkout of one test module whose tests hold NumPy buffers of given sizes."""

    MODULE = """
import numpy as np
import pytest

def hold(mib):
    block = np.ones(int(mib * 2**20), dtype=np.uint8)
    return int(block[::4096].sum())

def test_steady():
    hold(20)

def test_grows():
    hold({grows})

@pytest.mark.tfmem(budget="{budget}")
def test_budgeted():
    hold({budgeted})

def test_breaks():
    hold(20)
    raise ValueError("an ordinary failure: the run is cut short")
"""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.git("init", "-q")
        self.git("config", "user.email", "t@example.com")
        self.git("config", "user.name", "t")
        self.commits = 0

    def git(self, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=self.folder, capture_output=True, text=True, check=True).stdout

    def commit(self, grows: float = 40, budgeted: float = 20, budget: str = "64MB") -> None:
        (self.folder / "test_module.py").write_text(self.MODULE.format(grows=grows, budgeted=budgeted, budget=budget))
        self.git("add", "test_module.py")
        self.git("commit", "-qm", f"commit {self.commits}", "--allow-empty")
        self.commits += 1

    def session(self, *args: str) -> subprocess.CompletedProcess[str]:
        return forked_sessions.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--tfmem-history=history.jsonl", *args],
            cwd=self.folder, timeout=300, framework=False,
        )


@pytest.fixture
def repository(tmp_path: Path) -> Repository:
    return Repository(tmp_path)


def samples(repository: Repository, nodeid: str) -> list[tuple[int, str]]:
    """(peak in MiB, the checks it failed) of ``nodeid`` at each commit, oldest first."""
    read = history.read_history(repository.folder / "history.jsonl")
    return [(round(sample[history.PEAK] / MIB), entry.failures(nodeid))
            for entry in read.entries for sample in entry.tests.get(nodeid, ())]


def test_a_test_that_failed_a_memory_check_is_recorded_and_one_cut_short_is_counted(repository: Repository):
    repository.commit()
    assert repository.session().returncode == 1  # test_breaks
    repository.commit(budgeted=80)  # over its 64MB budget now
    done = repository.session()
    assert done.returncode == 1
    assert re.search(r"FAILED test_module.py::test_budgeted - tfmem: peak (79|80)\.\d MiB > budget", done.stdout)
    assert (f"history: 3 test(s) of commit {repository.git('rev-parse', '--short=7', 'HEAD').strip()} (1 failing a "
            "tfmem check) added to ") in done.stdout
    assert "; 1 left out, their runs cut short (1 ValueError raised)" in done.stdout
    assert samples(repository, "test_module.py::test_budgeted") == [(20, ""), (80, "budget")]
    assert samples(repository, "test_module.py::test_breaks") == []
    page = repository.folder / "page.html"
    drawn = tfmem(repository.folder, "history", "history.jsonl", "--html", str(page))
    assert drawn.returncode == 0, drawn.stderr
    assert "failed: budget" in page.read_text()  # the failing point is marked


def test_the_gate_and_the_record_are_independent_and_a_test_meant_to_grow_fails_the_gate_once(
    repository: Repository,
):
    gate = ("--tfmem-history-gate=25%", "-k", "steady or grows")
    for _ in range(3):
        repository.commit(grows=40)
        assert repository.session(*gate).returncode == 0
    repository.commit(grows=80)  # meant to grow
    grew = repository.session(*gate)
    assert grew.returncode == 1 and re.search(r"FAILED test_module.py::test_grows - tfmem: peak (79|80)\.", grew.stdout)
    assert samples(repository, "test_module.py::test_grows")[-1] == (80, "history")  # recorded all the same
    repository.commit(grows=80)  # the next commit: 80 MiB is its level now
    assert repository.session(*gate).returncode == 0
    # and the step is found through the commit that failed
    steps = tfmem(repository.folder, "history", "history.jsonl", "--test", "*test_grows")
    assert re.search(r"step \+\d+\.\d MiB \(\+\d+\.\d%\) at \w{7}: (39|40)\.\d MiB -> (79|80)\.\d MiB", steps.stdout), steps.stdout


def test_a_gate_failure_says_whether_the_floor_or_the_series_noise_set_its_limit(repository: Repository):
    repository.commit(grows=40)
    assert repository.session("-k", "steady or grows").returncode == 0
    path = repository.folder / "history.jsonl"
    (recorded,) = history.read_history(path).entries
    for number, peaks in enumerate(((40, 40, 56), (40,))):  # a later commit measured three times: its spread
        commit = history.Commit(f"{number + 1:x}" * 40, None, "main", f"2026-12-01T00:0{number}:00+00:00", False)
        for index, peak in enumerate(peaks):
            history.append_entry(path, history.session_entry(
                commit, recorded.environment, f"noisy-{number}-{index}",
                {"test_module.py::test_grows": (peak * MIB, None, {})}))
    repository.commit(grows=80)
    done = repository.session("-k", "grows", "--tfmem-history-gate=25%")
    assert done.returncode == 1, done.stdout
    # the samples 40, 40 and 56 MiB: a spread of 8 MiB, four times that allowed
    assert re.search(r"\(\+\d+\.\d%, > 25%, and at least 32\.0 MiB, 4 times the series' noise\)", done.stdout), done.stdout


def test_the_gate_never_breaks_a_session_whatever_the_history_holds(repository: Repository):
    repository.commit()
    for _ in range(3):
        assert repository.session("-k", "steady or grows").returncode == 0
    with open(repository.folder / "history.jsonl", "a") as stream:
        stream.write(CUT_LINE)  # a session killed while it appended
    repository.commit(grows=80)
    done = repository.session("-k", "steady or grows", "--tfmem-history-gate=25%")
    assert "Traceback" not in done.stdout + done.stderr and "INTERNALERROR" not in done.stdout
    assert done.stdout.count("line skipped: ") == 1 and "history.jsonl:4: not valid JSON" in done.stdout
    assert re.search(r"FAILED test_module.py::test_grows - tfmem: peak (79|80)\.", done.stdout)  # the good lines
    assert "test_steady" not in done.stdout.split("short test summary")[-1]

    (repository.folder / "history.jsonl").write_text(CUT_LINE + "\n")  # nothing to gate against
    done = repository.session("-k", "steady or grows", "--tfmem-history-gate=25%")
    assert done.returncode == 0, done.stdout  # the outcomes they have without the gate
    assert done.stdout.count("history gate: not applied, no test held to the history: ") == 1
    assert "not its call phase" not in done.stdout and "not measured" not in done.stdout

    bad_value = repository.session("--tfmem-history-gate=25")
    assert bad_value.returncode == pytest.ExitCode.USAGE_ERROR
    assert "invalid --tfmem-history-gate value '25'" in bad_value.stderr


FLAT = Path(__file__).parent / "data" / "flat-history.jsonl"  # python -m benchmarks.flat_history --keep ...
FLAT_COMMITS = 10  # unchanged code; then the batch test grows by half in two more commits


def test_over_unchanged_code_shuffled_at_every_commit_nothing_moves_and_the_suggested_gate_passes():
    """Real figures: ten commits of small Keras tests and Keras's own, each in its own random order."""
    found = history.series(history.read_history(FLAT).entries)
    gate = parse_tolerance("25%")  # what docs/history.md suggests
    modules = {nodeid.split("::")[0] for nodeid in found}
    assert {"small_keras.py", "dense_test.py", "early_stopping_test.py", "test_batch.py"} <= modules
    assert len(found) > 200
    for nodeid, (one,) in found.items():
        flat = one.points[:FLAT_COMMITS]
        assert steps(flat, MIN_STEP) == [], nodeid
        crept = creep(flat)
        assert crept is not None and not crept.notable(MIN_STEP), (nodeid, crept.describe())
        for commit in range(2, FLAT_COMMITS + 1):
            assert not gated(flat[:commit], gate), (nodeid, commit)


def test_the_floor_is_what_keeps_the_suggested_gate_quiet_over_unchanged_code():
    """The same history under the floor before (``5%+4MB``): unchanged tests fail the gate."""
    found = history.series(history.read_history(FLAT).entries)
    gate, old_floor = parse_tolerance("25%"), parse_tolerance("5%+4MB")
    failing = {(nodeid, commit) for nodeid, (one,) in found.items() if nodeid != "test_batch.py::test_batch"
               for commit in range(2, len(one.points) + 1) if gated(one.points[:commit], gate, old_floor)}
    assert failing
    assert not any(gated(found[nodeid][0].points[:commit], gate) for nodeid, commit in failing)  # the floor now


def test_a_real_step_in_one_test_is_named_at_its_commit_and_fails_the_gate_once():
    (batch,) = history.series(history.read_history(FLAT).entries)["test_batch.py::test_batch"]
    (step,) = steps(batch.points, MIN_STEP)
    assert step.commit == batch.points[FLAT_COMMITS].commit and 0.45 < (step.change_share or 0) < 0.55
    gate = parse_tolerance("25%")
    assert gated(batch.points[: FLAT_COMMITS + 1], gate)  # the commit that grew it
    assert not gated(batch.points[: FLAT_COMMITS + 2], gate)  # the next: its level now


def gated(points: list, tolerance, min_step=MIN_STEP) -> bool:
    """The history gate's verdict on the last point."""
    found = gate(points, tolerance, min_step)
    return found is not None and found[0].change > found[1]
