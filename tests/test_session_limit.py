"""``--tfmem-session-limit``: past the limit after a test, the remaining tests run on in fresh
processes (forks of the template), replaced in turn; every test still runs and reports.

Real pytest sessions in fresh interpreters. Tests grow their process with anonymous memory
(filled numpy arrays kept in a module-level list) and note which process ran them; the real
OOM kill, with TensorFlow, runs in a memory cgroup (``cgroup_helpers.py``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

import psutil
import pytest
from cgroup_helpers import memory_cgroup, oom_kills, run_pytest_in
from conftest import PLAIN_RUN_OPTIONS

from pytest_tfmem.isolate.limit import auto_limit, parse_session_limit
from pytest_tfmem.probes.system import MemoryLimit
from pytest_tfmem.units import format_size, parse_size

MiB = 2**20

# Each test leaves STEP MiB (80 unless said); with the limit at 260 MiB a process that starts at
# 40-70 MiB crosses it after its third test (240 MiB left: 280-310 MiB held; two: 200-230 MiB).
GROWING = """
import json
import os

import numpy as np
import psutil
import pytest

KEPT = []


def note(event, **more):
    with open("notes.jsonl", "a") as notes:
        notes.write(json.dumps({{"event": event, "pid": os.getpid(), "parent": os.getppid(), **more}}) + "\\n")


@pytest.fixture(scope="session")
def session_thing():
    note("session setup")
    yield
    note("session teardown")


@pytest.fixture(scope="module")
def module_thing(session_thing):
    note("module setup")
    yield
    note("module teardown")


@pytest.mark.parametrize("n", range({count}))
def test_grows(module_thing, n):
    KEPT.append(np.ones({step} * 2**20, dtype=np.uint8))  # filled: resident, anonymous
    note("test", n=n)
    {extra}
"""

LIMIT = "260MiB"
CROSSING = re.compile(
    r"(?P<who>the session's process|worker \w+|replacement process \d+(?: of \w+)?) \(pid (?P<pid>\d+)\) held "
    r"(?P<held>[\d.]+ \w+) after the teardown of (?P<nodeid>\S+) \(its (?P<tests>\d+)\w\w test; "
    r"(?P<start>[\d.]+ \w+) before its first\), above (?P<limit>[\d.]+ \w+): (?P<then>.*)"
)


@dataclass
class Run:
    folder: Path
    returncode: int
    stdout: str

    @property
    def lines(self) -> pytest.LineMatcher:
        return pytest.LineMatcher(self.stdout.splitlines())

    def notes(self) -> list[dict]:
        return [json.loads(line) for line in (self.folder / "notes.jsonl").read_text().splitlines()]

    def crossings(self) -> list[dict[str, str]]:
        return [match.groupdict() for match in CROSSING.finditer(self.stdout)]


def _size(text: str) -> int:
    return parse_size(text.replace(" ", ""))


def _run(folder: Path, source: str, *args: str) -> Run:
    (folder / "test_creep.py").write_text(source)
    # Without the outer PYTEST_ADDOPTS, so pytest-randomly (and the plugins that would make the process
    # larger) are switched off here: the tests run in file order, two to a process.
    environment = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *PLAIN_RUN_OPTIONS.split(), "-v", *args],
        cwd=folder, env=environment, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    return Run(folder, done.returncode, done.stdout + done.stderr)


def _by_process(notes: list[dict]) -> list[tuple[int, list[dict]]]:
    """The tests' notes grouped by the process that ran them, in the order they ran."""
    tests = [note for note in notes if note["event"] == "test"]
    return [(pid, list(group)) for pid, group in groupby(tests, key=lambda note: note["pid"])]


@pytest.fixture(scope="module")
def creep(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Twelve growing tests, the limit from the ini file; one test is killed in a replacement
    process, and an isolated test comes last."""
    folder = tmp_path_factory.mktemp("creep")
    (folder / "pytest.ini").write_text(f"[pytest]\ntfmem_session_limit = {LIMIT}\n")
    source = GROWING.format(step=80, count=12, extra="if n == 7:\n        os.kill(os.getpid(), 9)  # as the OOM killer would")
    source += (
        "\n\n@pytest.mark.tfmem(isolate=True)\ndef test_isolated(module_thing):\n"
        "    note('isolated', grandparent=psutil.Process(os.getppid()).ppid())\n"
    )
    return _run(folder, source, "--junitxml=junit.xml", "--tfmem-report=report.json")


def test_past_the_limit_the_remaining_tests_run_on_in_replacement_processes(creep: Run):
    assert creep.returncode == 1, creep.stdout  # the killed test's failure; crossing fails none
    names = [f"test_creep.py::test_grows[{n}]" for n in range(12)] + ["test_creep.py::test_isolated"]
    creep.lines.fnmatch_lines(
        [f"{name.replace('[', '[[]')} {'FAILED' if name.endswith('[7]') else 'PASSED'}*" for name in names]
    )
    creep.lines.fnmatch_lines(["*= 1 failed, 12 passed in *"])
    crossings = creep.crossings()
    processes = _by_process(creep.notes())
    assert len(processes) >= 4  # the session's own, then replacements
    session_pid = processes[0][0]
    assert crossings[0]["who"] == "the session's process" and int(crossings[0]["pid"]) == session_pid
    # Each crossing: after the last test its process ran, at a size above the limit, and the
    # next test ran in another process.
    crossed = {int(c["pid"]): c for c in crossings}
    for pid, notes in processes:
        if pid not in crossed:
            continue
        crossing = crossed[pid]
        assert crossing["nodeid"] == f"test_creep.py::test_grows[{notes[-1]['n']}]"
        assert int(crossing["tests"]) == len(notes) == 3
        assert _size(crossing["limit"]) == 260 * MiB < _size(crossing["held"]) < 260 * MiB + 90 * MiB
        assert crossing["then"] == ("the tests that remained ran on in a fresh process" if pid == session_pid else "replaced")
    assert len(crossings) == 3  # the session's process, replacements 1 and 2; the one killed never crossed
    creep.lines.fnmatch_lines(
        [
            "*= tfmem: session limit 260.0 MiB =*",
            "the session's process (pid *) held * MiB after the teardown of test_creep.py::test_grows[[]2] (its 3rd test; "
            "* MiB before its first), above 260.0 MiB: the tests that remained ran on in a fresh process",
            "  left the most there: test_creep.py::test_grows[[]*] +*.* MiB, test_creep.py::test_grows[[]*] +*.* MiB, "
            "test_creep.py::test_grows[[]*] +*.* MiB",
            "replacement process 1 (pid *) held * MiB after the teardown of test_creep.py::test_grows[[]5] (its 3rd test; *",
        ]
    )
    left = re.findall(r"test_grows\[\d+\] \+([\d.]+) MiB", creep.stdout)
    # each left its 80 MiB (less what the process gave back in the same window: 77.8 MiB once, loaded)
    assert all(76 <= float(size) <= 90 for size in left), left


@pytest.mark.linux  # forks of the template
def test_replacements_are_forks_of_the_template_and_start_in_well_under_a_second(creep: Run):
    notes = creep.notes()
    processes = _by_process(notes)
    templates = {note["parent"] for pid, group in processes[1:] for note in group}
    (isolated,) = [note for note in notes if note["event"] == "isolated"]
    assert templates == {isolated["parent"]}  # the isolated test's template forked the replacements too
    assert isolated["grandparent"] == processes[0][0]  # a fork of the session, made before its first test
    assert isolated["pid"] not in {pid for pid, _ in processes}  # isolated still: a process of its own
    (started,) = re.findall(r"(\d+) replacement process\(es\) started \(forks of the template\), ready in ([\d.]+) s on "
                            r"average, ([\d.]+) s at most; crossing the limit fails no test", creep.stdout)  # fmt: skip
    assert int(started[0]) == len(processes) - 1
    assert float(started[2]) < 1.0
    assert not any(psutil.pid_exists(pid) for pid, _ in processes[1:])  # none outlived the session


def test_fixtures_of_wider_scope_are_set_up_anew_in_each_process(creep: Run):
    notes = creep.notes()
    for pid, tests in _by_process(notes):
        events = [note["event"] for note in notes if note["pid"] == pid and note["event"] != "test"]
        killed = any(note["n"] == 7 for note in tests)
        expected = ["session setup", "module setup"] + ([] if killed else ["module teardown", "session teardown"])
        assert events == expected, (pid, events)


def test_a_test_killed_in_a_replacement_process_fails_alone(creep: Run):
    creep.lines.fnmatch_lines(
        [
            "*tfmem: the replacement process running this test (pid *) was killed by SIGKILL (not sent by pytest-tfmem)*",
        ]
    )
    processes = _by_process(creep.notes())
    (killed_in,) = [index for index, (_, tests) in enumerate(processes) if tests[-1]["n"] == 7]
    assert [note["n"] for note in processes[killed_in + 1][1]][:2] == [8, 9]  # on in a fresh one


def test_every_report_reaches_junit_xml_and_the_json_report(creep: Run):
    cases = {case.get("name"): case for case in ET.parse(creep.folder / "junit.xml").getroot().iter("testcase")}
    assert len(cases) == 13
    assert [child.tag for child in cases["test_grows[7]"]].count("failure") == 1
    report = json.loads((creep.folder / "report.json").read_text())
    assert len(report["tests"]) == 13
    peaks = {test["nodeid"]: test["measurement"]["peak"] for test in report["tests"] if test["measurement"]}
    assert all(79 * MiB < peaks[f"test_creep.py::test_grows[{n}]"] < 86 * MiB for n in range(12) if n != 7), {
        nodeid: round(peak / MiB, 1) for nodeid, peak in peaks.items()
    }


@pytest.mark.parametrize(
    ("extra", "args", "code", "outcome"),
    [
        pytest.param("assert n != 4", ["-x"], 1, "*= 1 failed, 4 passed in *", id="-x"),
        pytest.param("if n == 4:\n        raise KeyboardInterrupt", [], 2, "*KeyboardInterrupt*", id="KeyboardInterrupt"),
    ],
)
def test_a_session_stopped_in_a_replacement_stops_as_it_would_in_process(
    tmp_path: Path, extra: str, args: list[str], code: int, outcome: str
):
    run = _run(tmp_path, GROWING.format(step=80, count=7, extra=extra), f"--tfmem-session-limit={LIMIT}", *args)
    assert run.returncode == code, run.stdout
    run.lines.fnmatch_lines([outcome])
    notes = run.notes()
    assert max(note["n"] for note in notes if note["event"] == "test") == 4  # nothing ran after it
    processes = _by_process(notes)
    assert [pid for pid, tests in processes if tests[-1]["n"] == 4] != [processes[0][0]]  # in a replacement
    assert not any(psutil.pid_exists(pid) for pid, _ in processes[1:])
    if args == ["-x"]:  # its fixtures were finished there, as after the last test
        replacement = processes[-1][0]
        assert [n["event"] for n in notes if n["pid"] == replacement][-2:] == ["module teardown", "session teardown"]


def test_under_xdist_each_worker_hands_its_tests_to_replacements(tmp_path: Path):
    run = _run(tmp_path, GROWING.format(step=80, count=12, extra=""), f"--tfmem-session-limit={LIMIT}", "-n", "2",
               "--tfmem-report=report.json")  # fmt: skip
    assert run.returncode == 0, run.stdout
    run.lines.fnmatch_lines(["*= 12 passed in *"])
    assert len(json.loads((tmp_path / "report.json").read_text())["tests"]) == 12
    crossings = run.crossings()
    assert crossings and all(c["who"].startswith(("worker gw", "replacement process")) for c in crossings)
    assert len({note["pid"] for note in run.notes()}) > 2  # more processes than the two workers


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tfmem-session-limit=lots"], "*invalid --tfmem-session-limit value 'lots': expected a non-negative "
         "number of bytes or a number with a unit: B, KB, MB*; or auto"),
        (["-o", "tfmem_session_limit=-1GB"], "*invalid ini tfmem_session_limit value '-1GB': expected * or auto"),
    ],
)  # fmt: skip
def test_a_bad_session_limit_is_a_usage_error(pytester: pytest.Pytester, args: list[str], message: str):
    pytester.makepyfile("def test_a(): pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_auto_is_the_start_plus_a_share_of_the_room_under_the_limit():
    gib = MemoryLimit(2**30, "cgroup")
    assert auto_limit(100 * MiB, gib, 1) == 100 * MiB + int(924 * MiB * 0.4)
    assert auto_limit(100 * MiB, gib, 2) == 100 * MiB + int(412 * MiB * 0.4)  # shared among workers
    assert auto_limit(600 * MiB, gib, 2) == 600 * MiB  # no room left: every test crosses
    assert parse_session_limit("Auto", "x") == "auto" and parse_session_limit("1GB", "x") == 10**9


@pytest.mark.linux  # a memory cgroup's limit
def test_auto_resolves_under_the_cgroup_limit(pytester: pytest.Pytester):
    pytester.makepyfile(test_creep=GROWING.format(step=40, count=12, extra=""))
    with memory_cgroup(2**30) as cgroup:
        result = run_pytest_in(pytester, cgroup, "-p", "no:cacheprovider", "--tfmem-session-limit=auto")
        assert oom_kills(cgroup) == 0
    assert result.ret == 0, result.stdout.str()
    (crossing, *_) = [match.groupdict() for match in CROSSING.finditer(result.stdout.str())]
    expected = auto_limit(_size(crossing["start"]), MemoryLimit(2**30, "cgroup"), 1)
    assert abs(_size(crossing["limit"]) - expected) < 0.2 * MiB
    result.stdout.fnmatch_lines([f"*= tfmem: session limit auto ({crossing['limit']}) =*"])


TF_CREEP = """
import numpy as np
import pytest
import tensorflow as tf

KEPT = []


@pytest.mark.parametrize("n", range(12))
def test_leaves_100_mib(n):
    KEPT.append(np.ones(100 * 2**20, dtype=np.uint8))  # filled: anonymous memory the kernel cannot reclaim
    assert tf.reduce_sum(tf.ones((2, 2))).numpy() == 4
"""


# The process that crossed keeps what it grew while a replacement grows from the template, so
# both must fit in the cgroup: each grows to the limit plus one test's 100 MiB. With 800MB the
# cgroup's peak (memory.max_usage_in_bytes) reached its 1.2 GiB on TensorFlow 2.21 (the kernel
# reclaimed file pages) and 2.16 was OOM-killed (its smaller import lets the session's process run
# three tests before crossing); with 700MB it peaked at 1017 MiB on 2.21 and 1055 MiB on 2.16.
TF_LIMIT = "700MB"


@pytest.mark.linux  # a memory cgroup's OOM-kill count
@pytest.mark.slow  # two TensorFlow sessions in a memory cgroup
def test_in_a_cgroup_the_limit_turns_an_oom_kill_into_a_passing_session(pytester: pytest.Pytester):
    pytester.makepyfile(test_creep=TF_CREEP)
    with memory_cgroup(int(1.2 * 2**30)) as cgroup:
        killed = run_pytest_in(pytester, cgroup, "-p", "no:cacheprovider", "--tfmem-budget=4GB")
        assert killed.ret == -9 and oom_kills(cgroup) == 1  # a bare "Killed"
        kept = run_pytest_in(pytester, cgroup, "-p", "no:cacheprovider", "--tfmem-budget=4GB",
                             f"--tfmem-session-limit={TF_LIMIT}", "--tfmem-report=report.json")  # fmt: skip
        assert oom_kills(cgroup) == 1  # none this time
    assert kept.ret == 0, kept.stdout.str()
    kept.assert_outcomes(passed=12)
    report = json.loads((pytester.path / "report.json").read_text())
    assert report["exitstatus"] == 0 and len(report["tests"]) == 12
    kept.stdout.fnmatch_lines(
        [
            f"*= tfmem: session limit {format_size(parse_size(TF_LIMIT))} =*",
            "the session's process (pid *) held * after the teardown of test_creep.py::test_leaves_100_mib[[]*]*",
            "* replacement process(es) started (forks of the template), ready in * s on average*",
        ]
    )


def test_the_journal_follows_every_test_and_isolate_auto_isolates_the_killed_one(creep: Run, tmp_path: Path):
    journal = [json.loads(line) for line in (creep.folder / ".tfmem" / "results.jsonl").read_text().splitlines()]
    finished = {entry["nodeid"]: entry["outcome"] for entry in journal if entry.get("event") == "finish"}
    assert len(finished) == 13 and finished["test_creep.py::test_grows[7]"] == "failed"
    assert journal[-1]["event"] == "end"
    folder = tmp_path / "again"
    shutil.copytree(creep.folder, folder)
    (folder / "notes.jsonl").unlink()
    again = _run(folder, (folder / "test_creep.py").read_text(), "--tfmem-isolate=auto", "-k", "grows and (6 or 7 or 8)")
    again.lines.fnmatch_lines(
        ["test_creep.py::test_grows[[]7]: isolated: its isolated process was killed by SIGKILL in the session started *"]
    )


def test_spawned_replacements_are_fresh_interpreters(tmp_path: Path):
    run = _run(tmp_path, GROWING.format(step=80, count=5, extra=""), f"--tfmem-session-limit={LIMIT}",
               "--tfmem-isolate-start=spawn")  # fmt: skip
    assert run.returncode == 0, run.stdout
    run.lines.fnmatch_lines(["1 replacement process(es) started (fresh interpreters), ready in * s on average*"])
    assert "warnings summary" not in run.stdout  # what starting pytest there warned of, the session met itself
    session, replacement = (pid for pid, _ in _by_process(run.notes()))
    assert [note["parent"] for note in run.notes() if note["pid"] == replacement] == [session] * 6


# A module fixture holds 100 MiB and each test leaves 80 MiB: a process crosses 260 MiB after its
# second test, so six tests run in the session's process and two replacements.
BOOKED = (Path(__file__).resolve().parent.parent / "benchmarks" / "workloads" / "session_limit.py").read_text()


def test_replacement_processes_keep_books_and_the_crossing_names_retained_figures(tmp_path: Path):
    run = _run(tmp_path, BOOKED, f"--tfmem-session-limit={LIMIT}", "--tfmem-report=report.json")
    assert run.returncode == 0, run.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    retained = {test["nodeid"]: test["retained_bytes"] for test in report["tests"]}
    assert len(retained) == 6  # the tests run in replacements too
    # 80 MiB each, not the fixture's 100 MiB more; the first test of a process keeps besides what
    # that process's first measured test makes once (up to +7.4 MiB read on a loaded 2-core machine)
    assert all(78 * MiB < size < 90 * MiB for size in retained.values()), retained
    # The account: one process per replacement, each start -> end, and the books add up.
    session = report["session"]
    workers = [process["worker"] for process in session["workers"]]
    assert workers == [None, "replacement process 1", "replacement process 2"]
    assert [process["tests"] for process in session["workers"]] == [2, 2, 2]
    for process in session["workers"]:
        (setup,) = [fixture for fixture in process["fixtures"] if fixture["detail"] == "setup"]
        assert setup["name"] == "table (module scope)" and 95 * MiB < setup["bytes"] < 105 * MiB  # set up anew
        assert process["explained_share"] > 0.95
    assert session["growth_bytes"] == sum(process["growth_bytes"] for process in session["workers"])
    run.lines.fnmatch_lines(
        [
            "*= tfmem: what the tests left behind =*",
            "process * MiB -> * MiB (+*) over 2 measured tests: tests +*, fixtures +*",
            "replacement process 1: * MiB -> * MiB (+*) over 2 measured tests: tests +*, fixtures +*",
            "replacement process 2: * MiB -> * MiB (+*) over 2 measured tests: tests +*, fixtures +*",
        ]
    )
    # The crossing's "left the most" are the tests' retained figures (the first test of each
    # process is not charged the fixture it set up), and its size the account's end there.
    crossings = run.crossings()
    assert [c["who"] for c in crossings] == ["the session's process", "replacement process 1"]
    for line, crossing, process in zip(re.findall(r"left the most there: (.*)", run.stdout), crossings,
                                       session["workers"]):  # fmt: skip
        named = dict(re.findall(r"(\S+) \+([\d.]+ MiB)", line))
        assert len(named) == 2
        assert named == {nodeid: format_size(retained[nodeid]) for nodeid in named}
        assert crossing["held"] == format_size(process["end_bytes"])  # one reading of the boundary
