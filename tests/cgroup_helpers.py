"""A real memory limit for a pytest run: a child cgroup (v1 memory controller) made for one test.

Making one needs root and a cgroup v1 memory hierarchy this process's cgroup sits in (see
``/proc/self/cgroup``); elsewhere the test is skipped with the reason. The kernel's OOM killer
acts in it as it would on a CI runner with that much memory. Processes left in it are
killed (every one was started by the test) and the cgroup is removed afterwards.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

V1_MEMORY = Path("/sys/fs/cgroup/memory")


def own_memory_cgroup() -> Path | str:
    """This process's cgroup v1 memory directory, or why there is none to use."""
    if os.geteuid() != 0:
        return "making a memory cgroup needs root"
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError as error:
        return f"cannot read /proc/self/cgroup: {error}"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            directory = V1_MEMORY / path.lstrip("/")
            if (directory / "memory.limit_in_bytes").exists():
                return directory
            return f"the memory cgroup {directory} is not mounted here"
    return "no cgroup v1 memory controller (cgroup v2 or none)"


@contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A fresh child memory cgroup limited to ``limit_bytes``; skips the test where there can be none."""
    parent = own_memory_cgroup()
    if isinstance(parent, str):
        pytest.skip(parent)
    child = parent / f"tfmem-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
        (child / "memory.limit_in_bytes").write_text(str(limit_bytes))
    except OSError as error:
        if child.exists():
            child.rmdir()
        pytest.skip(f"cannot make a memory cgroup under {parent}: {error}")
    try:
        yield child
    finally:
        _empty(child)
        child.rmdir()


def _empty(cgroup: Path) -> None:
    """Kill what is left in the test's cgroup (all started by the test) and wait until it is empty."""
    deadline = time.monotonic() + 10
    while pids := (cgroup / "cgroup.procs").read_text().split():
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} stay in {cgroup}")
        time.sleep(0.05)


def oom_kills(cgroup: Path) -> int:
    """The cgroup's ``oom_kill`` count (v1 ``memory.oom_control``)."""
    for line in (cgroup / "memory.oom_control").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    raise AssertionError(f"no oom_kill count in {cgroup / 'memory.oom_control'}")


def run_pytest_in(pytester: pytest.Pytester, cgroup: Path, *args: str, timeout: float = 300) -> pytest.RunResult:
    """Run pytest in a fresh interpreter that enters ``cgroup`` before it starts (its workers follow)."""
    enter = f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"'
    return pytester.run("sh", "-c", enter, "sh", sys.executable, "-m", "pytest", *args, timeout=timeout)
