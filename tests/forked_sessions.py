"""Inner pytest sessions forked from a process that has imported TensorFlow.

Importing TensorFlow took 3 to 6 s of each inner session that used it, on this suite's 2-core
machines, before the session ran a test. A test marked ``forked_sessions`` has its pytester's
``python -m pytest`` runs (``runpytest_subprocess``, ``run``) forked from one process per
worker that imported it once (``session_zygote.py``), as the plugin's isolation forks its
children from a template. Such a session reads as a fresh one, except that TensorFlow and Keras
are imported before it starts: tests of what a first import costs, of what a session imports, or of
TensorFlow's start-up output stay in fresh interpreters, unmarked. A run whose environment sets
something that TensorFlow or Keras reads when imported (``TF_*``, ``KERAS_BACKEND``...)
differently from the forking process is started fresh, as pytester would start it.
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
READ_AT_START = ("TF_", "KERAS_", "XLA_", "JAX_", "CUDA", "OMP_", "MKL", "LD_", "MALLOC_", "GLIBC_", "PYTHON")
START_TIMEOUT_S = 300.0


def read_at_start(environment: Mapping[str, str]) -> dict[str, str]:
    return {
        name: value for name, value in environment.items() if name.startswith(READ_AT_START) and name != "PYTHONPATH"
    }


class Zygote:
    """The forking process: started at the first request, ended by ``close``."""

    def __init__(self, environment: Mapping[str, str]) -> None:
        self.environment = dict(environment)
        self._process: subprocess.Popen[bytes] | None = None
        self._pending = b""
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115  # the forking process's stderr, closed by close()
        self._running: ForkedSession | None = None

    def serves(self, environment: Mapping[str, str]) -> bool:
        """Whether a session in ``environment`` would start as the forked one does."""
        return read_at_start(environment) == read_at_start(self.environment)

    def start(self, request: dict[str, Any]) -> ForkedSession:
        """Fork a session for ``request``; one at a time, each waited for before the next."""
        if self._running is not None:
            raise RuntimeError(f"a forked session is still running: {self._running.args}")
        process = self._started()
        assert process.stdin is not None
        process.stdin.write(json.dumps(request).encode() + b"\n")
        process.stdin.flush()
        self._running = ForkedSession(self, self._reply(START_TIMEOUT_S)["pid"], request["argv"])
        return self._running

    def exit_status(self, timeout: float | None) -> int:
        """The running session's exit status, once it ends; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        status = self._reply(timeout)["exit"]
        self._running = None
        return status

    def _started(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            self._pending = b""
            self._process = subprocess.Popen(
                [sys.executable, str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._errors,
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


def forking_popen(pytester: pytest.Pytester, zygote: Zygote) -> Callable[..., Any]:
    """``pytester.popen``, forking ``python -m pytest`` runs from ``zygote`` where it can."""
    real_popen = pytester.popen

    def popen(cmdargs: Sequence[Any], stdout: Any = subprocess.PIPE, stderr: Any = subprocess.PIPE,
              stdin: Any = pytester.CLOSE_STDIN, **options: Any) -> Any:  # fmt: skip
        arguments = pytest_arguments([os.fspath(argument) for argument in cmdargs])
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), environment.get("PYTHONPATH", "")]))
        to_files = all(isinstance(getattr(stream, "name", None), str) for stream in (stdout, stderr))
        forkable = arguments is not None and not options and stdin is pytester.CLOSE_STDIN and to_files
        if not forkable or not zygote.serves(environment):
            return real_popen(cmdargs, stdout=stdout, stderr=stderr, stdin=stdin, **options)
        return zygote.start({"argv": arguments, "cwd": os.getcwd(), "env": environment,
                             "stdout": stdout.name, "stderr": stderr.name})  # fmt: skip

    return popen
