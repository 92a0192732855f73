"""A process that has imported pytest and its plugins, or a framework too, and forks one inner
pytest session per request.

Run as a script by ``forked_sessions.Zygote``, its standard input carries one JSON request a line
(``argv``, ``cwd``, ``env``, ``stdout`` and ``stderr`` paths) and its standard output one JSON
line with the session's pid, then one with its exit status. The forked session is what
``python -m pytest`` in a fresh interpreter would be, with pytest's plugins (below) and
TensorFlow (and the Keras that it imports) already in ``sys.modules``, or where ``KERAS_BACKEND``
names another backend, Keras and that backend's framework (TensorFlow stays unimported); with
``--pytest-only``, only pytest and its plugins: its streams, working directory, environment, ``sys.argv``
and ``sys.path`` are the request's, and its ``atexit`` functions run before it exits.

A forked child does not inherit its parent's page-table entries for the libraries' code and
read-only data: it would fault them in again as its first tests ran them, 450 MiB of resident
memory that a fresh process has before its first test, and the figures of the first tests would
grow by what they touched (a gate run's first test read +23 MiB retained). Each child maps again
the file-backed pages that were resident here, as the plugin's isolated forks do
(``pytest_tfmem/platforms/file_pages.py``).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType

import pytest
from _pytest.config import _prepareconfig

# pytest imports its plugins' modules (their ``pytest11`` entry points) at each session's start:
# a third of a trivial forked session's CPU. Here pytest parses a command line once, as a session
# starts, with ``PYTEST_ADDOPTS`` as this process has it (the suite's inner sessions block
# Hypothesis's plugin, nbmake, nbval and pytest-randomly: tests/conftest.py), so that its assertion
# rewriting imports the plugins' modules as a session's would: they are in ``sys.modules`` when a
# forked session starts, as they would be once it parsed its own. Where Hypothesis's plugin loads,
# Hypothesis, which the plugin imports at each session's end, is imported too. pytest-tfmem, the
# plugin under test, is blocked here: each session imports it as a fresh one does.
PRELOAD_ARGUMENTS = ("-p", "no:tfmem", "-p", "no:cacheprovider", "-c", os.devnull)


def preload_plugins() -> None:
    config = _prepareconfig([*PRELOAD_ARGUMENTS, "--rootdir", os.getcwd()])
    try:
        if config.pluginmanager.has_plugin("hypothesispytest"):
            import hypothesis.internal.observability  # noqa: F401
    finally:
        config._ensure_unconfigure()  # its clean-ups: the rewriting import hook taken out


preload_plugins()

if sys.argv[1:] != ["--pytest-only"]:
    import numpy  # noqa: F401

    if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
        import tensorflow  # noqa: F401
    else:
        import keras  # noqa: F401  # and the framework of its backend

# What the interpreter puts on sys.path after the script's own folder and PYTHONPATH's entries.
INSTALLED_PATH = [entry for entry in sys.path[1:] if entry not in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
PYTEST_MAIN = str(Path(pytest.__file__).with_name("__main__.py"))


def _load_file_pages() -> ModuleType:
    """The plugin's ``platforms/file_pages.py``, by its path: the sessions forked here import
    pytest-tfmem themselves, or never (``-p no:tfmem``)."""
    path = Path(importlib.util.find_spec("pytest_tfmem").origin).with_name("platforms") / "file_pages.py"
    spec = importlib.util.spec_from_file_location("_tests_file_pages", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # for its dataclass
    spec.loader.exec_module(module)
    return module


FilePages = _load_file_pages().FilePages


def _as_at_start(path: list[str]) -> None:
    """pytest-xdist hands its workers the ``sys.path`` it copied when its plugin was imported, as
    an interpreter starts (``xdist.plugin._sys_path``, bound in ``xdist.workermanage`` too): here
    that was this process's, whose ``PYTHONPATH`` may not be the session's."""
    for name in ("xdist.plugin", "xdist.workermanage"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "_sys_path"):
            module._sys_path = list(path)


def run_session(request: dict, resident: FilePages) -> None:
    """In the forked child: become ``python -m pytest <argv>`` and exit with its status."""
    code = 1
    try:
        resident.map_again()
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
        _as_at_start(sys.path)
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
    resident = FilePages.read()
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
