"""Helpers for the trace tests: one shared pytest run per module, and readers for what it wrote."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import forked_sessions
import pytest
from tensorboard.compat.proto import event_pb2
from tensorboard.util import tensor_util

from pytest_tfmem.trace import dirs as tracedirs


@dataclass
class TracedRun:
    """A pytest session run in a fresh interpreter, and its trace session directory."""

    directory: Path
    returncode: int
    output: str

    @property
    def root(self) -> Path:
        return self.directory / ".tfmem" / "traces"

    @property
    def session(self) -> Path:
        sessions = tracedirs.session_dirs(self.root)
        assert len(sessions) == 1, sessions
        return sessions[0]

    def traced(self) -> list[str]:
        return sorted(p.name for p in tracedirs.traced_tests(self.session))

    def summary(self, name: str) -> dict[str, Any]:
        return json.loads((self.session / name / "summary.json").read_text())

    def section(self, test_name: str) -> list[str]:
        """The ``tfmem trace`` report section of one failing test, as lines."""
        block = self.output.split(f"_ {test_name} _", 1)[1]
        lines = block.split(" tfmem trace ", 1)[1].splitlines()[1:]
        return lines[: next(i for i, line in enumerate(lines) if line.startswith("open it:")) + 1]


def run_pytest(directory: Path, files: dict[str, str], *args: str, timeout: float = 300,
               framework: bool = False) -> TracedRun:  # fmt: skip
    """Write ``files`` into ``directory`` and run ``python -m pytest`` there, in a session of its own
    (``forked_sessions.run``: forked from a process with TensorFlow imported where ``framework``,
    else with pytest alone).

    Used by module-scoped fixtures, so that several checks share one run (``pytester`` is
    function-scoped); the run is the same as ``pytester.runpytest_subprocess``'s.
    """
    (directory / "pytest.ini").write_text("[pytest]\n")
    for name, text in files.items():
        (directory / name).write_text(text)
    completed = forked_sessions.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=directory, timeout=timeout, env={**os.environ, "COLUMNS": "200"}, framework=framework,
    )
    return TracedRun(directory, completed.returncode, completed.stdout + completed.stderr)


def read_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Scalar series of the directory's event file, read record by record (TFRecord framing:
    length, its CRC, the ``Event`` proto, its CRC) without loading TensorFlow."""
    (path,) = directory.glob("events.out.tfevents.*")
    data, offset, series = path.read_bytes(), 0, {}
    while offset < len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
        offset += 12 + length + 4
        for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name:
                assert value.metadata.plugin_data.plugin_name == "scalars"
            series.setdefault(value.tag, []).append((event.step, float(tensor_util.make_ndarray(value.tensor))))
    return series


# A real TensorBoard on loopback, read through its data endpoints


def get(url: str) -> Any:
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
    return json.loads(body)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def tensorboard(logdir: Path, log: Path) -> Iterator[str]:
    """A real TensorBoard (with the profile plugin) on 127.0.0.1; stopped on exit."""
    port = free_port()
    with open(log, "wb") as output:
        server = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)],
            stdout=output, stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=15)


def wait_for(read: Any, ready: Any, what: str, log: Path, timeout: float = 120) -> Any:
    """Poll ``read()`` until ``ready(value)``; fail with the server's log after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = read()
            if ready(value):
                return value
        except OSError:  # not listening yet
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"TensorBoard did not show {what} within {timeout} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
