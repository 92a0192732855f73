"""A process that has imported pytest or a framework, and forks one inner pytest session per request.

Run as a script by ``forked_sessions.Zygote``, its standard input carries one JSON request a line
(``argv``, ``cwd``, ``env``, ``stdout`` and ``stderr`` paths) and its standard output one JSON
line with the session's pid, then one with its exit status. The forked session is what
``python -m pytest`` in a fresh interpreter would be, with TensorFlow (and the Keras that it
imports) already in ``sys.modules``, or where ``KERAS_BACKEND`` names another backend, Keras and
that backend's framework (TensorFlow stays unimported); with ``--pytest-only``, only pytest, as
``python -m pytest`` imports it first: its streams, working directory, environment, ``sys.argv``
and ``sys.path`` are the request's, and its ``atexit`` functions run before it exits.

A forked child does not inherit its parent's page-table entries for the libraries' code and
read-only data: it would fault them in again as its first tests ran them, 450 MiB of resident
memory that a fresh process has before its first test, and the figures of the first tests would
grow by what they touched (a gate run's first test read +23 MiB retained). Each child maps again,
with ``MADV_POPULATE_READ`` (Linux 5.14), the file-backed pages that were resident here.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import struct
import sys
import traceback
from pathlib import Path

import pytest

if sys.argv[1:] != ["--pytest-only"]:
    import numpy  # noqa: F401

    if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
        import tensorflow  # noqa: F401
    else:
        import keras  # noqa: F401  # and the framework of its backend

# What the interpreter puts on sys.path after the script's own folder and PYTHONPATH's entries.
INSTALLED_PATH = [entry for entry in sys.path[1:] if entry not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
PYTEST_MAIN = str(Path(pytest.__file__).with_name("__main__.py"))
PAGE = os.sysconf("SC_PAGE_SIZE")
MADV_POPULATE_READ = 22
PRESENT = 1 << 63  # a /proc/self/pagemap entry's bit: the page is in memory


def resident_file_pages() -> list[tuple[int, int]]:
    """The (address, length) ranges of this process's file-backed mappings that are in memory."""
    ranges = []
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
        for line in maps:
            fields = line.split()
            if len(fields) < 6 or not fields[5].startswith("/"):
                continue
            start, end = (int(address, 16) for address in fields[0].split("-"))
            pagemap.seek(start // PAGE * 8)
            count = (end - start) // PAGE
            entries = struct.unpack(f"{count}Q", pagemap.read(count * 8))
            first = None
            for index, entry in enumerate((*entries, 0)):
                if entry & PRESENT and first is None:
                    first = index
                elif not entry & PRESENT and first is not None:
                    ranges.append((start + first * PAGE, (index - first) * PAGE))
                    first = None
    return ranges


def map_again(ranges: list[tuple[int, int]]) -> None:
    """In the forked child: fault in what was resident in the parent, as a fresh process has it."""
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for address, length in ranges:
        if madvise(address, length, MADV_POPULATE_READ) != 0:
            return  # an older kernel: the session reads as forked sessions did before


def run_session(request: dict, resident: list[tuple[int, int]]) -> None:
    """In the forked child: become ``python -m pytest <argv>`` and exit with its status."""
    code = 1
    try:
        map_again(resident)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        for descriptor, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_APPEND)
            os.dup2(target, descriptor)
            os.close(target)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        python_path = [entry for entry in request["env"].get("PYTHONPATH", "").split(os.pathsep) if entry]
        sys.path[:] = [request["cwd"], *python_path, *INSTALLED_PATH]
        sys.argv = [PYTEST_MAIN, *request["argv"]]
        code = int(pytest.console_main())
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    resident = resident_file_pages()
    for line in iter(sys.stdin.buffer.readline, b""):
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_session(request, resident)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    print(json.dumps({"ready": os.getpid()}), flush=True)
    serve()
