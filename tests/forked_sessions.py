"""Inner pytest sessions forked from a process that has imported what they would import first.

Importing TensorFlow took 3 to 6 s of each inner session that used it, on this suite's 2-core
machines, before the session ran a test (Keras on PyTorch, up to 13 s), and pytest with its
plugins about half of a trivial session's 0.5 to 0.6 s (``python -m
benchmarks.forked_session_start``). Such sessions fork from a process that imported them once
(``session_zygote.py``), as the plugin's isolation forks its children from a template: every
pytester ``python -m pytest`` run (``runpytest_subprocess``, ``run``) from one with pytest and
its plugins imported; in a test marked ``forked_sessions``, from one with the framework imported; elsewhere,
the runs a test makes with ``run`` here instead of ``subprocess.run`` (``framework=False``: pytest
alone). Such a session reads as a fresh one, except that the framework and pytest's plugins are
imported before it starts: tests of what a first import costs, of what a session imports, or of a
framework's start-up output are not marked. Each worker keeps one forking process per kind and
environment read at import (``TF_*``, ``KERAS_BACKEND``...), the three last used.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).with_name("session_zygote.py")
# Variables read once, when the interpreter starts or a framework is imported.
READ_AT_START = ("TF_", "KERAS_", "XLA_", "JAX_", "CUDA", "OMP_", "OPENBLAS_", "NPY_", "MKL", "LD_", "MALLOC_",
                 "GLIBC_", "PYTHON")
START_TIMEOUT_S = 300.0
KEPT_ZYGOTES = 3  # one with pytest alone, two with a framework's import (about 0.5 GiB each)
# Linux alone: macOS's and Windows' jobs start fresh interpreters (no fork on Windows; the forked
# child maps its parent's pages again through /proc, which macOS lacks).
FORKS = sys.platform.startswith("linux")


def forkable(environment: Mapping[str, str]) -> bool:
    """Whether a session in ``environment`` can fork: not where a folder on its ``PYTHONPATH`` holds
    a ``sitecustomize`` (or ``usercustomize``) module, which runs as an interpreter starts (the
    tests' simulated systems, a hidden extra), and so would not run in a fork."""
    folders = [folder for folder in environment.get("PYTHONPATH", "").split(os.pathsep) if folder]
    return FORKS and not any(
        Path(folder, f"{name}.py").is_file() for folder in folders for name in ("sitecustomize", "usercustomize")
    )


def read_at_start(environment: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environment`` that a session reads as it starts; ``KERAS_BACKEND`` unset is
    Keras's default, TensorFlow, as ``session_zygote.py`` takes it (the suite's ``KERAS_HOME`` holds no
    ``keras.json`` naming another), so a test that names it explicitly shares the suite's forking process."""
    values = {
        name: value for name, value in environment.items() if name.startswith(READ_AT_START) and name != "PYTHONPATH"
    }
    values.setdefault("KERAS_BACKEND", "tensorflow")
    return values


class Zygote:
    """The forking process: started at the first request, ended by ``close``."""

    def __init__(self, environment: Mapping[str, str], framework: bool) -> None:
        self.environment = dict(environment)
        self.framework = framework
        self._process: subprocess.Popen[bytes] | None = None
        self._pending = b""
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115  # the forking process's stderr, closed by close()
        self._running: ForkedSession | None = None

    def serves(self, environment: Mapping[str, str], framework: bool) -> bool:
        """Whether a session in ``environment`` would start as the forked one does."""
        return framework == self.framework and read_at_start(environment) == read_at_start(self.environment)

    def start(self, argv: Sequence[str], cwd: str, env: Mapping[str, str], stdout: str, stderr: str) -> ForkedSession:
        """Fork ``python -m pytest <argv>`` in ``cwd`` and ``env``, its streams appended to the files
        ``stdout`` and ``stderr``; one at a time, each waited for before the next."""
        if self._running is not None:
            raise RuntimeError(f"a forked session is still running: {self._running.args}")
        process = self._started()
        assert process.stdin is not None
        request = {"argv": list(argv), "cwd": cwd, "env": dict(env), "stdout": stdout, "stderr": stderr}
        process.stdin.write(json.dumps(request).encode() + b"\n")
        process.stdin.flush()
        self._running = ForkedSession(self, self._reply(START_TIMEOUT_S)["pid"], argv)
        return self._running

    def exit_status(self, timeout: float | None) -> int:
        """The running session's exit status, once it ends; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        status = self._reply(timeout)["exit"]
        self._running = None
        return status

    def _started(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            self._pending = b""
            command = [sys.executable, str(SCRIPT), *([] if self.framework else ["--pytest-only"])]
            self._process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errors,
                env=self.environment, cwd=tempfile.gettempdir(),
            )  # fmt: skip
            self._reply(START_TIMEOUT_S)
        return self._process

    def _reply(self, timeout: float | None) -> dict[str, int]:
        """The forking process's next line; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        assert self._process is not None and self._process.stdout is not None
        descriptor = self._process.stdout.fileno()
        while b"\n" not in self._pending:
            ready, _, _ = select.select([descriptor], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(str(SCRIPT), timeout or 0)
            chunk = os.read(descriptor, 4096)
            if not chunk:
                self._errors.seek(0)
                raise RuntimeError(f"the forking process ended: {self._errors.read().decode(errors='replace')[-3000:]}")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._errors.close()


class Zygotes:
    """This process's forking processes, one per kind and environment read at import, the last used
    kept; those of the suite's own environment (``keep_home``) are the last to go: a test with
    settings of its own (a backend, a TensorFlow variable) would otherwise end the forking process
    that most tests use, and the next of them would import its framework again (5 s here)."""

    def __init__(self) -> None:
        self._zygotes: list[Zygote] = []
        self._home: dict[str, str] | None = None

    def keep_home(self, environment: Mapping[str, str]) -> None:
        self._home = read_at_start(environment)

    def serving(self, environment: Mapping[str, str], framework: bool) -> Zygote:
        """A forking process whose sessions start as a fresh one in ``environment`` would,
        with the framework that ``KERAS_BACKEND`` names imported, or (not ``framework``) pytest alone."""
        for zygote in self._zygotes:
            if zygote.serves(environment, framework):
                self._zygotes.remove(zygote)
                break
        else:
            zygote = Zygote(environment, framework)
            if len(self._zygotes) == KEPT_ZYGOTES:
                away = [z for z in self._zygotes if read_at_start(z.environment) != self._home] or self._zygotes
                self._zygotes.remove(away[0])  # the least recently used
                away[0].close()
        self._zygotes.append(zygote)
        return zygote

    def close(self) -> None:
        while self._zygotes:
            self._zygotes.pop().close()


ZYGOTES = Zygotes()


class ForkedSession:
    """What ``pytester.run`` needs of a ``subprocess.Popen``, for a forked session."""

    stdin = None

    def __init__(self, zygote: Zygote, pid: int, argv: Sequence[str]) -> None:
        self.zygote = zygote
        self.pid = pid
        self.args = list(argv)
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.exit_status(timeout)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


def pytest_arguments(command: Sequence[str]) -> list[str] | None:
    """The arguments of a ``python -m pytest`` command line of this interpreter; None for another command."""
    if len(command) >= 2 and command[0] == sys.executable and command[1] == "-mpytest":
        return list(command[2:])
    if len(command) >= 3 and command[0] == sys.executable and command[1:3] == ["-m", "pytest"]:
        return list(command[3:])
    return None


def run(command: Sequence[str], *, cwd: str | os.PathLike[str], env: Mapping[str, str] | None = None,
        timeout: float | None = None, check: bool = False, merged: bool = False,
        framework: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``subprocess.run(command, capture_output=True, text=True, ...)``, a ``python -m pytest``
    command forked from a process with its framework imported, or (not ``framework``) pytest alone;
    ``merged``: its standard error written into its standard output, as ``stderr=subprocess.STDOUT``."""
    command = [os.fspath(argument) for argument in command]
    arguments = pytest_arguments(command)
    environment = dict(os.environ if env is None else env)
    if arguments is None or not forkable(environment):
        return subprocess.run(command, cwd=cwd, env=environment, stdout=subprocess.PIPE, text=True, timeout=timeout,
                              stderr=subprocess.STDOUT if merged else subprocess.PIPE, check=check)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tfmem-forked-") as folder:
        streams = (Path(folder, "stdout"), Path(folder, "stdout" if merged else "stderr"))
        for stream in streams:
            stream.touch()
        session = ZYGOTES.serving(environment, framework).start(
            arguments, os.path.abspath(cwd), environment, str(streams[0]), str(streams[1])
        )
        try:
            returncode = session.wait(timeout)
        except subprocess.TimeoutExpired:
            session.kill()
            session.wait()
            raise subprocess.TimeoutExpired(command, timeout or 0, *outputs(streams, merged)) from None
        completed = subprocess.CompletedProcess(command, returncode, *outputs(streams, merged))
    if check:
        completed.check_returncode()
    return completed


def outputs(streams: tuple[Path, Path], merged: bool) -> tuple[str, str | None]:
    """A finished session's standard output and error, as ``subprocess.run`` gives them."""
    return streams[0].read_text(), None if merged else streams[1].read_text()


def forking_popen(pytester: pytest.Pytester, framework: bool) -> Callable[..., Any]:
    """``pytester.popen``, forking ``python -m pytest`` runs where it can, from a process with
    the framework imported, or (not ``framework``) pytest alone."""
    real_popen = pytester.popen

    def popen(cmdargs: Sequence[Any], stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE,
              stdin: Any = pytester.CLOSE_STDIN, **options: Any) -> Any:  # fmt: skip
        arguments = pytest_arguments([os.fspath(argument) for argument in cmdargs])
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), environment.get("PYTHONPATH", "")]))
        to_files = all(isinstance(getattr(stream, "name", None), str) for stream in (stdout, stderr))
        if arguments is None or not forkable(environment) or options or stdin is not pytester.CLOSE_STDIN or not to_files:
            return real_popen(cmdargs, stdout=stdout, stderr=stderr, stdin=stdin, **options)
        return ZYGOTES.serving(environment, framework).start(arguments, os.getcwd(), environment, stdout.name, stderr.name)

    return popen
