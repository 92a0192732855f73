"""The kernel's OOM killer for real: pytest sessions run inside a memory cgroup limited to 1 GiB.

As root, with the cgroup v1 memory controller, a child cgroup of this process's own is made
for each test and removed after it; the session is started inside it. A runaway test then
meets the kernel's OOM killer: no simulated SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import dump_records, dumped_records

LIMIT = 2**30
V1_MEMORY = Path("/sys/fs/cgroup/memory")

TESTS = """
import time
import numpy as np
import pytest

def test_before():
    pass

{marker}
def test_runaway():
    blocks = []
    for _ in range(400):  # heads for 4 GB, 10 MB at a time: far past the cgroup's 1 GiB
        blocks.append(np.ones(10 * 10**6, dtype=np.uint8))
        time.sleep(0.005)

def test_after():
    pass
"""


class MemoryCgroup:
    """A cgroup v1 memory cgroup with a limit; commands started through it run inside it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def command(self, *argv: str) -> list[str]:
        """``argv``, run by a shell that first moves itself into the cgroup."""
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path), *argv]

    def oom_kills(self) -> int:
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        raise AssertionError("no oom_kill count in memory.oom_control")

    def processes(self) -> list[int]:
        return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]


def _own_memory_cgroup() -> Path | None:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            directory = V1_MEMORY / path.lstrip("/")
            return directory if directory.is_dir() else V1_MEMORY
    return None


@pytest.fixture
def memory_cgroup() -> Iterator[MemoryCgroup]:
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    parent = _own_memory_cgroup()
    if parent is None or not (parent / "memory.limit_in_bytes").exists():
        pytest.skip("no cgroup v1 memory controller for this process")
    path = parent / f"tfmem-test-{uuid.uuid4().hex[:12]}"
    try:
        path.mkdir()
        (path / "memory.limit_in_bytes").write_text(str(LIMIT))
        if (path / "memory.memsw.limit_in_bytes").exists():  # no swap either: the OOM killer acts
            (path / "memory.memsw.limit_in_bytes").write_text(str(LIMIT))
    except OSError as error:
        if path.exists():
            path.rmdir()
        pytest.skip(f"cannot make a memory cgroup under {parent}: {error}")
    cgroup = MemoryCgroup(path)
    try:
        yield cgroup
    finally:
        for pid in cgroup.processes():  # the sessions' processes, if any outlived them
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while True:
            try:
                path.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def _pytest(pytester: pytest.Pytester, cgroup: MemoryCgroup, *args: str) -> pytest.RunResult:
    junit = pytester.path / "junit.xml"
    return pytester.run(
        *cgroup.command(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", *dump_records(pytester.path), *args),
        timeout=300,
    )


@pytest.mark.linux  # a memory cgroup's OOM-kill count
@pytest.mark.slow
def test_the_oom_killer_kills_an_isolated_test_and_the_session_goes_on(
    pytester: pytest.Pytester, memory_cgroup: MemoryCgroup
):
    pytester.makepyfile(TESTS.format(marker="@pytest.mark.tfmem(isolate=True)"))
    result = _pytest(pytester, memory_cgroup)
    result.assert_outcomes(passed=2, failed=1)
    assert result.ret == 1
    # The kernel may take a second process of the cgroup before the first one's memory is freed
    # (once in a CI run under load): the message gives the cgroup's own count, whatever it is.
    kills = memory_cgroup.oom_kills()
    assert kills >= 1
    result.stdout.fnmatch_lines(
        [
            "*tfmem: the isolated test's process was killed by SIGKILL (not sent by pytest-tfmem): the kernel's "
            f"OOM killer: out of memory (this cgroup's oom_kill count rose by {kills})",
            "the process tree (the test's process and every process it started, which kill_at counts): last *, peak * MiB (sampled)*",
            "*available memory at the last reading: * of 1.0 GiB (cgroup v1 memory.limit_in_bytes *)",
        ]
    )
    records = dumped_records(pytester.path)
    runaway = records["test_runaway"].extra["isolated"]
    assert runaway["death"] == "killed by SIGKILL"
    assert runaway["tree_peak_sampled"] >= 0.5 * LIMIT  # the readings saw it grow towards the limit


@pytest.mark.linux  # a memory cgroup's OOM-kill count
@pytest.mark.slow
def test_isolate_auto_explains_the_test_that_killed_the_last_session(
    pytester: pytest.Pytester, memory_cgroup: MemoryCgroup
):
    pytester.makepyfile(TESTS.format(marker=""))
    first = _pytest(pytester, memory_cgroup, "--tfmem-isolate=auto", "--tfmem-budget=4GB")
    assert first.ret == -signal.SIGKILL  # the whole session: a bare "Killed"
    first_kills = memory_cgroup.oom_kills()
    assert first_kills >= 1

    second = _pytest(pytester, memory_cgroup, "--tfmem-isolate=auto", "--tfmem-budget=4GB")
    second.assert_outcomes(passed=2, failed=1)
    assert second.ret == 1
    assert memory_cgroup.oom_kills() > first_kills
    second.stdout.fnmatch_lines(
        [
            "*killed by SIGKILL (not sent by pytest-tfmem): the kernel's OOM killer: out of memory*",
        ]
    )
    second.stdout.fnmatch_lines(
        [
            "*= tfmem: --tfmem-isolate=auto =*",
            "tfmem: the session started * (pid *) died; 1 test(s) to isolate (journal *results.jsonl)",
            "test_isolate_auto_*.py::test_runaway: isolated: running when the session started * (pid *) died*; "
            "this time: killed by SIGKILL",
        ]
    )
    records = dumped_records(pytester.path)
    assert "isolated" not in records["test_before"].extra  # the others ran in process
    assert "isolated" not in records["test_after"].extra
    assert records["test_runaway"].extra["isolated"]["reason"].startswith("running when the session started")

    # Killed again, isolated: the next session isolates it again, for that reason.
    third = _pytest(pytester, memory_cgroup, "--tfmem-isolate=auto", "-k", "runaway")
    third.assert_outcomes(failed=1)
    third.stdout.fnmatch_lines(
        ["*::test_runaway: isolated: its isolated process was killed by SIGKILL in the session started *"]
    )
