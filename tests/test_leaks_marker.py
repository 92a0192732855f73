"""The ``tfmem_leak`` marker: repeats the body, not the fixtures; reports like the fixture."""

from __future__ import annotations

import pytest
from conftest import inline_run_records

MARKED_TESTS = """
import numpy as np
import pytest

COUNTS = {"fixture set-ups": 0, "body calls": 0}

@pytest.fixture
def store():
    COUNTS["fixture set-ups"] += 1
    return []

@pytest.mark.tfmem_leak(iterations=4, warmup=2, max_growth="500KB")
def test_marker_body_leaks(store):
    COUNTS["body calls"] += 1
    store.append(np.ones(10**6, dtype=np.uint8))

def test_counts_after_the_marked_test():
    assert COUNTS == {"fixture set-ups": 1, "body calls": 6}

KEPT = []

def test_fixture_form_leaks(tfmem):
    tfmem.assert_no_leak(lambda: KEPT.append(np.ones(10**6, dtype=np.uint8)), iterations=4, warmup=2, max_growth="500KB")

@pytest.mark.tfmem_leak
def test_marker_flat_with_defaults(store):
    scratch = np.ones(10**6, dtype=np.uint8)
    del scratch
"""


@pytest.mark.linux  # malloc_trim hands freed heap back before each reading
def test_the_marker_repeats_the_body_without_rerunning_fixtures_and_reports_like_the_fixture(pytester: pytest.Pytester):
    pytester.makepyfile(test_marked=MARKED_TESTS)
    reprec, records = inline_run_records(pytester, "-p", "no:cacheprovider", "--tfmem-trace=off")
    passed, _, failed = reprec.listoutcomes()
    assert [r.nodeid.split("::")[1] for r in failed] == ["test_marker_body_leaks", "test_fixture_form_leaks"]
    assert [r.nodeid.split("::")[1] for r in passed] == ["test_counts_after_the_marked_test", "test_marker_flat_with_defaults"]

    # each failure's block: its lines, then the line naming what the figures count
    marker_failure, fixture_failure = ("\n".join(r.longrepr.reprtraceback.reprentries[0].lines[:-1]) for r in failed)
    for message in (marker_failure, fixture_failure):
        lines = message.splitlines()
        assert lines[0].startswith("tfmem: leak: +9")
        assert lines[0].endswith("KiB per iteration > max_growth 488.3 KiB (robust slope over 4 measured iterations after 2 warmup)")
        assert [line.split("  ")[1] for line in lines[1:]] == [
            "growth per iteration", "growing types", "growing containers", "host RSS readings"]
    assert "list 'store' holding ndarray (2 -> 6)" in marker_failure
    assert "list 'KEPT' (global of test_marked) holding ndarray (2 -> 6)" in fixture_failure

    for name in ("test_marker_body_leaks", "test_fixture_form_leaks"):
        leak = records[name].extra["leak"]
        assert leak["leaked"] and 0.9e6 < leak["growth_per_iteration"] < 1.15e6
        assert leak["iterations"] == 4 and leak["warmup"] == 2 and leak["max_growth"] == 500_000
        assert len(leak["series"]["host"]) == 5 and set(leak["slopes"]) == {"host"}
    flat = records["test_marker_flat_with_defaults"].extra["leak"]
    assert not flat["leaked"] and flat["iterations"] == 10 and flat["warmup"] == 3 and flat["max_growth"] == 10**6
    assert [v.check for v in records["test_marker_body_leaks"].verdicts if not v.ok] == ["leak"]


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("tfmem_leak(iterations=1)", "invalid iterations 1: expected a whole number >= 2 (a slope needs two readings)"),
        ("tfmem_leak(warmup=-1)", "invalid warmup -1: expected a whole number >= 0"),
        ("tfmem_leak(max_growth='1XB')", "invalid max_growth '1XB': expected a non-negative number of bytes or a number with a unit*"),
        ("tfmem_leak(iteration=5)", "unknown argument 'iteration'; accepted: iterations, warmup, max_growth"),
        ("tfmem_leak(10)", "takes keyword arguments only (iterations, warmup, max_growth), got (10,)"),
    ],
)
def test_bad_marker_arguments_are_usage_errors_naming_the_value(pytester: pytest.Pytester, marker, message):
    pytester.makepyfile(test_bad=f"""
        import pytest

        @pytest.mark.{marker}
        def test_loop():
            pass
        """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-tfmem: test_bad.py::test_loop: @pytest.mark.tfmem_leak*{message}"])


def test_an_exception_in_the_body_fails_the_test_at_once(pytester: pytest.Pytester):
    pytester.makepyfile(test_raises="""
        import pytest

        CALLS = []

        @pytest.mark.tfmem_leak(iterations=3, warmup=1)
        def test_loop():
            CALLS.append(1)
            if len(CALLS) == 2:
                raise KeyError("second call")

        def test_calls():
            assert len(CALLS) == 2
        """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfmem-trace=off")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*KeyError: 'second call'"])


def test_the_marker_is_registered(pytester: pytest.Pytester):
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.tfmem_leak(iterations=10, warmup=3, max_growth='1MB'): *"])
