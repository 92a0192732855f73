"""The isolated interpreter: ``python -m pytest_tfmem.isolate.child SPEC.json`` runs one test.

The parent (``isolate.py``) writes a spec: the session's own command-line arguments, the test
to run and where to write. The child runs ``pytest.main`` with those arguments, so the
rootdir, ini file, conftest files, plugins and options are the same as the parent's, then
narrows collection to the one test. Settings that make no sense for a single test in a
child (distributing with xdist, the debugger, selection by ``-k``/``-m``/``--lf``, writing
the session's JUnit file) are switched off.

Everything the parent needs travels through a JSON-lines file, one line per event, written
as it happens, so the parent knows how far the test got even when the child is killed:
``report`` (each test report, serialised by pytest's own hook), ``call`` and ``call_end``
(RSS when the test body starts, the process's peak RSS when it ends), ``warning``,
``collect_error``, ``not_collected`` and ``finished``. Other tfmem plugins tell an isolated
test's process by its role (``core.processes``): session-wide outputs are the parent's.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Generator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import pytest

from pytest_tfmem.core import processes, settings, subsession
from pytest_tfmem.probes import host

# Options set in the child whatever the session's command line says (when the option exists),
# besides those no run started for the session takes over (``subsession.override_options``).
_SINGLE_TEST_OPTIONS: dict[str, Any] = {
    "lf": False,  # selection: the child runs exactly the test it was given
    "failedfirst": False,
    "newfirst": False,
    "stepwise": False,
    "stepwise_skip": False,
    "keyword": "",
    "markexpr": "",
}


@dataclass(frozen=True)
class ChildSpec:
    """What the parent asks of the child."""

    args: list[str]  # the session's command-line arguments
    nodeid: str  # the test to run
    target: str  # the argument that collects it: "<absolute path>::<name>"
    events: str  # JSON-lines file the child writes its events to
    basetemp: str  # the child's own --basetemp, inside the parent's
    parent_pid: int  # the child dies with this process
    session: dict[str, Any]  # the session the parent serves (``processes.Session.to_dict()``)
    output: str | None = None  # where a forked child writes its output (a spawned one's goes through its pipe)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> ChildSpec:
        return cls(**json.loads(path.read_text()))


def read_events(path: Path) -> list[dict[str, Any]]:
    """The child's events; a line cut short by a kill is dropped."""
    events = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


class TestEvents:
    """The events of the tests a process runs for the session, written as JSON lines to
    ``stream`` as they happen (each line reaches it whole: a file or socket): reports
    serialised by pytest's own hook, ``call``/``call_end`` readings, warnings and collection
    errors. ``nodeid`` is the test being run for the session."""

    __test__ = False  # not a pytest test class

    def __init__(self, stream: TextIO, nodeid: str) -> None:
        self.stream = stream
        self.nodeid = nodeid
        self.config: pytest.Config | None = None

    def write(self, event: dict[str, Any]) -> None:
        self.stream.write(json.dumps(event) + "\n")
        self.stream.flush()  # a socket's text file buffers whole lines too

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.write({"event": "collect_error", "nodeid": report.nodeid, "text": report.longreprtext})

    # tryfirst: outside pytest's own wrappers (output and log capture), so the readings span the
    # whole call phase; the core's steps are inside every wrapper anyway (trylast).
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        self.write({"event": "call", "rss": host.current_rss(), "time": time.time()})
        try:
            return (yield)
        finally:
            # The kernel's high-water mark (VmHWM), reset when tfmem's window opened at the
            # start of the test body: the process's exact peak over the body. (Not ru_maxrss:
            # it starts from the parent's size, copied at fork, and no reset lowers it.)
            peak = host.high_water_mark() or 0
            self.write({"event": "call_end", "peak_rss": peak, "rss": host.current_rss()})

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid == self.nodeid and self.config is not None:
            data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
            self.write({"event": "report", "report": data})

    def pytest_warning_recorded(self, warning_message: Any, when: str, nodeid: str, location: object) -> None:
        # the test's own; those of configuring and collecting, the session met itself
        if when != "runtest" or nodeid != self.nodeid:
            return
        category = warning_message.category
        self.write(
            {
                "event": "warning",
                "message": str(warning_message.message),
                "category": f"{category.__module__}.{category.__qualname__}",
                "filename": warning_message.filename,
                "lineno": warning_message.lineno,
            }
        )


class ChildRun(TestEvents):
    """The plugin that turns a pytest run in the child into a run of one test."""

    def __init__(self, spec: ChildSpec) -> None:
        # Open for the whole run (closed at session finish), line-buffered: each event
        # reaches the file as it is written, so a kill loses nothing already written.
        super().__init__(open(spec.events, "a", buffering=1), spec.nodeid)  # noqa: SIM115
        self.spec = spec

    @pytest.hookimpl(tryfirst=True)  # before pytest's own main, which runs the session
    def pytest_cmdline_main(self, config: pytest.Config) -> None:
        single_test_options(config, self.spec.session, self.spec.basetemp)
        config.args = [self.spec.target]
        self.config = config

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        try:
            return (yield)
        finally:
            quiet_terminal(session.config)

    @pytest.hookimpl(trylast=True)  # after pytest's and other plugins' own selection
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        selected = [item for item in items if item.nodeid == self.spec.nodeid]
        deselected = [item for item in items if item.nodeid != self.spec.nodeid]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = selected
        for item in selected:
            item.add_marker(settings.MARKER)  # an isolated test is always measured
        if not selected:
            self.write({"event": "not_collected", "collected": [item.nodeid for item in deselected]})

    def pytest_sessionfinish(self, exitstatus: int) -> None:
        self.write({"event": "finished", "exitstatus": int(exitstatus)})
        self.stream.close()


def quiet_terminal(config: pytest.Config) -> None:
    """Nobody reads a test process's terminal summary, and plugins' summary hooks can be slow
    (one imports hypothesis: seconds): the session prints its own."""
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:
        config.pluginmanager.unregister(terminal)


def single_test_options(config: pytest.Config, session: dict[str, Any], basetemp: str) -> None:
    """Make the process one that runs tests for ``session`` (``processes.enter_child``) and
    switch off what makes no sense in such a process (the session chooses its tests); before
    ``pytest_configure``, so every plugin sees it."""
    processes.enter_child(config, session)
    subsession.override_options(config, _SINGLE_TEST_OPTIONS)
    config.option.basetemp = basetemp


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    spec = ChildSpec.read(Path(arguments[0]))
    subsession.die_with_parent(spec.parent_pid)
    return int(pytest.main(spec.args, plugins=[ChildRun(spec)]))


if __name__ == "__main__":
    # Run the imported module's main, not this copy's: run as ``-m``, this file is
    # ``__main__``, a second copy of the module whose objects the plugins do not import.
    from pytest_tfmem.isolate.child import main as child_main

    sys.exit(child_main())
