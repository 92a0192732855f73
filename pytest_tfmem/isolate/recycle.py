"""The session's side of its replacement processes (``replacement.py``): one at a time, started
when a test is to run in one, each running tests until it holds more than the session limit.

``Replacements.submit`` hands one test to the current replacement (starting one first if
there is none) and returns a ``DelegatedTest``: the watchdog (``probes/watchdog.py``) waits on it as
on an isolated test's process, and reads the replacement's memory meanwhile. The test's
events come back on the replacement's channel; a replacement that ends before its ``done``
(killed by the OOM killer, a crash) ends there, and the next test gets a fresh one.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from pytest_tfmem.isolate.launch import Launcher
from pytest_tfmem.isolate.limit import ReplacementStarted
from pytest_tfmem.isolate.replacement import ReplacementSpec
from pytest_tfmem.probes.watchdog import ChildProcess


class Replacement:
    """A running replacement process, seen from the session."""

    def __init__(self, process: ChildProcess, channel: socket.socket, output: Path) -> None:
        self.process = process
        self.channel = channel
        self.output = output
        self._answers: BinaryIO = channel.makefile("rb")
        self.ended = False  # its channel closed: the process ended or is ending

    def answer(self) -> dict[str, Any] | None:
        line = b"" if self.ended else self._answers.readline()
        if not line:
            self.ended = True
            return None
        answer: dict[str, Any] = json.loads(line)
        return answer

    def wait_ready(self) -> list[dict[str, Any]]:
        """Wait until it collected its tests; return what it said before (collection errors)."""
        said = []
        while (answer := self.answer()) is not None and answer["event"] != "ready":
            said.append(answer)
        return said

    def close(self) -> int:
        """Let it end (it does once its channel closes) and return its exit status."""
        self._answers.close()
        self.channel.close()
        return self.process.wait()


class DelegatedTest:
    """One test run in a replacement process, behind the part of a process the watchdog uses:
    ``wait`` returns 0 once the test is done, the replacement's exit status if it ended first."""

    def __init__(self, replacement: Replacement, events: list[dict[str, Any]]) -> None:
        self.replacement = replacement
        self.pid = replacement.process.pid
        self.returncode: int | None = None
        self.events = events  # what the replacement said before and while running the test
        self.full = False  # the replacement crossed the limit after this test and ends

    def wait(self) -> int:
        if self.returncode is None:
            while (answer := self.replacement.answer()) is not None and answer["event"] != "done":
                self.events.append(answer)
            if answer is None:
                self.returncode = self.replacement.close()
            else:
                self.full = bool(answer["full"])
                self.returncode = 0
        return self.returncode


class Replacements:
    """The replacement processes of this process (the session's own, or a pytest-xdist worker's)."""

    def __init__(
        self,
        launcher: Callable[[], tuple[Launcher, Path]],
        workdir: Callable[[str], Path],
        spec: Callable[[int, Path, list[str]], ReplacementSpec],
    ) -> None:
        self._launcher = launcher  # the isolated tests' launcher and its template's directory
        self._workdir = workdir
        self._spec = spec  # the spec of replacement N, with its workdir and the files it collects
        self.current: Replacement | None = None
        self.started = 0

    def submit(
        self, nodeid: str, next_nodeid: str | None, testsfailed: int, targets: Callable[[], list[str]]
    ) -> tuple[DelegatedTest, ReplacementStarted | None]:
        """Hand the test to the current replacement, started first (collecting ``targets()``)
        if there is none; ``next_nodeid`` and ``testsfailed`` as in the module docstring."""
        started = None
        said: list[dict[str, Any]] = []
        if self.current is None or self.current.ended:
            started, said = self._start(targets())
        assert self.current is not None
        test = DelegatedTest(self.current, said)
        if not self.current.ended:
            request = {"nodeid": nodeid, "next": next_nodeid, "testsfailed": testsfailed}
            try:
                self.current.channel.sendall((json.dumps(request) + "\n").encode())
            except OSError:  # it ended meanwhile: wait() reads its end
                pass
        return test, started

    def _start(self, targets: list[str]) -> tuple[ReplacementStarted, list[dict[str, Any]]]:
        launcher, template_dir = self._launcher()
        self.started += 1
        workdir = self._workdir("tfmem-replacement")
        spec = self._spec(self.started, workdir, targets)
        began = time.monotonic()
        process, channel, method = launcher.start_replacement(spec, workdir, template_dir)
        self.current = Replacement(process, channel, Path(spec.output))
        said = self.current.wait_ready()
        seconds = round(time.monotonic() - began, 3)
        return ReplacementStarted(self.started, process.pid, spec.worker, seconds, method), said

    def finished(self, test: DelegatedTest) -> None:
        """After the test: a replacement that crossed the limit ends (waited for, so that its
        memory is free before the next one grows)."""
        if test.full and self.current is test.replacement:
            self.current.close()
            self.current = None

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None


def remaining_targets(items: Sequence[pytest.Item], index: int | None) -> list[str]:
    """The files of the tests from ``index`` on (all of them when it is unknown), once each."""
    return list(dict.fromkeys(str(item.path) for item in items[index or 0 :]))
