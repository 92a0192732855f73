"""A worker's memory before its first test, measured in a process that starts the way a worker does.

pytest-xdist's controller never collects tests: its workers do. Importing the test modules
into the controller to measure them would also keep that memory there for the whole
session, beside the workers it is meant to count. So a short-lived pytest process
(``python -m pytest_tfmem.workers.probe SPEC.json``) runs with the session's own arguments,
rootdir, ini file, conftest files and plugins, without workers and with ``--collect-only``:
it imports what a worker imports, starts TensorFlow's runtime as tfmem does before the
first measured test (when TensorFlow was imported), returns freed memory to the system and
writes its resident memory, with every collected test's budget and baseline peak, to a JSON
file. It is an isolated test's process to every feature (``processes.enter_child``), serving
the controller's session, so the session's journal, baseline and reports stay the
controller's. It costs one collection before the workers start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_tfmem import frameworks
from pytest_tfmem.core import processes
from pytest_tfmem.core.manager import manager
from pytest_tfmem.core.subsession import die_with_parent, output_excerpt, override_options
from pytest_tfmem.probes import host
from pytest_tfmem.workers.fit import BASELINE_PEAK, BUDGET, Need

OUTPUT_LINES = 20

# Options set in the probe whatever the session's command line says (when the option exists),
# besides those no run started for the session takes over: no workers, collection only, and no
# file the session itself writes.
_PROBE_OPTIONS: dict[str, Any] = {
    "tx": [],
    "collectonly": True,
    "report_log": None,
}

def probing(config: pytest.Config) -> bool:
    """This process is the probe: its ``Probe`` plugin is registered (from ``pytest.main``'s
    plugins, before the command line is read: pytest-xdist asks for ``-n auto``'s count before
    any plugin configures)."""
    return any(isinstance(plugin, Probe) for plugin in config.pluginmanager.get_plugins())


@dataclass(frozen=True)
class ProbedTest:
    nodeid: str
    budget: int | None
    baseline_peak: int | None


@dataclass(frozen=True)
class ProbeResult:
    """What the probe measured and collected."""

    rss: int  # resident memory after collection (and the frameworks' runtime starts), freed memory returned
    runtimes: list[str]  # the frameworks whose runtime was up: "TensorFlow", "JAX"
    seconds: float
    tests: list[ProbedTest] = field(default_factory=list)

    def describe(self) -> str:
        """How the worker baseline was measured, for the session header."""
        runtime = f" and starting {' and '.join(self.runtimes)}'s runtime" if self.runtimes else ""
        return (
            f"measured in a collect-only pytest process after importing the test modules{runtime} "
            f"({self.seconds:.1f} s)"
        )

    def largest_need(self) -> Need | None:
        """The most one collected test may add to its worker: its baseline peak where the
        baseline has it, else its budget; ``None`` when no test has either."""
        best: Need | None = None
        for test in self.tests:
            if test.baseline_peak is not None:
                need = Need(test.baseline_peak, BASELINE_PEAK, test.nodeid)
            elif test.budget is not None:
                need = Need(test.budget, BUDGET, test.nodeid)
            else:
                continue
            if best is None or need.bytes > best.bytes:
                best = need
        return best

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        tests = [ProbedTest(**test) for test in data.pop("tests")]
        return cls(tests=tests, **data)


class ProbeFailed(Exception):
    """The probe wrote no result; the message says how it ended and shows its last output."""


class Probe:
    """The plugin that turns a pytest run into the probe."""

    def __init__(self, result_path: Path, session: dict[str, Any]) -> None:
        self.result_path = result_path
        self.session = session
        self._t0 = time.monotonic()

    @pytest.hookimpl(tryfirst=True)  # before pytest's own main, which runs the session
    def pytest_cmdline_main(self, config: pytest.Config) -> None:
        processes.enter_child(config, self.session)  # -n auto here starts no probe of its own
        override_options(config, _PROBE_OPTIONS)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        config = session.config
        tfmem_manager = manager(config)
        tests = [
            ProbedTest(item.nodeid, tfmem_manager.budget_for(item), tfmem_manager.known_peak(item))
            for item in session.items
        ]
        for item in session.items[:1]:  # as a worker does before its first measured test
            tfmem_manager.prepare_frameworks(item)
        host.release_freed_memory()
        result = ProbeResult(
            rss=host.current_rss(),
            runtimes=[framework.name for framework in frameworks.started()],
            seconds=round(time.monotonic() - self._t0, 3),
            tests=tests,
        )
        self.result_path.write_text(json.dumps(asdict(result)))


def measure_worker(config: pytest.Config) -> ProbeResult:
    """Run the probe with this session's arguments; raise ``ProbeFailed`` if it gives nothing."""
    with tempfile.TemporaryDirectory(prefix="tfmem-workers-") as directory:
        spec = Path(directory) / "spec.json"
        result_path = Path(directory) / "result.json"
        log = Path(directory) / "output.log"
        spec.write_text(
            json.dumps(
                {
                    "args": [str(arg) for arg in config.invocation_params.args],
                    "result": str(result_path),
                    "parent_pid": os.getpid(),
                    "session": processes.session(config).to_dict(),
                }
            )
        )
        with open(log, "wb") as output:
            returncode = subprocess.call(
                [sys.executable, "-m", "pytest_tfmem.workers.probe", str(spec)],
                cwd=config.invocation_params.dir,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        if not result_path.exists():
            excerpt = output_excerpt(log, OUTPUT_LINES)
            raise ProbeFailed(f"the collect-only process exited with code {returncode} without a result:\n{excerpt}")
        return ProbeResult.from_dict(json.loads(result_path.read_text()))


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(arguments[0]).read_text())
    die_with_parent(spec["parent_pid"])
    return int(pytest.main(spec["args"], plugins=[Probe(Path(spec["result"]), spec["session"])]))


if __name__ == "__main__":
    # Run the imported module's main, not this copy's (run as ``-m``, this file is ``__main__``).
    from pytest_tfmem.workers.probe import main as probe_main

    sys.exit(probe_main())
