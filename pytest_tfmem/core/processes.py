"""Which process of a pytest session this is, and the session all its processes serve.

A session runs in one process, or in several: its own (the main process, which is the
pytest-xdist controller when tests are distributed), pytest-xdist workers, and the processes
of isolated tests. ``role`` tells them apart, for every feature alike: session-wide outputs
(reports, baselines, the end of the journal, trace rotation) are the main process's to write
(``Role.writes_session_outputs``), tests are run where ``Role.runs_tests``.

Every process of a session shares one ``Session``: the main process's start time and pid
(hence the journal's session id and the trace directory's name), its rootdir and arguments.
The main process makes it; pytest-xdist workers get it with their worker input, isolated
tests' processes from ``enter_child`` before pytest configures them.
"""

from __future__ import annotations

import enum
import os
import time
from typing import Any

import psutil
import pytest

from pytest_tfmem.core.sessions import Session

_WORKER_INPUT_KEY = "tfmem_session"


class Role(enum.Enum):
    MAIN = "main"  # the session's own process, running its tests itself
    CONTROLLER = "controller"  # the session's own process; pytest-xdist workers run the tests
    WORKER = "worker"  # a pytest-xdist worker
    CHILD = "child"  # the process of an isolated test

    @property
    def writes_session_outputs(self) -> bool:
        """The session's own process: one writer for what covers the whole session."""
        return self in (Role.MAIN, Role.CONTROLLER)

    @property
    def runs_tests(self) -> bool:
        return self is not Role.CONTROLLER


_SESSION = pytest.StashKey[Session]()
_CHILD = pytest.StashKey[bool]()
_REPLACEMENT = pytest.StashKey[str]()


def enter_child(config: pytest.Config, session: dict[str, Any]) -> None:
    """Make this process an isolated test's process serving ``session`` (``Session.to_dict()``
    of the parent's); called before pytest configures the plugins."""
    config.stash[_CHILD] = True
    config.stash[_SESSION] = Session.from_dict(session)


def enter_replacement(config: pytest.Config, number: int, worker: str | None) -> None:
    """Make this process (a ``Role.CHILD`` already) the ``number``th replacement process of
    the session's process, or of pytest-xdist ``worker``: it runs tests one after the other,
    and what they leave stays in it, so it keeps books of its own (``process_label``)."""
    config.stash[_REPLACEMENT] = replacement_label(number, worker)


def replacement_label(number: int, worker: str | None) -> str:
    """``replacement process 2``, ``replacement process 2 of gw0``."""
    return f"replacement process {number}" + (f" of {worker}" if worker else "")


def process_label(config: pytest.Config) -> str | None:
    """The name of this process in the session's account when it is not the session's own: a
    pytest-xdist worker's id (``gw0``), ``replacement process 2`` (``... of gw0``)."""
    return config.stash.get(_REPLACEMENT, None) or worker_id(config)


def keeps_books(config: pytest.Config) -> bool:
    """This process runs tests one after the other for the session, so what a test leaves stays
    for the next: the session's own, a pytest-xdist worker, a replacement process; not an
    isolated test's process, which ends with its test."""
    current = role(config)
    return current.runs_tests and (current is not Role.CHILD or _REPLACEMENT in config.stash)


def role(config: pytest.Config) -> Role:
    if config.stash.get(_CHILD, False):
        return Role.CHILD
    if hasattr(config, "workerinput"):
        return Role.WORKER
    # pytest-xdist registers its distributing session in its own pytest_configure: ask each time.
    if config.pluginmanager.has_plugin("dsession"):
        return Role.CONTROLLER
    return Role.MAIN


def worker_id(config: pytest.Config) -> str | None:
    """A pytest-xdist worker's id (``gw0``...), else ``None``."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput["workerid"] if workerinput is not None else None


def session(config: pytest.Config) -> Session:
    """This process's session: made here in the main process, else the main process's."""
    found = config.stash.get(_SESSION, None)
    if found is None:
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None and _WORKER_INPUT_KEY in workerinput:
            found = Session.from_dict(workerinput[_WORKER_INPUT_KEY])
        else:
            found = Session(
                started=round(time.time(), 3),
                pid=os.getpid(),
                pid_created=psutil.Process().create_time(),
                rootdir=str(config.rootpath),
                args=tuple(str(arg) for arg in config.invocation_params.args),
            )
        config.stash[_SESSION] = found
    return found


def hand_to_worker(config: pytest.Config, workerinput: dict[str, Any]) -> None:
    """pytest-xdist: give a worker this session (from ``pytest_configure_node``)."""
    workerinput[_WORKER_INPUT_KEY] = session(config).to_dict()
