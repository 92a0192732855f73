"""The template: ``main(["SPEC.json"])``, forked once per isolated test (and per replacement process).

The session (``launch.py``) starts one template when a test will be isolated (one per
pytest-xdist worker): before its first test, a fork of the session that calls ``main``; or,
where TensorFlow's runtime started in the session, at the first isolated test, ``python -m
pytest_tfmem.isolate.template SPEC.json``. The template runs ``pytest.main`` with the session's own arguments, as a
spawned child does (``child.py``), so the rootdir, ini file, initial ``conftest.py`` files,
plugins and options are the session's; ``pytest_configure`` and ``pytest_sessionstart`` run.
In a fork of the session, the modules the session imported (``conftest.py`` files, test
modules, TensorFlow) are imported already, and are not run again.
Where pytest would collect, the template imports the heavy modules the session uses
(TensorFlow, Keras; never starting TensorFlow's runtime), freezes its objects out of the
garbage collector (so collections in the forks do not copy its pages), notes the library pages
it has in memory (each fork maps them again before its test: ``platforms.file_pages``), says it is ready,
and serves requests: for each it forks; the fork becomes that test's process and
continues the pytest run from there (collection narrowed to the test, its runtest protocol,
session finish), or the session's replacement process (``replacement.py``: collection of the
files of the tests that remain, then those tests one by one as the session asks), and ends
with ``os._exit``. Forks run side by side; the template reaps each as it ends and reports
its exit status: the fork is its child, not the session's. Only where the platform forks
(``platforms``: Linux); elsewhere isolated tests and replacement processes are spawned.

Requests and answers are JSON messages, one per ``send``, on a ``SOCK_SEQPACKET`` socket the
session passed down (``channel_fd``). Requests: ``{"test": ChildSpec}``, or ``{"replacement":
ReplacementSpec}`` with the replacement's own channel passed beside it (``SCM_RIGHTS``).
Answers: ``ready`` (``fork`` true, or false with the ``reason`` forking is not safe),
``forked`` (the fork's pid), ``fork_failed`` and ``exited`` (a fork's pid and exit status,
negative for a signal; whenever a fork ends). The template ends when the session closes the
socket, and dies with the session.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_tfmem import frameworks, platforms
from pytest_tfmem.core import pytest_internals
from pytest_tfmem.core.manager import manager
from pytest_tfmem.core.subsession import die_with_parent
from pytest_tfmem.isolate.child import ChildRun, ChildSpec, single_test_options
from pytest_tfmem.isolate.replacement import ReplacementRun, ReplacementSpec
from pytest_tfmem.platforms.file_pages import FilePages

EXIT_NOT_FORKED = 3  # a fork that ended outside pytest's own exit path


@dataclass(frozen=True)
class TemplateSpec:
    """What the session asks of its template."""

    args: list[str]  # the session's command-line arguments
    basetemp: str  # the template's own --basetemp (each fork gets a fresh one)
    parent_pid: int  # the template dies with this process
    channel_fd: int  # the socket to the session, inherited
    session: dict[str, Any]  # the session it serves (``processes.Session.to_dict()``)
    preimport: list[str] = field(default_factory=list)  # modules to import before forking

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> TemplateSpec:
        return cls(**json.loads(path.read_text()))



def fork_unsafe_reason() -> str | None:
    """Why forking this process is not safe, or ``None``."""
    return platforms.current().fork_missing() or frameworks.runtime_refusal(
        "while pytest configured (by a conftest.py file or a plugin)"
    )


# The largest request or answer on the channel: one message each (SOCK_SEQPACKET).
MAX_MESSAGE = 2**20


def send(channel: socket.socket, message: dict[str, Any]) -> None:
    channel.send(json.dumps(message).encode())


class TemplateRun:
    """The plugin that holds the template's pytest run at collection and forks it per test."""

    def __init__(self, spec: TemplateSpec) -> None:
        self.spec = spec
        self.channel = socket.socket(fileno=spec.channel_fd)
        self.pid = os.getpid()
        self.forked = False  # this process is a fork that runs tests for the session
        self.collect_cost = 0.0  # seconds of the full collection before forking
        self.file_pages = FilePages()  # what a fork maps again before its test: the template's libraries
        self.exitstatus = 0

    @pytest.hookimpl(tryfirst=True)  # before pytest's own main, which runs the session
    def pytest_cmdline_main(self, config: pytest.Config) -> None:
        single_test_options(config, self.spec.session, self.spec.basetemp)

    @pytest.hookimpl(tryfirst=True)  # before pytest's own collection, which only a fork goes on to
    def pytest_collection(self, session: pytest.Session) -> None:
        """Serve fork requests; return (to pytest's own collection) only in a fork.

        The template itself never goes on to the rest of a pytest session (the session's
        finish hooks are not its to run): it ends here, quietly once the session has closed the
        channel, with the error in its log otherwise."""
        try:
            self._serve(session.config)
        except BaseException as error:
            if self.forked:
                raise
            if not isinstance(error, OSError):  # not the channel closing under it
                traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0 if isinstance(error, OSError) else 1)

    def _serve(self, config: pytest.Config) -> None:
        # Ctrl-C reaches the whole process group: the session stops its tests' forks, and the
        # template must stay to report those forks' end.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        problems = []
        for name in self.spec.preimport:
            try:
                importlib.import_module(name)
            except Exception as error:  # the fork imports it again and reports the error
                problems.append(f"import {name}: {error!r}")
        reason = fork_unsafe_reason()
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        self.collect_cost = time.perf_counter() - started
        send(self.channel, {"event": "ready", "pid": self.pid, "fork": reason is None, "reason": reason,
                            "problems": problems})
        if reason is not None:
            self._serve_nothing()
        self.file_pages = platforms.current().resident_file_pages()  # read where forks will follow
        reaper = platforms.current().fork_reaper()
        selector = selectors.DefaultSelector()
        selector.register(self.channel, selectors.EVENT_READ)
        selector.register(reaper.wakeup, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj == reaper.wakeup:
                    for pid, returncode in reaper.reap():
                        send(self.channel, {"event": "exited", "pid": pid, "returncode": returncode})
                    continue
                message, descriptors, _, _ = socket.recv_fds(self.channel, MAX_MESSAGE, 1)
                if not message:
                    os._exit(0)  # the session closed the channel: nothing of this run is worth finishing
                request = json.loads(message)
                sys.stdout.flush()
                sys.stderr.flush()
                try:
                    pid = platforms.current().fork()
                except OSError as error:
                    send(self.channel, {"event": "fork_failed", "error": str(error)})
                    continue
                if pid == 0:
                    selector.close()
                    reaper.leave()
                    self._become_test_process(config, request, descriptors)
                    return
                reaper.forks.add(pid)
                for descriptor in descriptors:  # the fork's now
                    os.close(descriptor)
                send(self.channel, {"event": "forked", "pid": pid})

    def pytest_sessionfinish(self, exitstatus: int) -> None:
        self.exitstatus = int(exitstatus)

    @pytest.hookimpl(trylast=True)  # after every other plugin's (pytest's own included) unconfigure
    def pytest_unconfigure(self) -> None:
        """A fork ends once its session is finished and configured away: what pytest would
        do next (collect all garbage five times over, run the template's exit handlers) only
        costs time."""
        if self.forked:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.exitstatus)

    def _serve_nothing(self) -> None:
        while self.channel.recv(MAX_MESSAGE):  # until the session closes the channel
            pass
        os._exit(0)

    def _become_test_process(self, config: pytest.Config, request: dict[str, Any], descriptors: list[int]) -> None:
        """In the fork: leave the template's channel and output, and become the process of the
        test (``request["test"]``, a ``ChildSpec``) or the replacement process
        (``request["replacement"]``, a ``ReplacementSpec``; its channel is ``descriptors[0]``)."""
        self.forked = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a spawned child
        self.channel.close()
        die_with_parent(self.pid)
        self.file_pages.map_again()  # as the template had them: the test counts none of them
        spec: ChildSpec | ReplacementSpec
        if "test" in request:
            spec = ChildSpec(**request["test"])
            targets = [spec.target]
        else:
            spec = ReplacementSpec(**{**request["replacement"], "channel_fd": descriptors[0]})
            targets = spec.targets
        assert spec.output is not None
        redirect_output(config, spec.output)
        single_test_options(config, spec.session, spec.basetemp)
        pytest_internals.move_basetemp(config, Path(os.path.abspath(spec.basetemp)))
        config.args = targets
        manager(config).collector.assume_full(self.collect_cost)
        if isinstance(spec, ChildSpec):
            run = ChildRun(spec)
            run.config = config
            config.pluginmanager.register(run, "tfmem-isolated-test")
        else:
            ReplacementRun(spec).register(config)


def redirect_output(config: pytest.Config, path: str) -> None:
    """Send file descriptors 1 and 2 (and Python's fault reports) to ``path``, with pytest's
    output capture started again on them (its files were the template's)."""
    import faulthandler

    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        capture.stop_global_capturing()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)
    if faulthandler.is_enabled():  # on a descriptor of its own: fd 2 is a capture file during tests
        faulthandler.enable(file=os.dup(2))
    if capture is not None:
        capture.start_global_capturing()
        capture.suspend_global_capture()


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    spec = TemplateSpec.read(Path(arguments[0]))
    die_with_parent(spec.parent_pid)
    run = TemplateRun(spec)
    try:
        code = int(pytest.main(spec.args, plugins=[run]))
    except BaseException:
        if run.forked:
            os._exit(EXIT_NOT_FORKED)
        raise
    if run.forked:  # a fork that ran its test: no atexit handlers, no buffers of the template's
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    # pytest ended before it reached collection (a usage error, a broken conftest.py file)
    send(run.channel, {"event": "ready", "pid": os.getpid(), "fork": False,
                       "reason": f"the template's pytest run ended with exit code {code} before collection",
                       "problems": []})
    return code


if __name__ == "__main__":
    # Run the imported module's main, not this copy's (see child.py).
    from pytest_tfmem.isolate.template import main as template_main

    sys.exit(template_main())
