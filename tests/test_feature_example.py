"""The contributors' page's example feature works as shown, and features act in ``Step`` order.

``docs/development.md`` ("How a feature plugs in") shows a feature module; it runs here as a
``conftest.py`` of a real pytest run. No TensorFlow: plain Python tests.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
PACKAGE = REPOSITORY / "pytest_tfmem"


def example_feature() -> str:
    page = (REPOSITORY / "docs" / "development.md").read_text(encoding="utf-8")
    section = page.split("## How a feature plugs in", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "no python block in the section"
    return match.group(1)


def test_the_documented_example_feature_declares_checks_and_reports(pytester: pytest.Pytester):
    pytester.makeconftest(example_feature())
    pytester.makepyfile(
        """
        import time
        import pytest

        @pytest.mark.tfmem(max_seconds=1)
        def test_slow():
            time.sleep(1.2)

        @pytest.mark.tfmem(max_seconds=5)
        def test_quick():
            pass
        """
    )
    result = pytester.runpytest("-rP", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.re_match_lines([r".*tfmem: took 1\.\d s, limit 1 s", r"-+ tfmem duration -+", r"0\.\d\d\d s"])
    pytester.makepyfile(test_bad="import pytest\n@pytest.mark.tfmem(max_seconds='soon')\ndef test_x():\n    pass\n")
    bad = pytester.runpytest("test_bad.py", "-p", "no:cacheprovider")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "max_seconds" in bad.stderr.str() and "'soon'" in bad.stderr.str()


STEPS_CONFTEST = """
from contextlib import contextmanager
from pytest_tfmem.core.features import CallStep, Step
from pytest_tfmem.core.manager import MONITOR, manager

EVENTS = []

def step(name):
    @contextmanager
    def around(item):
        EVENTS.append(f"{name} in, measuring={MONITOR in item.stash}")
        yield
        EVENTS.append(f"{name} out")
    return around

def pytest_configure(config):
    for name in ("LEAKS", "GPU", "TRACE", "EXPLAIN"):  # added out of order
        manager(config).add_step(CallStep(Step[name], step(name)))

def pytest_sessionfinish():
    print("EVENTS:", "; ".join(EVENTS))
"""


def test_features_act_in_step_order_around_the_measurement(pytester: pytest.Pytester):
    pytester.makeconftest(STEPS_CONFTEST)
    pytester.makepyfile("import pytest\n@pytest.mark.tfmem\ndef test_one():\n    pass\n")
    result = pytester.runpytest("-s", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*EVENTS: GPU in, measuring=False; EXPLAIN in, measuring=False; TRACE in, measuring=False; "
            "LEAKS in, measuring=True; LEAKS out; TRACE out; EXPLAIN out; GPU out"
        ]
    )


def test_every_remaining_tryfirst_or_trylast_says_against_what():
    """Marks that order tfmem's hooks stay only against pytest's or other plugins' own."""
    bare = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if re.search(r"hookimpl\(.*(tryfirst|trylast)=True", line):
                above = lines[number - 2] if number > 1 else ""
                if "#" not in line and not above.strip().startswith("#"):
                    bare.append(f"{path.relative_to(REPOSITORY)}:{number}")
    assert bare == []


TEARDOWN_CONFTEST = """
import pytest
from pytest_tfmem.core.features import Teardown, TeardownStep
from pytest_tfmem.core.manager import manager

EVENTS = []

def step(name):
    def after(item, nextitem):
        EVENTS.append(f"{name} after {item.name}, next {nextitem.name if nextitem else None}")
        return RuntimeError(f"{name} failed {item.name}") if item.name == "test_" + name.lower() else None
    return after

def pytest_configure(config):
    for name in ("LIMIT", "BOOKS"):  # added out of order
        manager(config).add_teardown_step(TeardownStep(Teardown[name], step(name)))

@pytest.fixture
def broken_teardown():
    yield
    raise ValueError("the fixture's own teardown error")

def pytest_sessionfinish():
    print("EVENTS:", "; ".join(EVENTS))
"""


def test_teardown_steps_run_in_teardown_order_and_an_error_fails_the_teardown(pytester: pytest.Pytester):
    pytester.makeconftest(TEARDOWN_CONFTEST)
    pytester.makepyfile(
        "def test_books():\n    pass\n"
        "def test_torn(broken_teardown):\n    pass\n"
        "def test_limit():\n    pass\n"
    )
    result = pytester.runpytest("-s", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, errors=3)
    result.stdout.fnmatch_lines(
        [
            "*EVENTS: BOOKS after test_books, next test_torn; LIMIT after test_books, next test_torn; "
            "BOOKS after test_torn, next test_limit; LIMIT after test_torn, next test_limit; "
            "BOOKS after test_limit, next None; LIMIT after test_limit, next None"
        ]
    )
    text = result.stdout.str()
    # Each error is the teardown's: the step's where one returned it, the fixture's own where it raised.
    assert re.search(r"ERROR at teardown of test_books.*?RuntimeError: BOOKS failed test_books", text, re.DOTALL)
    assert re.search(r"ERROR at teardown of test_torn.*?ValueError: the fixture's own teardown error", text, re.DOTALL)
    assert re.search(r"ERROR at teardown of test_limit.*?RuntimeError: LIMIT failed test_limit", text, re.DOTALL)
