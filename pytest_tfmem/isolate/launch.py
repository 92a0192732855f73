"""Starting the process of an isolated test: a fork of the session's template, or a fresh interpreter.

``fork`` (the default): a session (each pytest-xdist worker) that will isolate a test starts
the template (``template.py``), which has pytest, the plugins, the initial ``conftest.py``
files and the heavy modules the session uses loaded; each isolated test then runs in a fork
of it, in a fraction of a second instead of an interpreter's start-up plus TensorFlow's
import. The template is itself a fork of the session, made before the first test, while
TensorFlow's runtime has not started here (it then costs no import at all); otherwise (a test
module that ran TensorFlow ops when it was imported) it is a fresh interpreter that imports
them, started at the first isolated test.
The template also forks the session's replacement processes (``replacement.py``, with
``--tfmem-session-limit``), side by side with isolated tests.
``spawn``: a fresh interpreter per test (``child.py``) and per replacement process, as chosen by
``--tfmem-isolate-start=spawn``, or where forking is not available or not safe (TensorFlow's
runtime started in the template, the template failed to start); the reason is given once.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from pytest_tfmem import platforms
from pytest_tfmem.core import pytest_internals
from pytest_tfmem.core.subsession import output_excerpt
from pytest_tfmem.isolate.channel import ChannelError, ChannelListener
from pytest_tfmem.isolate.child import ChildSpec
from pytest_tfmem.isolate.replacement import ReplacementSpec
from pytest_tfmem.isolate.template import MAX_MESSAGE, TemplateSpec, fork_unsafe_reason
from pytest_tfmem.probes.watchdog import ChildProcess

FORK = "fork"
SPAWN = "spawn"
START_METHODS = (FORK, SPAWN)
# Modules the template imports first when the session has them: what makes a fresh interpreter slow.
PREIMPORTED = ("numpy", "tensorflow", "keras", "tf_keras")
_TEMPLATE_EXIT_S = 10.0
CONNECT_BACK_S = 120.0  # a spawned replacement connects back once its interpreter started and imported us


def parse_start(value: object, what: str) -> str:
    text = str(value).strip().lower()
    if text not in START_METHODS:
        raise ValueError(f"invalid {what} {value!r}: expected one of {', '.join(START_METHODS)}")
    return text


class TemplateFailed(Exception):
    """The template cannot fork (the reason is the message)."""


class SessionFork:
    """The template as a fork of this process, behind the part of ``subprocess.Popen`` the
    session uses (``pid``, ``poll``, ``wait``, ``kill``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"template {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            platforms.current().kill(self.pid)


def fork_session(spec_path: Path, log: int, cwd: Path, close: socket.socket) -> SessionFork:
    """Fork this process into a template that runs ``template.main([spec_path])``, its output
    going to the file descriptor ``log``; ``close`` is the session's end of their channel.

    The fork never returns into the session's code: whatever happens, it ends with ``os._exit``.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    file_pages = platforms.current().resident_file_pages()
    with warnings.catch_warnings():  # Python 3.12+ warns of forking with threads; none run Python in the fork
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = platforms.current().fork()
    if pid:
        return SessionFork(pid)
    code = 1
    try:
        file_pages.map_again()  # the session's libraries, as it has them: the template's forks map them again in turn
        close.close()  # else the template would hold its own channel open and never see it end
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.close(stdin)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
        os.chdir(cwd)
        # The session's pytest logging handlers (its log file, live logging) are not the template's.
        for handler in list(logging.root.handlers):
            if pytest_internals.is_pytest_logging_handler(handler):
                logging.root.removeHandler(handler)
        from pytest_tfmem.isolate.template import main as template_main

        code = template_main([str(spec_path)])
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


class Template:
    """The session's side of a running template."""

    def __init__(
        self, workdir: Path, spec_args: list[str], cwd: Path, session: dict[str, Any], template_pids: set[int]
    ) -> None:
        self.template_pids = template_pids  # the session's: its process tree's readings leave templates out
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        spec = TemplateSpec(
            args=spec_args,
            basetemp=str(workdir / "basetemp"),
            parent_pid=os.getpid(),
            channel_fd=theirs.fileno(),
            session=session,
            preimport=[name for name in PREIMPORTED if name in sys.modules],
        )
        spec.write(workdir / "template.json")
        self.log = workdir / "template.log"
        self.started = time.monotonic()
        # Forking this process costs no imports; once TensorFlow's runtime started here it is
        # not safe, and a fresh interpreter imports what the session uses without starting it.
        self.process: subprocess.Popen[bytes] | SessionFork
        with open(self.log, "wb") as output:
            if fork_unsafe_reason() is None:
                self.process = fork_session(workdir / "template.json", output.fileno(), cwd, ours)
            else:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "pytest_tfmem.isolate.template", str(workdir / "template.json")],
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),),
                )
        theirs.close()
        self.template_pids.add(self.process.pid)
        self.channel = ours
        self.ready: dict[str, Any] = {}
        self._exited: dict[int, int] = {}  # exit statuses of forks nobody waited for yet

    def _receive(self) -> dict[str, Any] | None:
        """The template's next message (a fork's end is also kept for ``exit_status``)."""
        message = self.channel.recv(MAX_MESSAGE)
        if not message:
            return None
        answer: dict[str, Any] = json.loads(message)
        if answer["event"] == "exited":
            self._exited[answer["pid"]] = int(answer["returncode"])
        return answer

    def _answer(self) -> dict[str, Any] | None:
        """The template's next answer other than a fork's end."""
        while (answer := self._receive()) is not None and answer["event"] == "exited":
            pass
        return answer

    def wait_ready(self) -> None:
        """Block until the template can fork; raise ``TemplateFailed`` if it cannot."""
        try:
            answer = self._answer()
        except BaseException:
            self.close()
            raise
        if answer is None or not answer["fork"]:
            self.close()
            self.ready = {}
            reason = answer["reason"] if answer else "the template process ended before it was ready"
            if answer is None or answer["reason"].startswith("the template's pytest run ended"):
                reason += f"; the end of its output ({self.log}):\n{output_excerpt(self.log, 10)}"
            raise TemplateFailed(reason)
        self.ready = answer
        self.ready["start_s"] = round(time.monotonic() - self.started, 3)

    @property
    def is_ready(self) -> bool:
        return bool(self.ready)

    def fork(self, spec: ChildSpec) -> ForkedChild:
        """A fork that runs ``spec``'s test."""
        return self._fork({"test": asdict(spec)}, [])

    def fork_replacement(self, spec: ReplacementSpec, channel: socket.socket) -> ForkedChild:
        """A fork that becomes a replacement process, ``channel`` its end of the session's socket."""
        return self._fork({"replacement": asdict(spec)}, [channel.fileno()])

    def _fork(self, request: dict[str, Any], descriptors: list[int]) -> ForkedChild:
        try:
            socket.send_fds(self.channel, [json.dumps(request).encode()], descriptors)
            answer = self._answer()
        except OSError as error:
            answer = {"event": "fork_failed", "error": f"the template process is gone ({error})"}
        if answer is None or answer["event"] != "forked":
            reason = answer["error"] if answer else "the template process is gone"
            raise TemplateFailed(f"fork failed: {reason}")
        return ForkedChild(self, answer["pid"])

    def exit_status(self, pid: int) -> int:
        """The exit status the template reports for its fork ``pid`` (waits for it)."""
        while pid not in self._exited:
            if self._receive() is None:  # the template died; the fork died with it (``die_with_parent``)
                return platforms.current().killed_returncode
        return self._exited.pop(pid)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """Close the channel: the template ends."""
        self.channel.close()
        try:
            self.process.wait(timeout=_TEMPLATE_EXIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.template_pids.discard(self.process.pid)


class ForkedChild:
    """A fork of the template running one test, seen from the session (``ChildProcess``)."""

    def __init__(self, template: Template, pid: int) -> None:
        self.template = template
        self.pid = pid
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = self.template.exit_status(self.pid)
        return self.returncode


class Launcher:
    """Starts isolated tests' processes: forks of a template, or fresh interpreters."""

    def __init__(
        self, method: str, args: list[str], cwd: Path, session: dict[str, Any], template_pids: set[int]
    ) -> None:
        fork_missing = platforms.current().fork_missing()
        self.method = method if fork_missing is None else SPAWN
        self.template_pids = template_pids
        self.args = args
        self.cwd = cwd
        self.session = session  # the session the isolated tests serve (``processes.Session``)
        self.template: Template | None = None
        self.fallback: str | None = None  # why tests are spawned although fork was asked for
        if method == FORK and self.method == SPAWN:
            self.fallback = fork_missing

    def spawn_instead(self, reason: str) -> None:
        """Start every process as a fresh interpreter: ``reason`` says why no template could fork."""
        if self.method == FORK:
            self.method, self.fallback = SPAWN, reason

    def prepare(self, template_dir: Path) -> None:
        """Start the template now (before the session's first test), without waiting for it."""
        if self.method == FORK and self.template is None:
            try:
                self.template = Template(template_dir, self.args, self.cwd, self.session, self.template_pids)
            except OSError as error:  # no fork or process to be had
                self.method, self.fallback = SPAWN, f"the template could not start: {error}"

    def start(self, spec: ChildSpec, workdir: Path, template_dir: Path) -> ChildProcess:
        """Start ``spec``'s process, writing its output to ``workdir / "output.log"``."""
        output = workdir / "output.log"
        forked = self._from_template(lambda template: template.fork(replace(spec, output=str(output))), template_dir)
        if forked is not None:
            return forked
        with open(output, "wb") as stream:
            return subprocess.Popen(
                [sys.executable, "-m", "pytest_tfmem.isolate.child", _write_spec(spec, workdir)],
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=stream,
                stderr=subprocess.STDOUT,
            )

    def start_replacement(
        self, spec: ReplacementSpec, workdir: Path, template_dir: Path
    ) -> tuple[ChildProcess, socket.socket, str]:
        """Start a replacement process (a fork of the template, or a fresh interpreter as for
        isolated tests); return it, the session's end of its channel and how it started."""
        ours, theirs = socket.socketpair()
        try:
            forked = self._from_template(lambda template: template.fork_replacement(spec, theirs), template_dir)
        finally:
            theirs.close()
        if forked is not None:
            return forked, ours, FORK
        ours.close()
        if platforms.current().passes_descriptors:
            ours, theirs = socket.socketpair()
            try:
                return self._spawn_replacement(replace(spec, channel_fd=theirs.fileno()), workdir, theirs), ours, SPAWN
            finally:
                theirs.close()
        listener = ChannelListener()  # the process cannot inherit a socket: it connects back
        process = self._spawn_replacement(replace(spec, channel_port=listener.port, channel_token=listener.token),
                                          workdir)
        try:
            channel = listener.accept(lambda: process.poll() is None, CONNECT_BACK_S)
        except ChannelError:  # it ended (or hangs) before it connected: a channel that reads as its end
            process.kill()
            process.wait()
            channel, never_connected = socket.socketpair()
            never_connected.close()
        return process, channel, SPAWN

    def _spawn_replacement(
        self, spec: ReplacementSpec, workdir: Path, channel: socket.socket | None = None
    ) -> subprocess.Popen[bytes]:
        spec.write(workdir / "replacement.json")
        with open(spec.output, "wb") as stream:
            return subprocess.Popen(
                [sys.executable, "-m", "pytest_tfmem.isolate.replacement", str(workdir / "replacement.json")],
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=stream,
                stderr=subprocess.STDOUT,
                pass_fds=(channel.fileno(),) if channel is not None else (),
            )

    def _from_template(self, fork: Callable[[Template], ForkedChild], template_dir: Path) -> ForkedChild | None:
        """``fork(template)``, where tests start as forks of a template that can still fork;
        ``None`` otherwise (a failure switches this launcher to fresh interpreters; ``fallback``
        says why, and the caller reports it once)."""
        if self.method != FORK:
            return None
        try:
            if self.template is not None and self.template.is_ready and not self.template.alive:
                self.template = None  # it served tests and died since: start another
            self.prepare(template_dir)
            if self.template is not None:
                if not self.template.is_ready:
                    self.template.wait_ready()
                return fork(self.template)
        except TemplateFailed as error:
            self.method, self.fallback, self.template = SPAWN, str(error), None
        return None

    def close(self) -> None:
        if self.template is not None:
            self.template.close()
            self.template = None


def _write_spec(spec: ChildSpec, workdir: Path) -> str:
    path = workdir / "spec.json"
    spec.write(path)
    return str(path)
