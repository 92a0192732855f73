"""``--tfmem-session-limit``: past the limit after a test, the remaining tests run on in fresh
processes, replaced in turn; every test still runs and reports in the session.

Real pytest sessions in fresh interpreters. Tests grow the process with anonymous memory (filled
numpy arrays kept in a module-level list) and note which process ran them; the real OOM kill,
with TensorFlow, runs in a memory cgroup (``cgroup_helpers.py``).
"""

from __future__ import annotations

import json
import re
import signal
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest
from cgroup_helpers import memory_cgroup, oom_kills, run_pytest_in

from pytest_tfmem.isolate.limit import AUTO_SHARE_OF_ROOM, auto_limit
from pytest_tfmem.probes.system import MemoryLimit
from pytest_tfmem.units import parse_size

MiB = 2**20
STEP = 40 * MiB  # what each growing test leaves behind

# Tests that each leave STEP behind, note their process, and use fixtures of every scope.
GROWING = """
import json
import os
import signal

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
    KEPT.append(np.ones({step}, dtype=np.uint8))  # filled: resident, anonymous
    note("test", n=n)
    {extra}
"""

LIMIT = "--tfmem-session-limit=250MiB"


def _notes(pytester: pytest.Pytester) -> list[dict]:
    return [json.loads(line) for line in (pytester.path / "notes.jsonl").read_text().splitlines()]


def _size(text: str) -> int:
    return parse_size(text.replace(" ", ""))


CROSSING = re.compile(
    r"(?P<who>the session's process|replacement process \d+) \(pid (?P<pid>\d+)\) held (?P<held>[\d.]+ \w+) after the "
    r"teardown of (?P<nodeid>\S+) \(its (?P<tests>\d+)\w\w test; (?P<start>[\d.]+ \w+) before its first\), above "
    r"(?P<limit>[\d.]+ \w+): (?P<then>.*)"
)


def _crossings(output: str) -> list[dict[str, str]]:
    return [match.groupdict() for match in CROSSING.finditer(output)]


@pytest.fixture(scope="module")
def creep(tmp_path_factory: pytest.TempPathFactory) -> tuple[pytest.RunResult, Path]:
    """Twelve growing tests, the limit from the ini file, an isolated test and a killed one among them."""
    folder = tmp_path_factory.mktemp("creep")
    pytester = pytest.Pytester  # noqa: F841  # (the fixture is function-scoped; a plain run here)
    (folder / "pytest.ini").write_text("[pytest]\ntfmem_session_limit = 250MiB\n")
    source = GROWING.format(count=12, step=STEP, extra="if n == 9:\n        os.kill(os.getpid(), signal.SIGKILL)")
    source += (
        "\n\n@pytest.mark.tfmem(isolate=True)\ndef test_isolated(module_thing):\n"
        "    note('isolated', template=psutil.Process(os.getppid()).ppid())\n"
    )
    (folder / "test_creep.py").write_text(source)
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "--junitxml=junit.xml",
         "--tfmem-report=report.json", "-p", "no:rerunfailures"],
        cwd=folder, capture_output=True, text=True, timeout=300,
    )
    return done, folder
