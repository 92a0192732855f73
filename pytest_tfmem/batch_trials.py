"""Where ``find_max_batch_size``'s trials run: forks of one fresh interpreter, or fresh interpreters.

A trial must start as a fresh interpreter would that imported the step's modules and never ran a
step: an earlier trial's pooled allocator memory, traced functions or leaks must not lower or
raise its figure. Spawning an interpreter per trial gives that, and pays TensorFlow's import
(seconds) in every trial. So the search spawns one *trial server*: a fresh interpreter that
unpickles the step and the set-up (importing their modules, never starting a framework's
runtime), notes the library pages it has in memory, and forks one process per trial. Each fork
maps those pages again before its set-up (``platforms.file_pages``: Linux maps a fork's file
pages anew as it touches them, which a fresh interpreter would not count), then runs the trial as
a spawned one does. Where the platform does not fork, or importing the step's modules started a
framework's runtime (its threads do not survive a fork), each trial is spawned instead.

Seen from the test that runs the search, the server and a fork are two processes that share
most of their pages. Each fork tells its size as it starts, the pages it maps again included,
into a page the test's child watch reads (``fork_sizes``, ``children.also_told``): what the test's
process tree counts of the fork is what it grew above that, as for any fork copy.

The server talks to the search on a ``SOCK_SEQPACKET`` socket, one JSON message a packet:
``ready`` (``reason`` why it will not fork, or none), then per request ``forked`` (the fork's
pid, with the read end of the fork's result pipe passed beside it) and ``exited`` (its exit
status, negative for a signal). The fork sends its results on that pipe, so a fork killed
mid-message leaves nothing on the server's socket.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

from pytest_tfmem import frameworks, platforms
from pytest_tfmem.core.measure import Monitor
from pytest_tfmem.platforms.file_pages import FilePages
from pytest_tfmem.platforms.fork_sizes import ForkSizes
from pytest_tfmem.probes import children, host

# Exception class names that mean "this batch did not fit" rather than "the step is broken".
OUT_OF_MEMORY = {"MemoryError", "ResourceExhaustedError", "OutOfMemoryError"}
_MAX_MESSAGE = 2**16
_SERVER_EXIT_S = 10


def run_trial(connection: Connection, step: Callable[[int], object], setup: Callable[[], object] | None,
              batch_size: int) -> None:
    """Runs in the trial's process: set up, open the window, run the step, send the measurement."""
    try:
        if setup is not None:
            setup()
        for framework in frameworks.loaded():
            framework.start_runtime()  # the runtime's start-up is not the step's memory
    except BaseException:
        connection.send(("setup failed", traceback.format_exc()))
        return
    monitor = Monitor().start()
    connection.send(("started", host.current_rss()))
    try:
        step(batch_size)
    except BaseException as error:
        names = {cls.__name__ for cls in type(error).__mro__}
        connection.send(("raised", monitor.stop().to_dict(), bool(names & OUT_OF_MEMORY),
                         f"{type(error).__name__}: {error}", traceback.format_exc()))
        return
    connection.send(("done", monitor.stop().to_dict()))


class ForkedTrial:
    """A trial forked by the server, with ``multiprocessing.Process``'s ways to wait for it: the
    fork is the server's child, and the server says when it ended."""

    def __init__(self, channel: socket.socket, pid: int) -> None:
        self._channel = channel
        self.pid = pid
        self.exitcode: int | None = None

    def _read_exit(self, timeout: float | None) -> None:
        if self.exitcode is not None:
            return
        self._channel.settimeout(timeout)
        try:
            packet = self._channel.recv(_MAX_MESSAGE)
        except (TimeoutError, BlockingIOError):
            return
        finally:
            self._channel.settimeout(None)
        # the server gone says no more: the fork died with it (``die_with_parent``)
        self.exitcode = json.loads(packet)["exitcode"] if packet else platforms.current().killed_returncode

    def is_alive(self) -> bool:
        self._read_exit(0)
        return self.exitcode is None

    def join(self) -> None:
        self._read_exit(None)

    def kill(self) -> None:
        platforms.current().kill(self.pid)


class TrialServer:
    """One fresh interpreter that imported the step's modules and forks a process per trial.

    ``refusal`` says why it does not fork (each trial is then spawned), or is ``None``."""

    def __init__(self, step: Callable[[int], object], setup: Callable[[], object] | None) -> None:
        self._step, self._setup = step, setup
        self._folder = tempfile.TemporaryDirectory(prefix="tfmem-batch-trials-")
        told_path = str(Path(self._folder.name) / "fork-sizes")
        self._told = contextlib.ExitStack()
        self._told.enter_context(children.also_told(ForkSizes(platforms.current().current_size, told_path)))
        self._channel, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        context = multiprocessing.get_context("spawn")
        self._process = context.Process(target=_serve, args=(server_end, step, setup, os.getpid(), told_path),
                                        name="tfmem-batch-trials", daemon=True)
        self._process.start()
        server_end.close()
        packet = self._channel.recv(_MAX_MESSAGE)
        # a server that could not unpickle the step ends without a word: spawned trials say why
        self.refusal: str | None = json.loads(packet)["reason"] if packet else "the trial server ended"

    @property
    def processes(self) -> str:
        """Where the trials run, in words (``BatchSizeReport.processes``)."""
        if self.refusal is None:
            return "forks of one interpreter that imported the step's modules"
        return f"a fresh interpreter each ({self.refusal})"

    def start(self, batch_size: int) -> tuple[Any, Connection]:
        """Start a trial of ``batch_size``, forked or spawned: its process (``multiprocessing.Process``'s
        ways to wait for it), and the connection its results come on."""
        if self.refusal is None:
            return self._fork(batch_size)
        context = multiprocessing.get_context("spawn")
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(target=run_trial, args=(sender, self._step, self._setup, batch_size),
                                  name=f"tfmem-batch-{batch_size}", daemon=True)
        process.start()
        sender.close()
        return process, receiver

    def _fork(self, batch_size: int) -> tuple[ForkedTrial, Connection]:
        self._channel.send(json.dumps({"batch_size": batch_size}).encode())
        packet, descriptors, _, _ = socket.recv_fds(self._channel, _MAX_MESSAGE, 1)
        if not packet or not descriptors:
            reason = json.loads(packet)["error"] if packet else "the trial server ended"
            raise RuntimeError(f"find_max_batch_size: no trial process for batch size {batch_size}: {reason}")
        return ForkedTrial(self._channel, json.loads(packet)["pid"]), Connection(descriptors[0], writable=False)

    def close(self) -> None:
        """End the server (it reads the end of its channel) and drop the told sizes."""
        self._channel.close()
        self._process.join(timeout=_SERVER_EXIT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._told.close()
        self._folder.cleanup()


def _serve(channel: socket.socket, step: Callable[[int], object], setup: Callable[[], object] | None,
           parent_pid: int, told_path: str) -> None:
    """The server's main: the interpreter's own exit would go through every object of the modules
    it imported (TensorFlow's: more than a second) for nothing."""
    _run_then_exit(_answer, channel, step, setup, parent_pid, told_path)


def _run_then_exit(main: Callable[..., object], *args: object) -> NoReturn:
    """Run ``main(*args)`` and end the process with ``os._exit``: status 1, its traceback printed,
    where it raised."""
    code = 0
    try:
        main(*args)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _answer(channel: socket.socket, step: Callable[[int], object], setup: Callable[[], object] | None,
            parent_pid: int, told_path: str) -> None:
    """Answer ``ready``, then fork a trial per request until the channel closes."""
    platform = platforms.current()
    platform.die_with_parent(parent_pid)
    refusal = platform.fork_missing() or frameworks.runtime_refusal("as the step's modules were imported")
    channel.send(json.dumps({"reason": refusal}).encode())
    if refusal is not None:
        return
    file_pages = platform.resident_file_pages()
    told = ForkSizes(platform.current_size, told_path)
    while True:
        request = channel.recv(_MAX_MESSAGE)
        if not request:
            return
        results_read, results_write = os.pipe()
        shared = platform.current_size()  # the fork starts with all of it, once it maps the file pages again
        try:
            pid = platform.fork()
        except OSError as error:
            os.close(results_read)
            os.close(results_write)
            channel.send(json.dumps({"error": str(error)}).encode())
            continue
        if pid == 0:
            os.close(results_read)
            channel.close()
            told.tell(shared)
            _run_then_exit(_trial_fork, file_pages, Connection(results_write, readable=False), step, setup,
                           json.loads(request)["batch_size"])
        os.close(results_write)
        socket.send_fds(channel, [json.dumps({"pid": pid}).encode()], [results_read])
        os.close(results_read)
        _, status = os.waitpid(pid, 0)
        channel.send(json.dumps({"exitcode": os.waitstatus_to_exitcode(status)}).encode())


def _trial_fork(file_pages: FilePages, results: Connection, step: Callable[[int], object],
                setup: Callable[[], object] | None, batch_size: int) -> None:
    """The fork's life: its library pages mapped again, then one trial."""
    file_pages.map_again()
    run_trial(results, step, setup, batch_size)
