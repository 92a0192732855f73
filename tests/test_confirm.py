"""A memory verdict stands only if it reproduces (``core.confirm``): a test whose first run paid
a one-time cost of the process passes on its re-run, the cost is booked under it; a failure that
reproduces names both runs' figures; a figure far above the test's recorded level (its memory
history, its baseline entry) is measured again before it is kept.

The suites here pay a one-time cost the way a real suite's first test of a kind does: a module
cache filled on first use (60 MiB), kept for the process's life.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import runs

from pytest_tfmem.core.retained import Level, ProcessAccount, Retained
from pytest_tfmem.gates import history
from pytest_tfmem.gates.environment import current_environment
from pytest_tfmem.gates.steps import Point, steps
from pytest_tfmem.session.summary import process_line
from pytest_tfmem.units import parse_tolerance

MIB = 2**20

ONE_TIME = '''
import os

import numpy as np

MIB = 2**20
_cache = []


def ran(name):
    with open(os.path.join(os.environ["RUNS_DIR"], name), "a") as runs:
        runs.write("ran\\n")


def test_pays_once():
    """A cache filled on first use: 60 MiB the first time, then 1 MiB of its own."""
    ran("test_pays_once")
    if not _cache:
        _cache.append(np.ones(60 * MIB, dtype=np.uint8))
    block = np.ones(MIB, dtype=np.uint8)
    del block


def test_needs_it_every_time():
    ran("test_needs_it_every_time")
    block = np.ones(80 * MIB, dtype=np.uint8)
    del block
'''


def report_tests(path: Path) -> dict[str, dict]:
    return {test["nodeid"].split("::")[-1]: test for test in json.loads(path.read_text())["tests"]}


def test_a_one_time_cost_passes_on_its_re_run_and_is_booked_under_the_test_that_paid_it(
    pytester: pytest.Pytester, runs_dir: Path
) -> None:
    pytester.makepyfile(test_one_time=ONE_TIME)
    report = pytester.path / "r.json"
    result = pytester.runpytest("-p", "no:randomly", "--tfmem-budget=40MB", f"--tfmem-report={report}")
    result.assert_outcomes(passed=1, failed=1)
    assert runs(runs_dir, "test_pays_once") == runs(runs_dir, "test_needs_it_every_time") == 2
    tests = report_tests(report)
    paid = tests["test_pays_once"]
    assert paid["outcome"] == "passed" and paid["measurement"]["peak"] < 3 * MIB  # the re-run's: its own need
    confirmation = paid["confirmation"]
    assert confirmation["reproduced"] is False and confirmation["asked_by"] == ["budget"]
    assert 59 * MIB <= confirmation["first_peak"] - confirmation["rerun_peak"] == confirmation["one_time_bytes"]
    assert [v["ok"] for v in paid["verdicts"]] == [True]
    account = json.loads(report.read_text())["session"]["one_time_costs"]
    assert account["count"] == 1 and account["largest"][0]["test"] == "test_one_time.py::test_pays_once"
    result.stdout.fnmatch_lines([
        "one-time costs of the process, told apart by re-runs: +[56]?.? MiB in 1 test *",
        "  one-time cost paid in test test_one_time.py::test_pays_once: +[56]?.? MiB (first run 6?.? MiB, re-run *)",
    ])
    # the test that needs its memory every time fails, naming both runs' figures
    result.stdout.fnmatch_lines([
        "tfmem: peak [78]?.? MiB > budget 40MB (38.1 MiB) (host RSS *)",
        "tfmem: reproduced by a re-run in the same process: first run [78]?.? MiB, re-run [78]?.? MiB",
    ])
    assert tests["test_needs_it_every_time"]["confirmation"]["reproduced"] is True


def test_rerun_false_keeps_the_first_verdict_and_says_so(pytester: pytest.Pytester, runs_dir: Path) -> None:
    pytester.makepyfile(test_one_time=ONE_TIME.replace(
        "def test_pays_once", "import pytest\n\n@pytest.mark.tfmem(rerun=False)\ndef test_pays_once"))
    result = pytester.runpytest("-p", "no:randomly", "--tfmem-budget=40MB", "-k", "pays_once")
    result.assert_outcomes(failed=1)
    assert runs(runs_dir, "test_pays_once") == 1
    result.stdout.fnmatch_lines([
        "the verdict is the first run's, not confirmed by a re-run: re-runs are off for this test (tfmem(rerun=False))"
    ])


def test_what_the_re_run_kept_is_booked_apart_from_the_tests_retained_figure(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_keeps="""
        import numpy as np

        kept = []

        def test_keeps():
            kept.append(np.ones(50 * 2**20, dtype=np.uint8))
        """)
    report = pytester.path / "r.json"
    # a fresh process: garbage an earlier in-process session left would be freed inside its span
    result = pytester.runpytest_subprocess("--tfmem-budget=40MB", f"--tfmem-report={report}")
    result.assert_outcomes(failed=1)
    (test,) = json.loads(report.read_text())["tests"]
    assert 49 * MIB < test["retained_bytes"] < 52 * MIB  # its own run's, not twice that
    (process,) = json.loads(report.read_text())["session"]["workers"]
    (booked,) = process["reruns"]
    assert booked["test"] == "test_keeps.py::test_keeps" and 49 * MIB < booked["bytes"] < 52 * MIB
    result.stdout.fnmatch_lines(["*tests +5?.? MiB, tfmem's re-runs +5?.? MiB*"])


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)


def test_a_figure_far_above_its_history_level_is_measured_again_and_the_re_run_is_kept(
    pytester: pytest.Pytester, runs_dir: Path
) -> None:
    """The history holds the test at 1 MiB; this session's first run pays 60 MiB once: the re-run's
    1 MiB is what the history gets, so no step or creep follows from a one-time cost."""
    pytester.makepyfile(test_one_time=ONE_TIME)
    git(pytester.path, "init", "-q")
    git(pytester.path, "-c", "user.email=ci@example.com", "-c", "user.name=CI", "commit", "-q", "--allow-empty",
        "-m", "start")
    path = pytester.path / "history.jsonl"
    for number in range(3):
        commit = history.Commit(f"{number:040x}", None, None, f"2026-12-01T00:00:{number:02d}+00:00", False)
        history.append_entry(path, history.session_entry(
            commit, current_environment(), f"s{number}", {"test_one_time.py::test_pays_once": (MIB, None, {})}))
    result = pytester.runpytest("-p", "no:randomly", f"--tfmem-history={path}", "-k", "pays_once", "-rA")
    result.assert_outcomes(passed=1)
    assert runs(runs_dir, "test_pays_once") == 2
    result.stdout.fnmatch_lines([
        "re-run in the same process to confirm (6?.? MiB above its level in the memory history, 1.0 MiB): "
        "it did not reproduce (first run 6?.? MiB (host RSS 6?.? MiB), re-run * (host RSS *))*"
    ])
    (last,) = history.read_history(path, last=1).entries
    ((_, peak, _),) = last.tests["test_one_time.py::test_pays_once"]
    assert peak < 3 * MIB


def test_a_first_record_in_the_history_and_a_first_baseline_entry_are_warm(pytester: pytest.Pytester,
                                                                             runs_dir: Path) -> None:
    """A test new to the history (or to the baseline a save writes) has no level to depart from: a
    figure above the floor is measured again before it is kept, so the first record is not the
    cold first run (61 MiB) but the test's own need (1 MiB), and no later reading is a step down."""
    pytester.makepyfile(test_one_time=ONE_TIME)
    git(pytester.path, "init", "-q")
    git(pytester.path, "-c", "user.email=ci@example.com", "-c", "user.name=CI", "commit", "-q", "--allow-empty",
        "-m", "start")
    result = pytester.runpytest("-p", "no:randomly", "--tfmem-history=history.jsonl",
                                "--tfmem-save-baseline=baseline.json", "-k", "pays_once", "-rA")
    result.assert_outcomes(passed=1)
    assert runs(runs_dir, "test_pays_once") == 2
    result.stdout.fnmatch_lines(["re-run in the same process to confirm (6?.? MiB, its first entry in the baseline; "
                                 "6?.? MiB, its first figure in the memory history): it did not reproduce *"])
    (entry,) = history.read_history(pytester.path / "history.jsonl").entries
    ((_, peak, _),) = entry.tests["test_one_time.py::test_pays_once"]
    assert peak < 3 * MIB
    saved = json.loads((pytester.path / "baseline.json").read_text())["tests"]
    assert saved["test_one_time.py::test_pays_once"]["peak"] < 3 * MIB


PAYS_ONCE_AND_NEEDS_40_MIB = """
import numpy as np

CACHE = []

def test_pays_once_and_needs_40_mib():
    if not CACHE:
        CACHE.append(np.ones(60 * 2**20, dtype=np.uint8))
    block = np.ones(40 * 2**20, dtype=np.uint8)
    del block
"""


def test_a_failure_whose_re_run_reads_far_lower_rests_on_the_re_runs_figures(pytester: pytest.Pytester) -> None:
    """The first run pays a 60 MiB cache and needs 40 MiB; the re-run needs 40 MiB alone. Both fail
    a 30MB budget, but the verdict is the re-run's: 40 MiB, the rest booked as paid once."""
    pytester.makepyfile(test_both=PAYS_ONCE_AND_NEEDS_40_MIB)
    result = pytester.runpytest("-p", "no:randomly", "--tfmem-budget=30MB", "--tfmem-report=r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "tfmem: peak [34]?.? MiB > budget 30MB (28.6 MiB) (host RSS [34]?.? MiB)",
        "tfmem: reproduced by a re-run in the same process, [56]?.? MiB lower: first run *.? MiB, re-run [34]?.? MiB, "
        "then re-run [34]?.? MiB; the verdict rests on the re-run's figures, and the rest was paid once by the process",
    ])
    (test,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    assert test["confirmation"]["reproduced"] is True and test["confirmation"]["rerun_kept"] is True
    assert 38 * MIB < test["measurement"]["peak"] < 43 * MIB  # 40 MiB, less pages the process had free


def test_a_figure_near_its_history_level_is_not_measured_again(pytester: pytest.Pytester, runs_dir: Path) -> None:
    pytester.makepyfile(test_one_time=ONE_TIME)
    git(pytester.path, "init", "-q")
    git(pytester.path, "-c", "user.email=ci@example.com", "-c", "user.name=CI", "commit", "-q", "--allow-empty",
        "-m", "start")
    path = pytester.path / "history.jsonl"
    commit = history.Commit(f"{0:040x}", None, None, "2026-12-01T00:00:00+00:00", False)
    history.append_entry(path, history.session_entry(
        commit, current_environment(), "s0", {"test_one_time.py::test_needs_it_every_time": (80 * MIB, None, {})}))
    result = pytester.runpytest("-p", "no:randomly", f"--tfmem-history={path}", "-k", "every_time")
    result.assert_outcomes(passed=1)
    assert runs(runs_dir, "test_needs_it_every_time") == 1


def test_a_retained_limit_is_confirmed_while_the_fixtures_still_stand(pytester: pytest.Pytester, runs_dir: Path) -> None:
    """A call that keeps more than ``max_retained`` runs again before its teardown: what only
    the first run kept (the 60 MiB cache) is booked apart as a one-time cost, and the test passes;
    a test that keeps 30 MiB at every run fails at its teardown with both runs' figures."""
    pytester.makepyfile(test_one_time=ONE_TIME + '''

kept = []


def test_keeps_every_time():
    ran("test_keeps_every_time")
    kept.append(np.ones(30 * MIB, dtype=np.uint8))
''')
    report = pytester.path / "r.json"
    result = pytester.runpytest_subprocess(
        "--tfmem-max-retained=20MB", f"--tfmem-report={report}", "-k", "pays_once or keeps_every_time", "-rA")
    result.assert_outcomes(passed=2, errors=1)
    assert runs(runs_dir, "test_pays_once") == runs(runs_dir, "test_keeps_every_time") == 2
    tests = report_tests(report)
    assert tests["test_pays_once"]["retained_bytes"] < 3 * MIB
    (process,) = json.loads(report.read_text())["session"]["workers"]
    (paid,) = process["first_use"]
    assert paid["name"] == "one-time costs of first runs" and paid["detail"] == "paid in test_one_time.py::test_pays_once"
    assert 59 * MIB < paid["bytes"] < 62 * MIB
    assert 29 * MIB < tests["test_keeps_every_time"]["retained_bytes"] < 32 * MIB  # the first run's only
    result.stdout.fnmatch_lines([
        "tfmem: retained 3?.? MiB > max_retained 20MB (19.1 MiB) after the teardown *",
        "tfmem: reproduced by a re-run in the same process: its call kept +3?.? MiB in the first run, +3?.? MiB in "
        "the re-run",
        "re-run in the same process to confirm (it kept 6?.? MiB, above the 19.1 MiB it may leave behind): it did "
        "not reproduce *",
    ])


def test_a_figure_that_departs_unconfirmed_is_marked_and_never_makes_a_step_or_a_baseline(
    pytester: pytest.Pytester, runs_dir: Path, tmp_path: Path
) -> None:
    """With re-runs off for the test, its first run's 60 MiB one-time cost is kept with a mark:
    the history's series leaves it out, and a baseline save keeps the test's old entry."""
    pytester.makepyfile(test_one_time=ONE_TIME.replace(
        "def test_pays_once", "import pytest\n\n@pytest.mark.tfmem(rerun=False)\ndef test_pays_once"))
    git(pytester.path, "init", "-q")
    git(pytester.path, "-c", "user.email=ci@example.com", "-c", "user.name=CI", "commit", "-q", "--allow-empty",
        "-m", "start")
    path = pytester.path / "history.jsonl"
    nodeid = "test_one_time.py::test_pays_once"
    for number in range(3):
        commit = history.Commit(f"{number:040x}", None, None, f"2026-12-01T00:00:{number:02d}+00:00", False)
        history.append_entry(path, history.session_entry(
            commit, current_environment(), f"s{number}", {nodeid: (MIB, None, {})}))
    baseline = tmp_path / "baseline.json"
    pytester.runpytest("-p", "no:randomly", f"--tfmem-save-baseline={baseline}", "-k", "every_time").assert_outcomes(
        passed=1)
    saved = json.loads(baseline.read_text())
    saved["tests"][nodeid] = {"peak": MIB}
    baseline.write_text(json.dumps(saved))
    result = pytester.runpytest("-p", "no:randomly", f"--tfmem-history={path}", f"--tfmem-save-baseline={baseline}",
                                "-k", "pays_once", "-rA")
    result.assert_outcomes(passed=1)
    assert runs(runs_dir, "test_pays_once") == 1
    result.stdout.fnmatch_lines([
        "its figure is kept unconfirmed (6?.? MiB above its baseline entry, 1.0 MiB; 6?.? MiB above its level in "
        "the memory history, 1.0 MiB): re-runs are off for this test (tfmem(rerun=False)); the history marks it*",
        "tfmem: baseline saved to *: 0 test(s) updated, 1 kept their entry (a departure left unconfirmed), 2 in the file",
    ])
    read = history.read_history(path)
    (last,) = read.entries[-1:]
    assert last.unconfirmed[nodeid][0][1].startswith("6") and last.tests[nodeid][0][1] > 59 * MIB
    ((series,),) = history.series(read.entries, nodeids=[nodeid]).values()
    assert [point.value for point in series.points] == [MIB] * 3  # the marked figure is left out
    assert json.loads(baseline.read_text())["tests"][nodeid]["peak"] == MIB


def test_a_step_is_printed_as_the_figures_it_was_tested_on_never_below_the_floor() -> None:
    """A step is tested from the old level (104 MiB, the middle of its last three readings), not
    from the one low reading before the jump (100 MiB): the printed change is the tested one, +16
    MiB, above the floor (5%+10MB: 15.2 MiB at 104 MiB); from 100 MiB +16 MiB would be no step."""
    floor = parse_tolerance("5%+10MB")
    series = [Point(f"c{i}", f"c{i - 1}" if i else None, (int(v * MIB),)) for i, v in enumerate([104, 104, 100, 120, 120])]
    (step,) = steps(series, floor)
    assert (step.before, step.after) == (104 * MIB, 120 * MIB)
    assert step.change > floor.allowance(int(step.before))
    assert step.describe() == "+16.0 MiB (+15.4%) at c3: 104.0 MiB -> 120.0 MiB"
    low_reading = [Point(p.commit, p.parent, (int(v * MIB),)) for p, v in zip(series, [104, 104, 100, 116, 116])]
    assert steps(low_reading, floor) == []


def test_the_explained_share_never_exceeds_all_and_no_pool_is_named_without_one() -> None:
    """Memory freed between two tests makes the parts add up to more than the growth."""
    account = ProcessAccount(None)
    account.add("t.py::test_a", Retained(Level(100 * MIB), Level(150 * MIB), seq=1))
    account.add("t.py::test_b", Retained(Level(140 * MIB), Level(160 * MIB), seq=2))
    assert account.growth == 60 * MIB and account.between_tests == -10 * MIB
    assert account.explained_share == 1.0
    line = process_line(account)
    assert line.endswith("; 100% explained by tests, fixtures and imports") and "pool" not in line
    pooled = ProcessAccount(None)
    pooled.add("t.py::test_a", Retained(Level(100 * MIB, 0, 8 * MIB), Level(150 * MIB, 0, 8 * MIB), seq=1))
    assert process_line(pooled).endswith("explained by tests, fixtures, imports and the pool")


TWO_RUNS_TO_WARM = """
import numpy as np

CACHES = []


def test_warms_in_two_runs():
    \"\"\"Its first run fills one cache (60 MiB), its second another (20 MiB): only its third needs
    no more than its own 1 MiB.\"\"\"
    if len(CACHES) < 2:
        CACHES.append(np.ones((60 if not CACHES else 20) * 2**20, dtype=np.uint8))
    block = np.ones(2**20, dtype=np.uint8)
    del block
"""


def test_a_re_run_that_still_settles_is_followed_by_one_more_and_judged_on_it(pytester: pytest.Pytester,
                                                                             runs_dir: Path) -> None:
    pytester.makepyfile(test_settles=TWO_RUNS_TO_WARM)
    result = pytester.runpytest("-p", "no:randomly", "--tfmem-budget=15MB", "--tfmem-report=r.json", "-rA")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "re-run in the same process to confirm (budget): it did not reproduce (first run 6?.? MiB (host RSS *), "
        "re-run 2?.? MiB, then re-run ?.? MiB (host RSS *)); the verdict is the re-run's, *",
    ])
    (test,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    confirmation = test["confirmation"]
    assert 19 * MIB < confirmation["settling_peak"] < 23 * MIB and confirmation["rerun_peak"] < 3 * MIB
    # a re-run that fails again at about the first run's figure is not run once more
    pytester.makepyfile(test_settles=ONE_TIME)
    again = pytester.runpytest("-p", "no:randomly", "--tfmem-budget=40MB", "--tfmem-report=r.json", "-k", "every_time")
    again.assert_outcomes(failed=1)
    assert json.loads((pytester.path / "r.json").read_text())["tests"][0]["confirmation"]["settling_peak"] is None
