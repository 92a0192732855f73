"""The memory history: steps and creep on synthetic series first, then real pytest sessions in a
real git repository over many commits (a step at a known commit, a slow ramp, a blip that reverts,
a flat run with noise), merging, the gate, the Markdown, and the page in a headless browser."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import forked_sessions
import pytest

from pytest_tfmem.gates import history
from pytest_tfmem.gates.history_page import sparkline
from pytest_tfmem.gates.steps import Point, creep, creep_since_last_step, steps
from pytest_tfmem.units import parse_tolerance

REPOSITORY = Path(__file__).resolve().parent.parent
if str(REPOSITORY) not in sys.path:  # scripts/ sits beside the package, it is not installed
    sys.path.insert(0, str(REPOSITORY))

from scripts.history_demo import COMMITS, STEP_AT, suite_at  # noqa: E402

pytestmark = pytest.mark.any_os  # no TensorFlow, any system (.github/workflows/tests.yml)

MIB = 2**20
MIN_STEP = parse_tolerance("5%+1MB")


def points(values: list[float], gap_before: int | None = None) -> list[Point]:
    """A series of one sample per commit ``c000``, ``c001``...; ``gap_before``: the commits
    before that point were not measured (its parent is another commit)."""
    return [
        Point(f"c{i:03d}", "unmeasured" if i == gap_before else (f"c{i - 1:03d}" if i else None), (int(value),))
        for i, value in enumerate(values)
    ]


def test_a_step_is_named_by_its_first_commit_with_the_levels_around_it():
    found = steps(points([200 * MIB] * 8 + [320 * MIB] * 8), MIN_STEP)
    assert [(step.commit, step.before, step.after) for step in found] == [("c008", 200 * MIB, 320 * MIB)]
    assert found[0].describe() == "+120.0 MiB (+60.0%) at c008: 200.0 MiB -> 320.0 MiB"
    assert found[0].bisect_advice("t.py::test_x") is None  # its parent was measured: nothing to bisect


def test_a_step_across_unmeasured_commits_is_a_range_with_bisect_advice():
    found = steps(points([200 * MIB] * 8 + [320 * MIB] * 8, gap_before=8), MIN_STEP)
    assert (found[0].since, found[0].commit) == ("c007", "c008")
    assert found[0].describe().startswith("+120.0 MiB (+60.0%) at c007..c008:")
    assert found[0].bisect_advice("t.py::test_x") == (
        "git bisect start c008 c007 && git bisect run pytest -q -p no:cacheprovider t.py::test_x --tfmem-budget=260.0MiB"
    )


def test_a_blip_that_reverts_and_noise_within_the_spread_are_no_steps():
    rng = random.Random(7)
    assert steps(points([200 * MIB] * 8 + [400 * MIB] + [200 * MIB] * 8), MIN_STEP) == []
    noisy = [200 * MIB * (1 + rng.uniform(-0.02, 0.02)) for _ in range(40)]
    assert steps(points(noisy), MIN_STEP) == []
    # a step under the same noise is found, at its commit
    stepped = noisy[:20] + [value * 1.3 for value in noisy[20:]]
    assert [step.commit for step in steps(points(stepped), MIN_STEP)] == ["c020"]


def test_a_slow_ramp_is_creep_not_steps():
    ramp = [200 * MIB * 1.035**i for i in range(15)]
    assert steps(points(ramp), MIN_STEP) == []
    found = creep(points(ramp))
    # levels of three commits each: the first three's middle reading against the last three's
    assert found is not None and (found.best_commit, found.latest_commit, found.commits) == ("c001", "c013", 12)
    assert found.describe() == (
        "+51.1% over 12 commits (207.0 MiB at c001 -> 312.8 MiB at c013), no single rise above 3.5% (at c002)"
    )


def test_one_reading_neither_sets_a_level_nor_makes_a_step():
    """The series a ResNet test read over seven unchanged commits, then a cold 89.0 MiB (its re-run
    66.6): the best level is 56.2 MiB, not the one 49.4 MiB reading, and the re-run passes 25%."""
    resnet = [57.2, 56.2, 56.2, 56.2, 56.2, 49.4]
    found = creep(points([value * MIB for value in [*resnet, 89.0]]), reading_now=True)
    assert found is not None and found.best == int(56.2 * MIB) and found.best_readings == 3
    rerun = creep(points([value * MIB for value in [*resnet, 66.6]]), reading_now=True)
    assert rerun is not None and not rerun.notable(parse_tolerance("25%"))
    # one low (or high) reading among a level is no step, in either direction
    for odd in (30.0, 90.0):
        assert steps(points([value * MIB for value in [56.0] * 5 + [odd] + [56.0] * 5]), MIN_STEP) == []
    # nor is a test's lone first reading, cold, that every later one leaves: 69.5 MiB, then 14-19
    cold_first = [69.5, 15.2, 18.9, 14.1, 16.0, 17.3, 14.8, 15.5]
    assert steps(points([value * MIB for value in cold_first]), MIN_STEP) == []
    # where the old level rests on two readings or more, a falling figure is a step, named at its commit
    improved = [69.5, 70.1, 69.8, 15.2, 18.9, 14.1, 16.0]
    assert [step.commit for step in steps(points([value * MIB for value in improved]), MIN_STEP)] == ["c003"]
    # two readings make a level only where both read it: the higher of the two
    two = creep(points([60 * MIB, 40 * MIB, 70 * MIB]), reading_now=True)
    assert two is not None and two.best == 60 * MIB and two.best_readings == 2
    assert creep(points([40 * MIB, 70 * MIB]), reading_now=True) is None  # one reading: no level to hold it to


def test_the_noise_of_a_commit_measured_twice_sets_the_threshold():
    wide = [Point(f"c{i:03d}", None, (int(200 * MIB), int(230 * MIB))) for i in range(6)]
    wide += [Point(f"c{i:03d}", None, (int(236 * MIB), int(266 * MIB))) for i in range(6, 12)]
    assert steps(wide, MIN_STEP) == []  # +36 MiB against samples 30 MiB apart: noise
    tight = [Point(p.commit, None, (p.samples[0], p.samples[0] + MIB)) for p in wide]
    assert [step.commit for step in steps(tight, MIN_STEP)] == ["c006"]


def test_a_sparkline_runs_from_the_lowest_to_the_highest():
    assert sparkline([1, 1, 2, 8]) == "▁▁▂█"
    assert sparkline([5, 5]) == "▁▁"


# Real sessions in a real repository: the suite and its commits are those docs/history.md's demo records


class Repository:
    """A git repository whose every commit changes what the suite's tests allocate."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.commits: list[str] = []
        self.git("init", "-q")
        self.git("config", "user.email", "ci@example.com")
        self.git("config", "user.name", "CI")

    def git(self, *args: str) -> str:
        done = subprocess.run(["git", *args], cwd=self.folder, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    def commit(self, number: int, rng: random.Random) -> str:
        (self.folder / "test_suite.py").write_text(suite_at(number, rng))
        self.git("add", "test_suite.py")
        self.git("commit", "-qm", f"commit {number}")
        self.commits.append(self.git("rev-parse", "HEAD"))
        return self.commits[-1]

    def session(self, *args: str, history: str = "history.jsonl") -> subprocess.CompletedProcess[str]:
        return forked_sessions.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--tfmem-history={history}", *args],
            cwd=self.folder, timeout=300, framework=False,
        )


def tfmem(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", *args], cwd=folder, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Repository:
    """Twelve commits with a session each, except the one after the step, measured only by the
    next commit's session (a range); the commit before the step measured twice."""
    repository = Repository(tmp_path_factory.mktemp("repository"))
    rng = random.Random(3)
    for number in range(COMMITS):
        repository.commit(number, rng)
        if number == STEP_AT:
            continue  # not measured: the step is seen across STEP_AT - 1 .. STEP_AT + 1
        done = repository.session()
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"history: 4 test(s) of commit {repository.commits[-1][:7]} added to" in done.stdout
        if number == STEP_AT - 1:
            assert repository.session().returncode == 0  # the same commit again: a second sample
    return repository


def test_a_session_appends_one_line_keyed_by_its_commit_and_environment(repository: Repository):
    lines = (repository.folder / "history.jsonl").read_text().splitlines()
    assert len(lines) == COMMITS  # one session a commit, one commit skipped, one measured twice
    first = json.loads(lines[0])
    assert first["format"] == "pytest-tfmem-history" and first["version"] == 1
    assert (first["commit"], first["parent"], first["branch"]) == (repository.commits[0], None, repository.git(
        "rev-parse", "--abbrev-ref", "HEAD"))
    assert json.loads(lines[1])["parent"] == repository.commits[0]
    assert first["environment"]["memory"] == "RSS" and "python" in first["environment"]
    assert sorted(first["tests"]) == [f"test_suite.py::test_{name}" for name in ("blip", "flat", "ramp", "step")]
    session, peak, retained = first["tests"]["test_suite.py::test_step"][0]
    assert session == 0 and 39 * MIB < peak < 42 * MIB and retained is not None


def test_tfmem_history_names_the_step_its_range_and_the_creep_and_nothing_else(repository: Repository):
    done = tfmem(repository.folder, "history", "history.jsonl")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    step = out.split("test_suite.py::test_step\n", 1)[1].splitlines()[0]
    before, after = repository.commits[STEP_AT - 1][:7], repository.commits[STEP_AT + 1][:7]
    found = re.match(rf"    step \+(\d+\.\d) MiB \(\+(\d+\.\d)%\) at {before}\.\.{after}: (\S+) MiB -> (\S+) MiB$", step)
    assert found, step
    # Each figure is a 40 or 80 MiB NumPy array under the kernel's mark: it read up to 1 MiB off on
    # two 2-core machines (pages handed back before the window, the interpreter's own allocations),
    # so the step between two of them, 39.9 here and 40.9 on another machine, is within 1.5 MiB.
    assert float(found[1]) == pytest.approx(40, abs=1.5)
    assert float(found[3]) == pytest.approx(40, abs=1) and float(found[4]) == pytest.approx(80, abs=1)
    assert float(found[2]) == pytest.approx(100, abs=2)
    assert re.search(rf"      not measured between them; to find the commit: git bisect start {after} {before} && "
                     r"git bisect run pytest -q -p no:cacheprovider test_suite.py::test_step --tfmem-budget=(59|60)\.\dMiB",
                     out), out
    ramp = out.split("test_suite.py::test_ramp\n", 1)[1].splitlines()[0]
    # levels of three commits: the middle reading of commits 0-2 (commit 1) against that of the last
    # three (commit 10), eight measured commits apart (the step's commit was not measured)
    found = re.match(r"    since its best: \+(\d+\.\d)% over 8 commits \((\S+) MiB at ", ramp)
    assert found, ramp
    assert float(found[1]) == pytest.approx(100 * (1.04**9 - 1), abs=2)
    assert float(found[2]) == pytest.approx(30 * 1.04, abs=0.5)
    assert "no single rise above" in ramp
    assert "test_blip" not in out and "test_flat" not in out  # a blip, and noise, are no steps
    assert "  2 test(s) without a step or creep beyond 5%+10MB" in out


def test_the_same_commit_measured_again_is_a_second_sample_not_a_second_entry(repository: Repository):
    entries = history.read_history(repository.folder / "history.jsonl").entries
    assert len(entries) == COMMITS - 1  # one entry a commit measured
    twice = next(entry for entry in entries if entry.commit == repository.commits[STEP_AT - 1])
    assert len(twice.sessions) == 2 and len(twice.tests["test_suite.py::test_step"]) == 2


def test_merge_folds_shards_into_one_entry_and_merging_again_changes_nothing(repository: Repository, tmp_path: Path):
    shards = tmp_path / "shards"
    shutil.copytree(repository.folder, shards, ignore=shutil.ignore_patterns("*.jsonl", ".tfmem"))
    shard = Repository.__new__(Repository)
    shard.folder, shard.commits = shards, []
    for name, selection in (("one.jsonl", "step or ramp"), ("two.jsonl", "blip or flat")):
        assert shard.session("-k", selection, history=name).returncode == 0
    merged = tfmem(shards, "merge", "-o", "merged.jsonl", "one.jsonl", "two.jsonl")
    assert merged.returncode == 0, merged.stderr
    entries = history.read_history(shards / "merged.jsonl").entries
    assert len(entries) == 1 and len(entries[0].sessions) == 2 and len(entries[0].tests) == 4
    again = tfmem(shards, "merge", "-o", "merged.jsonl", "merged.jsonl", "one.jsonl", "merged.jsonl")
    assert again.returncode == 0, again.stderr
    assert history.read_history(shards / "merged.jsonl").entries == entries  # idempotent: each session once
    refused = tfmem(shards, "merge", "-o", "merged.jsonl", "one.jsonl", "test_suite.py")
    assert refused.returncode == 2 and "test_suite.py: not a memory history" in refused.stderr


def copy_of_the_history(repository: Repository, name: str) -> str:
    """A copy of the repository's history, for a session whose own line must not reach the others'."""
    shutil.copy(repository.folder / "history.jsonl", repository.folder / name)
    return name


def test_the_gate_fails_a_test_crept_past_its_best_level_and_counts_a_step_that_held_as_the_new_level(
    repository: Repository,
):
    done = repository.session("--tfmem-history-gate=20%", "-k", "ramp or step or flat",
                              history=copy_of_the_history(repository, "gate.jsonl"))
    assert done.returncode == 1, done.stdout
    line = next(line for line in done.stdout.splitlines() if line.startswith("FAILED test_suite.py::test_ramp"))
    assert "tfmem: peak 4" in line
    block = done.stdout.split("_ test_ramp _", 1)[1]
    best = repository.commits[1][:7]  # the middle reading of the first three commits'
    # each commit added 4%, about 1.6 MiB: none of them more than the floor, so none is named
    assert re.search(rf"vs its best level in the memory history, (30|31|32)\.\d MiB \(the middle reading of 3 "
                     rf"commits, at {best} 10 commit\(s\) ago\) \(\+4\d\.\d%, > 20%, and at least 11\.\d MiB, "
                     r"the history's floor, 5%\+10MB\): no single commit added more than the noise \(11\.\d MiB\)",
                     block), block
    # 80 MiB against 40 MiB before its step, but the step held for commits: 80 MiB is its level now
    assert "FAILED test_suite.py::test_step" not in done.stdout
    assert "FAILED test_suite.py::test_flat" not in done.stdout  # within 20% of its best


def test_the_markdown_draws_the_tests_that_moved(repository: Repository):
    summary = repository.folder / "summary.md"
    done = repository.session("--tfmem-markdown=summary.md", history=copy_of_the_history(repository, "drawn.jsonl"))
    assert done.returncode == 0, done.stdout
    text = summary.read_text()
    assert "Memory history: tests that moved (their last commits, this one last):" in text
    rows = [line for line in text.splitlines() if line.startswith("| `test_suite.py::")]
    assert {row.split("`")[1] for row in rows if "since its best" not in row} >= {"test_suite.py::test_step",
                                                                                  "test_suite.py::test_ramp"}
    assert "test_flat" not in text.split("Memory history")[1].split("Heaviest")[0]
    markdown = tfmem(repository.folder, "history", "history.jsonl", "--markdown")
    assert "| `test_suite.py::test_step` | " in markdown.stdout and "▁" in markdown.stdout


def test_a_line_cut_short_is_never_joined_and_a_file_of_another_kind_is_never_appended_to(tmp_path: Path):
    path = tmp_path / "history.jsonl"
    good = history.session_entry(history.Commit("a" * 40, None, "main", "2026-12-01T00:00:00+00:00", False),
                                 {"python": "3.11"}, "s1", {"t.py::test_x": (MIB, None, {})}).to_line()
    path.write_text(good + good[: len(good) // 2])  # a session killed while it appended
    history.append_entry(path, history.session_entry(
        history.Commit("c" * 40, None, None, "2026-12-02T00:00:00+00:00", False), {"python": "3.11"}, "s2",
        {"t.py::test_x": (2 * MIB, None, {})}))
    lines = path.read_text().splitlines()
    assert lines[0] == good.strip() and json.loads(lines[2])["commit"] == "c" * 40  # the cut line kept, not joined
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    with pytest.raises(history.HistoryError, match="is not a pytest-tfmem history; it was left unchanged"):
        history.append_entry(notes, history.session_entry(
            history.Commit("c" * 40, None, None, "", False), {}, "s3", {}))
    assert notes.read_text() == "mine\n"


def test_outside_a_git_checkout_the_history_is_a_usage_error(pytester: pytest.Pytester):
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest("--tfmem-history=history.jsonl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: pytest-tfmem: --tfmem-history: history file *: not in a git checkout*"])


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_the_page_holds_each_series_and_draws_the_step_at_its_commit(repository: Repository, tmp_path: Path):
    page = tmp_path / "history.html"
    done = tfmem(repository.folder, "history", "history.jsonl", "--html", str(page))
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert "<script" not in text and "http" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    sections = text.count('<section class="test"')
    assert sections == 4
    assert text.index('data-test="test_suite.py::test_step"') < text.index('data-test="test_suite.py::test_flat"')
    for commit in repository.commits[:STEP_AT] + repository.commits[STEP_AT + 1 :]:
        assert f'data-commit="{commit}"' in text  # a point at every measured commit
    assert f'<line class="step" data-commit="{repository.commits[STEP_AT + 1]}"' in text


@pytest.mark.skipif(CHROMIUM is None, reason="needs a headless Chromium (apt-get install chromium)")
def test_the_page_renders_in_a_headless_browser_with_the_step_at_its_commit(repository: Repository, tmp_path: Path):
    """Chromium draws the page: the step's red line stands where the step's commit's point is."""
    from PIL import Image

    page = tmp_path / "history.html"
    assert tfmem(repository.folder, "history", "history.jsonl", "--html", str(page),
                 "--test", "*test_step").returncode == 0
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=800,700", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    image = Image.open(shot).convert("RGB")
    width, height = image.size
    pixels = image.load()
    red = {x for x in range(width) for y in range(height) if pixels[x, y][0] > 180 and pixels[x, y][1] < 90}
    blue = {x for x in range(width) for y in range(height) if pixels[x, y][2] > 150 and pixels[x, y][0] < 90}
    assert blue and red, "no chart drawn"
    from pytest_tfmem.gates.history_page import MARGIN, WIDTH

    first_point = min(blue) + 3  # the leftmost blue: the first point's circle, of radius 3
    measured = [c for c in repository.commits if c != repository.commits[STEP_AT]]
    index = measured.index(repository.commits[STEP_AT + 1])
    expected = first_point + index * (WIDTH - 2 * MARGIN) / (len(measured) - 1)
    assert min(abs(x - expected) for x in red) <= 3, (sorted(red)[:5], expected)


@pytest.mark.parametrize("block", [7, 64, 2**20])
def test_the_gate_reads_only_the_last_lines_of_a_long_history(tmp_path: Path, block: int):
    path = tmp_path / "history.jsonl"
    for number in range(10):
        commit = history.Commit(f"{number:040x}", None, None, f"2026-12-01T00:00:{number:02d}+00:00", False)
        history.append_entry(path, history.session_entry(commit, {"python": "3.11"}, f"s{number}",
                                                         {"t.py::test_x": ((number + 1) * MIB, None, {})}))
    with open(path, "rb") as stream:
        start = history._start_of_last_lines(stream, 3, block=block)
    assert path.read_bytes()[start:].count(b"\n") == 3
    assert [entry.commit for entry in history.read_history(path, last=3).entries] == [f"{n:040x}" for n in (7, 8, 9)]
    assert len(history.read_history(path, last=50).entries) == 10


def test_one_commit_that_read_low_is_no_best_level_to_creep_from():
    flat = [9.0, 8.5, 2.0, 9.0, 8.8, 9.2, 8.7, 9.1]  # MiB: a small test, one order read low
    found = creep(points([value * MIB for value in flat]))
    assert found is not None and found.best == int(8.5 * MIB) and not found.notable(MIN_STEP)


def test_the_creep_sentence_never_names_a_rise_larger_than_the_whole_change():
    found = creep(points([20 * MIB, 20 * MIB, 20 * MIB, 30 * MIB, 24 * MIB, 24 * MIB, 24 * MIB]))
    assert found is not None and found.describe() == (
        "+20.0% over 3 commits (20.0 MiB at c002 -> 24.0 MiB at c005), the largest rise +50.0% (at c003), "
        "partly undone since"
    )
    # a creep inside the series' noise names no rise: 0.2 MiB over a series that moves by 0.5 MiB
    noisy = creep(points([value * MIB for value in [50.0, 50.5, 50.1, 50.4, 50.0, 50.5, 50.2]]))
    assert noisy is not None and noisy.describe().endswith(")") and "rise" not in noisy.describe()


def test_the_creep_sentence_over_one_commit_or_mostly_one_rise_reads_plainly():
    """Not ``+42911.1% over 1 commits ..., no single rise above 42911.1%``."""
    once = creep(points([0.25 * MIB, 0.25 * MIB, 45.4 * MIB, 45.4 * MIB]))
    assert once is not None and once.describe() == "+18060.0% over 1 commit (256.0 KiB at c001 -> 45.4 MiB at c002)"
    mostly = creep(points([40 * MIB, 40.2 * MIB, 40.1 * MIB, 60 * MIB, 60.3 * MIB, 60.2 * MIB]))
    assert mostly is not None and mostly.describe() == (
        "+50.1% over 3 commits (40.1 MiB at c002 -> 60.2 MiB at c005), most of it at c003 (+49.6%)"
    )


def test_a_level_that_held_is_where_a_gate_counts_from():
    gate = parse_tolerance("25%")
    at_the_step = creep_since_last_step(points([40 * MIB] * 10 + [60 * MIB]), MIN_STEP)
    assert at_the_step is not None and at_the_step.best == 40 * MIB and at_the_step.notable(gate)
    # the step is held by the reading now: one reading at the new level is no level to hold it to yet
    assert creep_since_last_step(points([40 * MIB] * 10 + [60 * MIB] * 2), MIN_STEP) is None
    held = creep_since_last_step(points([40 * MIB] * 10 + [60 * MIB] * 3), MIN_STEP)
    assert held is not None and held.best == 60 * MIB and not held.notable(gate)
