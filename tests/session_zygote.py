"""A process that has imported TensorFlow and forks one inner pytest session per request.

Run as a script by ``forked_sessions.Zygote``, its standard input carries one JSON request a line
(``argv``, ``cwd``, ``env``, ``stdout`` and ``stderr`` paths) and its standard output one JSON
line with the session's pid, then one with its exit status. The forked session is what
``python -m pytest`` in a fresh interpreter would be, with TensorFlow (and the Keras that it
imports) already in ``sys.modules``: its streams, working directory, environment, ``sys.argv``
and ``sys.path`` are the request's, and its ``atexit`` functions run before it exits.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import traceback
from pathlib import Path

import numpy  # noqa: F401
import pytest
import tensorflow  # noqa: F401

# What the interpreter puts on sys.path after the script's own folder and PYTHONPATH's entries.
INSTALLED_PATH = [entry for entry in sys.path[1:] if entry not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
PYTEST_MAIN = str(Path(pytest.__file__).with_name("__main__.py"))


def run_session(request: dict) -> None:
    """In the forked child: become ``python -m pytest <argv>`` and exit with its status."""
    code = 1
    try:
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
    for line in iter(sys.stdin.buffer.readline, b""):
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_session(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    print(json.dumps({"ready": os.getpid()}), flush=True)
    serve()
