"""The pieces of isolation on their own: memory limits, the journal's reader, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.core.subsession import output_excerpt
from pytest_tfmem.core.summary import section_text
from pytest_tfmem.core.verdict import Verdict
from pytest_tfmem.isolate.results import sampled_measurement
from pytest_tfmem.journal.reader import (
    EXIT_DID_NOT_FINISH,
    EXIT_NO_RESULTS,
    describe_last,
)
from pytest_tfmem.platforms import cgroups
from pytest_tfmem.probes import system
from pytest_tfmem.probes.watchdog import ProcessTreeRss, WatchResult, downsample

PHYSICAL = 16 * 2**30  # the machine's memory, as the platform read it


def _cgroup_v2(root: Path, path: str, files: dict[str, str]) -> Path:
    (root / "cgroup.controllers").write_text("memory\n")
    directory = root / path.lstrip("/")
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    proc = root / "proc-self-cgroup"
    proc.write_text(f"0::{path}\n")
    return proc


def test_cgroup_v2_limit_is_the_tightest_on_the_way_to_the_root(tmp_path: Path):
    proc = _cgroup_v2(tmp_path, "/ci/job", {"memory.max": "max\n", "memory.current": "1000\n"})
    (tmp_path / "ci" / "memory.max").write_text(f"{4 * 2**30}\n")
    limit = cgroups.applicable_memory_limit(PHYSICAL, tmp_path, proc)
    assert limit.bytes == 4 * 2**30
    assert limit.source == f"cgroup v2 memory.max ({tmp_path / 'ci' / 'memory.max'})"


def test_cgroup_v1_unlimited_falls_back_to_physical_memory(tmp_path: Path):
    memory = tmp_path / "memory" / "docker" / "abc"
    memory.mkdir(parents=True)
    (memory / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("5:cpu:/\n4:memory:/docker/abc\n0::/\n")
    assert cgroups.applicable_memory_limit(PHYSICAL, tmp_path, proc).source == "physical memory"
    (memory / "memory.limit_in_bytes").write_text(f"{2 * 2**30}\n")
    (memory / "memory.usage_in_bytes").write_text(f"{2**30}\n")
    assert cgroups.applicable_memory_limit(PHYSICAL, tmp_path, proc).bytes == 2 * 2**30
    assert cgroups.available_memory(PHYSICAL, tmp_path, proc) <= 2**30


def test_oom_kill_count_from_memory_events(tmp_path: Path):
    proc = _cgroup_v2(tmp_path, "/job", {"memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"})
    assert cgroups.oom_kill_count(tmp_path, proc) == 1


def test_a_container_sees_its_cgroup_as_the_root(tmp_path: Path):
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    (tmp_path / "memory.max").write_text(f"{3 * 2**30}\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/kubepods/pod123/container\n")  # not under the mount as seen inside
    assert cgroups.applicable_memory_limit(PHYSICAL, tmp_path, proc).bytes == 3 * 2**30


def test_this_machines_limit_is_readable():
    limit = system.applicable_memory_limit()
    assert limit.bytes > 0
    assert 0 < system.available_memory() <= limit.bytes


def test_downsample_keeps_the_peak_and_the_last_reading():
    timeline = [(i / 100, 100 + i) for i in range(1000)] + [(10.0, 5)]
    timeline[537] = (5.37, 10**9)
    kept = downsample(timeline, 12)
    assert len(kept) <= 12
    assert (5.37, 10**9) in kept
    assert kept[-1] == (10.0, 5)


def test_tfmem_last_skips_a_line_cut_short_by_a_kill(tmp_path: Path):
    journal = tmp_path / "results.jsonl"
    session = {"event": "session", "session": "s1", "pid": 2**22 + 1, "pid_created": 0.0, "started": 1000.0,
               "rootdir": "/project", "args": ["-x"]}
    entries = [
        session,
        {"session": "s1", "time": 1001.0, "event": "start", "worker": "gw1", "nodeid": "t.py::test_big", "rss": 100 * 2**20},
        {"session": "s1", "time": 1002.0, "event": "reading", "worker": "gw1", "nodeid": "t.py::test_big",
         "elapsed_s": 1.0, "rss": 900 * 2**20, "peak": 950 * 2**20},
        {"session": "old", "time": 1002.5, "event": "finish", "worker": None, "nodeid": "t.py::other"},
    ]
    journal.write_text("\n".join(json.dumps(e) for e in entries) + '\n{"session": "s1", "time": 1003.0, "ev')
    text, code = describe_last(journal)
    assert code == EXIT_DID_NOT_FINISH
    lines = pytest.LineMatcher(text.splitlines())
    lines.fnmatch_lines(
        [
            "  t.py::test_big [[]gw1]: started *, still running 1.0 s later at the journal's last entry",
            "    last reading 900.0 MiB (+800.0 MiB since the test started) at 1.0 s into the test *; peak 950.0 MiB *",
            "finished: 0 test(s)",
        ]
    )
    lines.no_fnmatch_line("*t.py::other*")  # another session's entry


def test_tfmem_last_on_a_file_that_is_not_a_journal(tmp_path: Path):
    other = tmp_path / "notes.txt"
    other.write_text("hello\n")
    text, code = describe_last(other)
    assert code == EXIT_NO_RESULTS
    assert "is not a pytest-tfmem results journal" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tfmem-kill-at=6XB"], "*--tfmem-kill-at value '6XB'*"),
        (["-o", "tfmem_isolate=maybe"], "*ini tfmem_isolate value 'maybe': expected true/false*"),
    ],
)
def test_bad_option_values_are_usage_errors(pytester: pytest.Pytester, args, message):
    pytester.makepyfile("def test_a(): pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_a_bad_isolate_marker_value_is_a_usage_error(pytester: pytest.Pytester):
    pytester.makepyfile("import pytest\n@pytest.mark.tfmem(isolate='sometimes')\ndef test_a(): pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_a: invalid tfmem marker argument isolate 'sometimes': expected true/false*"])


def test_sizes_above_the_memory_limit_warn(pytester: pytest.Pytester):
    pytester.makepyfile(
        "import pytest\n@pytest.mark.tfmem(budget='900TB', isolate=False)\ndef test_a(): pass\n"
    )
    result = pytester.runpytest("--tfmem-kill-at=800TB")
    result.assert_outcomes(passed=1)
    assert result.stdout.str().count("MemoryLimitWarning: pytest-tfmem:") == 3, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            (
                "*MemoryLimitWarning: pytest-tfmem: --tfmem-kill-at 745058.1 GiB is above the memory limit "
                "that applies*the kernel's OOM killer would act first"
            ),
        ]
    )
    result.stdout.fnmatch_lines(
        ["*MemoryLimitWarning: pytest-tfmem: tfmem marker argument budget 838190.3 GiB is above the memory limit*"]
    )
    result.stdout.fnmatch_lines(["*pytest-tfmem: isolate=False: kill_at is not enforced for this test"])


HOLDER_AND_FORK = """
import os, sys, time
held = bytearray(200 * 2**20)  # touched: resident
for i in range(0, len(held), 4096):
    held[i] = 1
if os.fork() == 0:
    own = bytearray(100 * 2**20)
    for i in range(0, len(own), 4096):
        own[i] = 1
    print("ready", flush=True)
    time.sleep(60)
    os._exit(0)
print(os.getpid(), flush=True)
time.sleep(60)
"""


def test_a_process_tree_leaves_a_template_out_and_counts_its_forks():
    """A template's own pages are left out of the session's tree; its forks' own memory is in."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER_AND_FORK], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        lines = {holder.stdout.readline().strip(), holder.stdout.readline().strip()}
        assert "ready" in lines
        with_template = ProcessTreeRss(os.getpid()).read()
        without_template = ProcessTreeRss(os.getpid(), leave_out={holder.pid}).read()
        assert with_template - without_template >= 190 * 2**20  # the template's 200 MiB, left out
        fork = psutil.Process(holder.pid).children()[0]
        assert fork.memory_info().rss >= 300 * 2**20  # the template's pages it shares, and its own 100 MiB
        # the fork is still counted, by what it grew above the template's pages it shares
        assert without_template - psutil.Process().memory_info().rss >= 95 * 2**20
    finally:
        for process in psutil.Process(holder.pid).children():
            process.kill()
        holder.kill()
        holder.wait()


def test_a_test_whose_process_died_before_any_figure_gets_a_section_of_its_verdicts():
    """A process SIGKILLed before the watchdog's first reading of the test leaves no figure:
    the test's tfmem section says what is known (an ``INTERNALERROR`` once, in a replacement)."""
    died = WatchResult(-9, None, False, last_rss=0, peak_rss=0, child_peak_rss=0, elapsed_s=0.01, timeline=[])
    measurement = sampled_measurement(died, call_start_rss=50 * 2**20, interval_s=0.02)
    assert measurement is None
    message = "the replacement process running this test (pid 4242) was killed by SIGKILL"
    record = TestRecord("test_x.py::test_dies", measurement, verdicts=[Verdict("killed", False, message)])
    record.notes.append("a note")
    assert section_text(record) == f"{message}\na note"


CRASH_WITH_THREADS = """
import ctypes, faulthandler, sys, threading, time
faulthandler.enable(file=sys.stdout)
def wait_a_while():
    time.sleep(60)
for _ in range(4):
    threading.Thread(target=wait_a_while, daemon=True).start()
time.sleep(0.2)
def crash_here():
    ctypes.string_at(0)
crash_here()
"""


@pytest.mark.linux  # Python's fault report reads "Fatal Python error" where a signal reports the crash
def test_a_crash_excerpt_starts_with_the_failing_threads_frames(tmp_path: Path):
    output = tmp_path / "output.log"
    with output.open("w") as file:
        died = subprocess.run([sys.executable, "-c", CRASH_WITH_THREADS], stdout=file, stderr=subprocess.STDOUT)
    assert died.returncode < 0
    report = output.read_text()
    assert report.index("Current thread") > report.index("Thread 0x")  # the report lists it last
    excerpt = output_excerpt(output, 8).splitlines()
    assert excerpt[0] == "Fatal Python error: Segmentation fault"
    assert excerpt[2].startswith("Current thread ") and "in crash_here" in "\n".join(excerpt)
    assert len(excerpt) == 8  # then the other threads' frames, as far as the excerpt goes
