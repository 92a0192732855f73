"""Shared helpers for the test suite: run pytest on generated files and read tfmem records."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import forked_sessions
import numpy  # noqa: F401  # loaded once here: in-process pytester runs unload modules they import
import pytest

from pytest_tfmem import platforms
from pytest_tfmem.core.record import TestRecord, record_from_report

# The suite's outcomes must not depend on the machine it runs on: the frameworks' settings in the
# environment (``KERAS_BACKEND=jax`` would move Keras off TensorFlow, ``TF_FORCE_GPU_ALLOW_GROWTH``,
# ``XLA_FLAGS``...) are dropped, and Keras reads its config (``keras.json``, which can name a
# backend too) from a directory of the suite's own, not the user's ``~/.keras``. pytester's runs
# get a ``HOME`` of their own from pytester.
for _name in [name for name in os.environ if name.startswith(("TF_", "KERAS_", "XLA_", "JAX_"))]:
    del os.environ[_name]
os.environ["KERAS_HOME"] = tempfile.mkdtemp(prefix="tfmem-tests-keras-home-")


def _remove_keras_home(path: str = os.environ["KERAS_HOME"], owner: int = os.getpid()) -> None:
    """The process that made the directory removes it as it exits (a fork of it leaves it be)."""
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


atexit.register(_remove_keras_home)

# TensorFlow keeps CPU allocator statistics (the ``tf:CPU:0`` view) only with oneDNN on, its
# default on some x86 CPUs and not on others (AMD EPYC): on, the tests see the same TensorFlow
# on every machine. Inner pytest runs inherit it.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
# Inner sessions' TensorFlow and OpenMP pools of one thread each, in every run of the suite: they were
# set only as a side effect of importing ``benchmarks.suite_overhead`` (tests/test_collector.py), so
# a whole run's sessions had them and a run of a few modules' did not.
for _name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS"):
    os.environ[_name] = "1"

# pytest-randomly (in the test extra) would shuffle every inner pytest run and reseed ``random``
# in it, as pyproject's ``-p no:randomly`` keeps it from doing to this suite. It is off in every
# inner run unless the run asks for it with ``-p randomly`` (tests/test_compatibility.py). So is
# Hypothesis's plugin, which no test uses and which a machine may have installed for other
# projects: its import took 0.45 s of CPU in each of the suite's several hundred inner runs. Here
# for plain subprocesses (module-scoped fixtures' too), and in ``pytester`` below, which discards
# the outer PYTEST_ADDOPTS. A run with ``-p no:tfmem`` takes PLAIN_RUN_OPTIONS:
# pytest warns of an ini option no plugin declares. So are nbmake's and nbval's: their imports
# (Jupyter's client, nbformat) made every inner session's process 20 MiB larger, which the tests of
# a limit on the process's size read; the notebook tests ask for them (``-p nbmake``).
PLAIN_RUN_OPTIONS = "-p no:randomly -p no:hypothesispytest -p no:nbmake -p no:nbval"
# The first-use warm-up costs each inner session that starts TensorFlow about 1.2 s, a tenth of
# this suite's time, and most tests look at one test's figures, not at their order: it is off in
# inner runs, and the tests of first use and of order ask for it (WARM_UP).
INNER_RUN_OPTIONS = f"{PLAIN_RUN_OPTIONS} -o tfmem_first_use_warmup=false"
WARM_UP = ("-o", "tfmem_first_use_warmup=true")
os.environ["PYTEST_ADDOPTS"] = f"{os.environ.get('PYTEST_ADDOPTS', '')} {INNER_RUN_OPTIONS}".strip()


# Every module an inner session imports: the plugin's (each, whether or not a run needs it) and the
# other pytest plugins', which pytest rewrites for assertions.
_EVERY_MODULE_TEST = """
import importlib, pkgutil
import pytest_tfmem

def test_import_every_module():
    for module in pkgutil.walk_packages(pytest_tfmem.__path__, "pytest_tfmem."):
        try:
            importlib.import_module(module.name)
        except ImportError:  # a module of another system's: the sessions here never import it either
            pass
"""


def pytest_configure(config: pytest.Config) -> None:
    """Before the suite's several hundred inner sessions, one session that caches compiled modules.

    Where ``PYTHONDONTWRITEBYTECODE`` is set, as on the 2-core machine this suite is timed on, each
    inner session compiled the plugin's modules and rewrote the other pytest plugins' asserts again:
    1.2 s of a trivial inner session's 2.2 s. Inner sessions keep the setting, since a test that
    rewrites its test file within a second at the same size would load a stale cached copy; they
    read the cache that this one session writes (pytest reads a cached rewrite even when it may not
    write one).
    The controller alone does it under pytest-xdist. Each process keeps the forking processes of
    the environment set up above the longest (``forked_sessions.Zygotes.keep_home``).
    """
    forked_sessions.ZYGOTES.keep_home(os.environ)
    if hasattr(config, "workerinput"):
        return
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    environment["PYTEST_ADDOPTS"] = ""  # every installed plugin, nbmake and nbval included
    with tempfile.TemporaryDirectory(prefix="tfmem-tests-compile-") as folder:
        test = Path(folder) / "test_every_module.py"
        test.write_text(_EVERY_MODULE_TEST)
        # Only a cache: where this session fails, the inner sessions are slower, not wrong.
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={folder}/tmp", str(test)],
            cwd=folder, env=environment, capture_output=True, check=False,
        )  # fmt: skip


def pytest_unconfigure(config: pytest.Config) -> None:
    forked_sessions.ZYGOTES.close()


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> pytest.Pytester:
    """pytest's ``pytester``, its inner runs (in process and in subprocesses) in file order and
    without Hypothesis's plugin; its subprocess runs forked from a process with pytest imported
    (0.27 s of a trivial session's 0.74 s), or with TensorFlow imported in a test marked
    ``forked_sessions``."""
    monkeypatch.setenv("PYTEST_ADDOPTS", INNER_RUN_OPTIONS)
    framework = request.node.get_closest_marker("forked_sessions") is not None
    monkeypatch.setattr(pytester, "popen", forked_sessions.forking_popen(pytester, framework))
    return pytester


@pytest.fixture(autouse=True)
def no_pytorch_in_the_suites_process() -> Iterator[None]:
    """No test may import PyTorch into the suite's processes: TensorFlow's tests run there, and
    two traced there crashed in Triton's import once a test had loaded PyTorch beside TensorFlow
    (scripts/gpu_check.py's search for a GPU framework). PyTorch's tests run in processes of their own."""
    before = "torch" in sys.modules
    yield
    if not before and "torch" in sys.modules:
        pytest.fail("this test imported PyTorch into the suite's process: import it in a subprocess", pytrace=False)


@pytest.fixture(autouse=True)
def no_github_step_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inner pytest runs would append their Markdown summary to the CI job's page."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.fixture
def runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder an inner session's test bodies append a line to each time they run (``RUNS_DIR``),
    so a test can count the runs: ``runs(runs_dir, name)``."""
    directory = tmp_path / "runs"
    directory.mkdir()
    monkeypatch.setenv("RUNS_DIR", str(directory))
    return directory


def runs(directory: Path, name: str) -> int:
    """How often the body that writes to ``directory / name`` ran."""
    path = directory / name
    return len(path.read_text().splitlines()) if path.exists() else 0


RECORDS_PLUGIN = Path(__file__).resolve().parent / "records_dump.py"


def dump_records(directory: Path) -> tuple[str, str]:
    """The arguments that make an inner session in ``directory`` write its tests' records
    (``records_dump``); read them with ``dumped_records(directory)``."""
    shutil.copy(RECORDS_PLUGIN, directory / RECORDS_PLUGIN.name)
    return "-p", RECORDS_PLUGIN.stem


def dumped_records(directory: Path) -> dict[str, TestRecord]:
    """The tfmem records by test name (the last attempt's: pytest-rerunfailures), each as its
    teardown report carried it (what it left behind included), with its call's outcome (``failed``
    where its teardown failed)."""
    records: dict[str, TestRecord] = {}
    path = directory / "tfmem-records.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        entry = json.loads(line)
        record = TestRecord.from_dict(entry["record"])
        name = record.nodeid.split("::")[-1]
        if entry["when"] == "teardown":  # what the test left behind, with the call's outcome
            called = records.get(name)
            record.outcome = "failed" if entry["outcome"] == "failed" else (called.outcome if called else "passed")
        records[name] = record
    return records


class _CallRecords:
    """Catches each call report's tfmem record as it is logged: once every plugin has logged a
    report, tfmem takes the record off it."""

    def __init__(self) -> None:
        self.by_name: dict[str, TestRecord] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = record_from_report(report) if report.when == "call" else None
        if record is not None:
            self.by_name[report.nodeid.split("::")[-1]] = record


def inline_run_records(pytester: pytest.Pytester, *args: str) -> tuple[pytest.HookRecorder, dict[str, TestRecord]]:
    """An in-process ``pytester.inline_run``, and the tfmem records of its tests by name."""
    caught = _CallRecords()
    return pytester.inline_run(*args, plugins=[caught]), caught.by_name


@pytest.fixture
def run_subprocess_records(pytester: pytest.Pytester):
    """Run pytest in a fresh interpreter; return (result, records by test name)."""

    def run(*args: str) -> tuple[pytest.RunResult, dict[str, TestRecord]]:
        junit = pytester.path / "junit.xml"
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", f"--junitxml={junit}", *dump_records(pytester.path), *args
        )
        return result, dumped_records(pytester.path)

    return run


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``longest`` first, the rest in their order: pytest-xdist hands out tests
    in collection order, and a long test that started last kept one worker busy for minutes
    after the other had finished. The tests marked ``linux`` skip where memory is not read as
    Linux reads it (macOS, Windows, ``TFMEM_PLATFORM=portable``)."""
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)
    reading = platforms.current()
    if reading.name != "Linux":
        skip = pytest.mark.skip(reason=f"asserts what only Linux's own readings give; memory is read here by "
                                       f"the {reading.name} platform")
        for item in items:
            if item.get_closest_marker("linux") is not None:
                item.add_marker(skip)


def pytest_ignore_collect(collection_path, config: pytest.Config) -> bool | None:
    """With ``-m`` naming ``any_os`` (the macOS and Windows jobs, without TensorFlow), a test
    module that marks nothing ``any_os`` is not imported: many import TensorFlow at their top.
    The module's text is read, not run."""
    if "any_os" not in (config.option.markexpr or "") or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return "any_os" not in collection_path.read_text(encoding="utf-8") or None
