"""A replacement process: runs the session's tests, one at a time as the session asks, until
it holds more than the session limit after a test (``limit.py``); then it ends.

It is a fork of the session's template (``template.py``), made before the session's first
test and so holding nothing any test left; or, where the template cannot fork, a fresh
interpreter (``python -m pytest_tfmem.isolate.replacement SPEC.json``). Either way it runs
``pytest`` with the session's own arguments and collects the files of the tests that remain,
so fixtures of module, class, package or session scope are set up anew in it. On its channel
(a socket pair, one end the session's) the session writes one request per test as JSON lines
(``nodeid``, ``next``: the node id of the test after it in the session, for the fixtures'
teardown, and ``testsfailed``: the session's failure count, so ``-x``/``--maxfail`` tear down
as the session would); the replacement answers with ``ready`` once collected, then the test's
events (``child.TestEvents``) and ``done`` (``full``: it crossed the limit and ends).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from pytest_tfmem.core import processes, pytest_internals
from pytest_tfmem.core.subsession import die_with_parent
from pytest_tfmem.isolate.channel import connect_back
from pytest_tfmem.isolate.child import TestEvents, quiet_terminal, single_test_options
from pytest_tfmem.isolate.limit import LimitWatch


@dataclass(frozen=True)
class ReplacementSpec:
    """What the session asks of a replacement process."""

    args: list[str]  # the session's command-line arguments
    targets: list[str]  # the files of the tests it may be asked to run
    basetemp: str  # its own --basetemp
    parent_pid: int  # a spawned replacement dies with this process
    session: dict[str, Any]  # the session it serves (``processes.Session.to_dict()``)
    output: str  # where its output goes
    limit: int  # bytes: held after a test's teardown, past this it ends
    number: int  # 1 for the first replacement process of the session's process (or worker)
    worker: str | None  # the pytest-xdist worker it replaces
    channel_fd: int = -1  # its end of the channel to the session, inherited
    # where the channel cannot be inherited (``platforms``: Windows): the session's port on the
    # loopback interface to connect back to, and the token to name (``isolate.channel``)
    channel_port: int = 0
    channel_token: str = ""

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> ReplacementSpec:
        return cls(**json.loads(path.read_text()))


class ReplacementRun(TestEvents):
    """The plugin that serves the session's requests in the replacement process."""

    def __init__(self, spec: ReplacementSpec) -> None:
        if spec.channel_fd >= 0:
            self.channel = socket.socket(fileno=spec.channel_fd)
        else:
            self.channel = connect_back(spec.channel_port, spec.channel_token)
        super().__init__(self.channel.makefile("w", buffering=1, encoding="utf-8"), nodeid="")
        self.requests: BinaryIO = self.channel.makefile("rb")
        self.spec = spec
        self.watch = LimitWatch(spec.limit, spec.number, os.getpid(), spec.worker)

    def register(self, config: pytest.Config) -> None:
        """A fork of the template (configured already)."""
        self.config = config
        processes.enter_replacement(config, self.spec.number, self.spec.worker)
        config.pluginmanager.register(self, "tfmem-replacement")
        config.pluginmanager.register(self.watch, "tfmem-replacement-limit")

    @pytest.hookimpl(tryfirst=True)  # before pytest's own main, which runs the session
    def pytest_cmdline_main(self, config: pytest.Config) -> None:
        """A spawned replacement (the plugin is registered before configuring)."""
        single_test_options(config, self.spec.session, self.spec.basetemp)
        processes.enter_replacement(config, self.spec.number, self.spec.worker)
        config.args = list(self.spec.targets)
        self.config = config

    def pytest_tfmem_measure_all(self) -> bool:
        return True  # as in the session, which has a limit

    @pytest.hookimpl(tryfirst=True)  # before pytest's own setup, which expects the previous test's state finished
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Finish what the previous test kept for a next test that the session ran elsewhere
        (isolated), as pytest's own setup expects; an error there is this test's setup error."""
        pytest_internals.teardown_exact(item, item)

    @pytest.hookimpl(tryfirst=True)  # instead of pytest's own loop (first result wins)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        quiet_terminal(session.config)
        items = {item.nodeid: item for item in session.items}
        self.write({"event": "ready", "pid": os.getpid()})
        for line in self.requests:
            request = json.loads(line)
            self.nodeid = request["nodeid"]
            item = items.get(self.nodeid)
            if item is None:
                self.write({"event": "not_collected", "collected": len(items)})
            else:
                session.testsfailed = request["testsfailed"]
                item.config.hook.pytest_runtest_protocol(item=item, nextitem=items.get(request["next"]))
            full = self.watch.crossing is not None
            self.write({"event": "done", "full": full})
            if full:
                break
        return True

    def pytest_sessionfinish(self) -> None:
        self.stream.close()
        self.requests.close()
        self.channel.close()


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    spec = ReplacementSpec.read(Path(arguments[0]))
    die_with_parent(spec.parent_pid)
    run = ReplacementRun(spec)
    return int(pytest.main(spec.args, plugins=[run, run.watch]))


if __name__ == "__main__":
    # Run the imported module's main, not this copy's (see child.py).
    from pytest_tfmem.isolate.replacement import main as replacement_main

    sys.exit(replacement_main())
