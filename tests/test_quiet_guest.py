"""tfmem leaves the session as it found it: warnings point where they point without it, and what
a test keeps is sized without running the user's code, importing a module or warning."""

from __future__ import annotations

import gc
import json
import re
import sys
import tempfile

import pytest
from conftest import PLAIN_RUN_OPTIONS

from pytest_tfmem.probes.objects import size_of

LEGACY = """
import warnings
warnings.warn("legacy{level} is deprecated", DeprecationWarning, stacklevel={level})
"""

IMPORTS = """
def test_imports_legacy_modules():
    import legacy1
    import legacy2
"""


def _warning_lines(result: pytest.RunResult) -> list[str]:
    return sorted(line.strip() for line in result.outlines if re.search(r"\.py:\d+: DeprecationWarning", line))


@pytest.fixture
def legacy_modules(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # runs with and without tfmem compare their warnings: no tfmem ini value (the tests import no framework)
    monkeypatch.setenv("PYTEST_ADDOPTS", PLAIN_RUN_OPTIONS)
    for level in (1, 2):
        pytester.makepyfile(**{f"legacy{level}": LEGACY.format(level=level)})
    pytester.makepyfile(test_importer=IMPORTS)
    pytester.syspathinsert()
    return pytester


def test_a_warning_raised_at_import_points_where_it_points_without_tfmem(legacy_modules: pytest.Pytester):
    args = ("-p", "no:cacheprovider", "-W", "default::DeprecationWarning", "test_importer.py")
    plain = legacy_modules.runpytest_subprocess(*args, "-p", "no:tfmem")
    measured = legacy_modules.runpytest_subprocess(*args, "--tfmem-budget=1GB")
    expected = _warning_lines(plain)
    assert len(expected) == 2 and any("test_importer.py:3" in line for line in expected)
    assert any("legacy1.py:2" in line for line in expected)
    assert _warning_lines(measured) == expected
    assert "pytest_tfmem" not in measured.stdout.str()


@pytest.mark.parametrize(
    "filter_",
    [
        "error::DeprecationWarning:test_importer",  # stacklevel=2: the importing module's
        "error::DeprecationWarning:legacy1",  # stacklevel=1: the warning module's own
    ],
)
def test_filters_that_name_a_module_match_as_without_tfmem(legacy_modules: pytest.Pytester, filter_: str):
    args = ("-p", "no:cacheprovider", "-W", filter_, "test_importer.py")
    legacy_modules.runpytest_subprocess(*args, "-p", "no:tfmem").assert_outcomes(failed=1)
    legacy_modules.runpytest_subprocess(*args, "--tfmem-budget=1GB").assert_outcomes(failed=1)


def test_an_ini_filterwarnings_entry_matches_as_without_tfmem(legacy_modules: pytest.Pytester):
    legacy_modules.makeini("[pytest]\nfilterwarnings =\n    error::DeprecationWarning:test_importer\n")
    result = legacy_modules.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB", "test_importer.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*DeprecationWarning: legacy2 is deprecated"])


class Recorder:
    """An object whose ``__getattr__`` notes every call."""

    calls: list[str] = []

    def __getattr__(self, name: str):
        Recorder.calls.append(name)
        return 12345


def test_sizing_never_calls_a_user_objects_getattr():
    Recorder.calls.clear()
    assert size_of(Recorder()) > 0
    assert Recorder.calls == []


def test_sizing_reads_an_arrays_buffer():
    import numpy as np

    assert size_of(np.ones(1000)) == 8000


KEEPS = """
import importlib.util, sys
import numpy as np
import pytest

KEPT = []

class Recorder:
    calls = []
    def __getattr__(self, name):
        Recorder.calls.append(name)
        raise AttributeError(name)

def lazy(name):
    spec = importlib.util.find_spec(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module

def test_keeps_things():
    KEPT.extend([Recorder(), pytest.mark, lazy("heavy"), np.ones(4 * 2**20 // 8)])

def test_after():
    assert Recorder.calls == []
"""


def test_what_stayed_touches_no_user_object_imports_nothing_and_warns_nothing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    # Under pytest-xdist the inner run would inherit the worker's id, and pytest-benchmark would
    # warn that it turns itself off: under -W error, an error that is not the diagnosis's.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makepyfile(heavy="import traceback\nwith open('heavy-was-imported', 'w') as out:\n    traceback.print_stack(file=out)\n")
    pytester.makepyfile(test_keeps=KEEPS)
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--tfmem-budget=1GB", "--tfmem-stayed-threshold=1MB", "-W", "error",
        "--tfmem-report=report.json",
    )
    result.assert_outcomes(passed=2)
    assert not (pytester.path / "heavy-was-imported").exists()
    assert "PytestUnknownMarkWarning" not in result.stdout.str()
    report = json.loads((pytester.path / "report.json").read_text())
    keeper = next(test for test in report["tests"] if test["nodeid"].endswith("test_keeps_things"))
    assert any(line.startswith("list 'KEPT' (global of test_keeps) +4 items") for line in keeper["retained"]["stayed"])


def test_module_globals_are_read_without_a_modules_getattr():
    from pytest_tfmem.probes.objects import module_global

    class Lazy(type(sys)):
        def __getattr__(self, name):
            raise AssertionError(f"__getattr__({name!r}) called")

    module = Lazy("tfmem_lazy_probe")
    module.present = 1
    sys.modules["tfmem_lazy_probe"] = module
    try:
        assert module_global("tfmem_lazy_probe", "present") == 1
        assert module_global("tfmem_lazy_probe", "absent") is None
        assert module_global("tfmem_not_imported", "anything") is None
    finally:
        del sys.modules["tfmem_lazy_probe"]


def test_the_suite_runs_with_no_framework_settings_of_the_machines():
    """tests/conftest.py: the environment's TensorFlow, Keras, XLA and JAX settings are dropped and
    Keras's config directory is the suite's own, so they change no outcome."""
    import os

    assert not [name for name in os.environ if name.startswith(("KERAS_BACKEND", "XLA_", "JAX_", "TF_FORCE"))]
    assert os.environ["KERAS_HOME"].startswith(tempfile.gettempdir())
    assert os.environ["TF_ENABLE_ONEDNN_OPTS"] == "1"  # the one the suite sets itself


FINALIZER_ERROR = """
class Raises:
    def __init__(self):
        self.me = self  # a reference cycle: freed by a collection only

    def __del__(self):
        raise ValueError("raised by the finalizer of a cycle")


KEPT = {"cycle": Raises()}


def test_first():
    pass


def test_drops_the_cycle():
    del KEPT["cycle"]  # garbage now, among the objects tfmem froze before the first test
"""


def test_a_finalizers_error_in_frozen_garbage_is_reported_at_the_end_as_without_tfmem(pytester: pytest.Pytester):
    """tfmem collects everything once more at the session's end and keeps the rest frozen through
    pytest's own collections (``Collector.settle``): the error of a finalizer in garbage it had
    frozen is still reported, as pytest reports it without tfmem, and every object is thawed after."""
    pytester.makepyfile(test_cycle=FINALIZER_ERROR)
    said = ["*PytestUnraisableExceptionWarning: Exception ignored in: <function Raises.__del__ at *>",
            "*ValueError: raised by the finalizer of a cycle"]
    for options in (("-p", "no:tfmem", *PLAIN_RUN_OPTIONS.split()), ("--tfmem-budget=1GB",)):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *options)
        result.assert_outcomes(passed=2)
        result.stderr.fnmatch_lines(said)
    pytester.makepyfile(test_cycle="KEPT = [object()]\n\ndef test_first():\n    pass\n\ndef test_second():\n    pass\n")
    frozen = gc.get_freeze_count()
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB").assert_outcomes(passed=2)
    assert gc.get_freeze_count() == frozen  # thawed at the end, after pytest's collections
