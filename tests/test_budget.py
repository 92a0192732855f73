"""Budgets: exact spike capture, marker/ini/CLI precedence, exemption, the failure message."""

from __future__ import annotations

import pytest
from conftest import inline_run_records

SPIKE_TESTS = """
import time
import numpy as np
import pytest

@pytest.mark.parametrize("run", range(20))
def test_spike(run):
    block = np.ones(250 * 10**6, dtype=np.uint8)  # 250 MB, touched
    time.sleep(0.005)
    del block
"""


def test_a_5ms_spike_of_250MB_fails_a_200MB_budget_in_20_of_20_runs(pytester: pytest.Pytester):
    pytester.makepyfile(SPIKE_TESTS)
    result = pytester.runpytest("--tfmem-budget=200MB")
    result.assert_outcomes(failed=20)
    result.stdout.fnmatch_lines(["tfmem: peak 238.* MiB > budget 200MB (190.7 MiB) (host RSS 238.* MiB*)"])


def test_the_same_spike_passes_a_400MB_budget_in_20_of_20_runs(pytester: pytest.Pytester):
    pytester.makepyfile(SPIKE_TESTS)
    reprec, records = inline_run_records(pytester, "--tfmem-budget=400MB")
    reprec.assertoutcome(passed=20)
    peaks = [record.measurement.peak for record in records.values()]
    assert len(peaks) == 20
    assert all(245 * 10**6 <= peak <= 270 * 10**6 for peak in peaks), peaks


ALLOCATE_300MB = """
import numpy as np
import pytest

def allocate():
    block = np.ones(300 * 10**6, dtype=np.uint8)
    del block

def test_global():
    allocate()

@pytest.mark.tfmem(budget="500MB")
def test_marker_raises_the_budget():
    allocate()

@pytest.mark.tfmem(budget="100MB")
def test_marker_lowers_the_budget():
    allocate()

@pytest.mark.tfmem(budget=None)
def test_exempt():
    allocate()
"""


def test_marker_overrides_global_and_none_exempts(pytester: pytest.Pytester):
    pytester.makepyfile(ALLOCATE_300MB)
    reprec, records = inline_run_records(pytester, "--tfmem-budget=200MB")
    passed, _, failed = reprec.listoutcomes()
    assert sorted(r.nodeid.split("::")[1] for r in failed) == ["test_global", "test_marker_lowers_the_budget"]
    assert sorted(r.nodeid.split("::")[1] for r in passed) == ["test_exempt", "test_marker_raises_the_budget"]
    assert records["test_exempt"].budget is None
    assert records["test_marker_raises_the_budget"].budget == 500 * 10**6


def test_ini_applies_when_the_option_is_absent(pytester: pytest.Pytester):
    pytester.makepyfile(ALLOCATE_300MB)
    pytester.makeini("[pytest]\ntfmem_budget = 200MB\n")
    result = pytester.runpytest("-k", "test_global")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*peak * > budget 200MB (190.7 MiB)*"])


def test_pyproject_ini_and_the_command_line_wins(pytester: pytest.Pytester):
    pytester.makepyfile(ALLOCATE_300MB)
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\ntfmem_budget = "200MB"\n')
    pytester.runpytest("-k", "test_global").assert_outcomes(failed=1)
    pytester.runpytest("-k", "test_global", "--tfmem-budget=1GB").assert_outcomes(passed=1)


def test_budget_failure_can_be_named_by_xfail_and_raises(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import numpy as np
        import pytest
        from pytest_tfmem import BudgetExceeded

        @pytest.mark.xfail(strict=True, raises=BudgetExceeded)
        @pytest.mark.tfmem(budget="50MB")
        def test_problem_is_caught():
            np.ones(100 * 10**6, dtype=np.uint8)

        @pytest.mark.xfail(strict=True, raises=BudgetExceeded)
        @pytest.mark.tfmem(budget="500MB")
        def test_problem_no_longer_caught():
            np.ones(100 * 10**6, dtype=np.uint8)
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(xfailed=1, failed=1)
    result.stdout.fnmatch_lines(["*XPASS(strict)*"])


def test_an_inner_measure_window_does_not_hide_the_tests_peak(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import numpy as np

        def test_nested(tfmem):
            big = np.ones(300 * 10**6, dtype=np.uint8)
            del big
            with tfmem.measure() as m:
                small = np.ones(20 * 10**6, dtype=np.uint8)
                del small
            assert 19 * 10**6 < m.peak < 40 * 10**6
            assert tfmem.peak() > 290 * 10**6
        """
    )
    result = pytester.runpytest("--tfmem-budget=200MB")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*peak 28*.* MiB > budget 200MB (190.7 MiB)*"])


def test_a_failing_test_keeps_its_own_error_and_gets_the_numbers(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import numpy as np

        def test_broken():
            block = np.ones(300 * 10**6, dtype=np.uint8)
            assert block.sum() == 0, "wrong sum"
        """
    )
    result = pytester.runpytest("--tfmem-budget=100MB")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*AssertionError: wrong sum*", "*- tfmem -*", "*test_broken*28*.* MiB*"])
    result.stdout.no_fnmatch_line("*BudgetExceeded*")


def test_inert_without_options_markers_or_fixture(pytester: pytest.Pytester):
    pytester.makepyfile("def test_plain():\n    assert True\n")
    reprec, records = inline_run_records(pytester)
    reprec.assertoutcome(passed=1)
    assert records == {}
    result = pytester.runpytest()
    result.stdout.no_fnmatch_line("*tfmem:*")
    result.stdout.no_fnmatch_line("*peak memory need*")


def test_summary_table_lists_heaviest_first(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import numpy as np
        def test_light():
            np.ones(30 * 10**6, dtype=np.uint8)
        def test_heavy():
            np.ones(120 * 10**6, dtype=np.uint8)
        """
    )
    result = pytester.runpytest("--tfmem-budget=1GiB")
    result.stdout.fnmatch_lines(
        [
            "*tfmem: peak memory need per test (heaviest first)*",
            "test * peak * host RSS * budget * use * result",
            "*test_heavy * 11*.* MiB * 1.0 GiB * 1*% * passed",
            "*test_light * 2*.* MiB * 1.0 GiB * 3% * passed",
        ]
    )


@pytest.mark.linux  # malloc_trim hands freed heap back before each reading
def test_fixture_measure_current_and_clean(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import numpy as np

        def test_fixture(tfmem):
            with tfmem.measure() as m:
                block = np.ones(100 * 10**6, dtype=np.uint8)
                del block
            assert 95 * 10**6 <= m.peak <= 110 * 10**6
            assert m.host == m.peak
            # 100 MB of small arrays, each followed by a small survivor
            pairs = [(np.ones(10**5, dtype=np.uint8), bytearray(64)) for _ in range(1000)]
            assert tfmem.current() > 90 * 10**6
            survivors = [small for _, small in pairs]
            del pairs
            before = tfmem.current()
            report = tfmem.clean()
            after = tfmem.current()
            assert after < 20 * 10**6  # the freed arrays are no longer resident
            assert abs(report.freed - (before - after)) < 2 * 10**6, (report, before, after)
            assert "malloc_trim(0)" in str(report) and "freed" in str(report)
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


ONE_SPIKE = """
import numpy as np

def test_spike():
    block = np.ones(300 * 10**6, dtype=np.uint8)
    del block
"""


def test_the_failure_shows_its_figures_first_and_ends_pointing_at_what_they_count(pytester: pytest.Pytester):
    from pathlib import Path

    from pytest_tfmem.errors import FIGURES_HELP

    pytester.makepyfile(test_one=ONE_SPIKE)
    result = pytester.runpytest("--tfmem-budget=200MB")
    result.assert_outcomes(failed=1)
    summary = next(line for line in result.outlines if line.startswith("FAILED "))
    assert summary[:80].startswith("FAILED test_one.py::test_spike - tfmem: peak 28")  # no exception path first
    block = result.stdout.str().split("_ test_spike _")[1].splitlines()
    assert block[1].startswith("tfmem: peak 28") and block[4] == FIGURES_HELP
    assert block[2].startswith("tfmem: reproduced by a re-run in the same process: first run 28")  # both runs' figures
    assert block[3].startswith("tfmem: what used it: mostly host memory outside the frameworks' allocators")
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme.split("### What each figure counts", 1)[1].split("\n## ", 1)[0]
    for figure in ("`--tfmem-budget`", "`kill_at`", "`--tfmem-session-limit`", "`tfmem run --budget`",
                   "`tfmem run --kill-at`", "`max_growth=`", "`--tfmem-max-retained`", "a baseline"):
        assert f"| {figure}" in table or f"{figure}," in table, figure


def test_a_budget_failure_says_what_used_the_memory_and_the_line_where_the_re_run_traced_it(
    pytester: pytest.Pytester,
):
    pytester.makepyfile(test_one=ONE_SPIKE)
    plain = pytester.runpytest("--tfmem-budget=200MB", "-p", "no:randomly")
    plain.stdout.fnmatch_lines([
        "tfmem: what used it: mostly host memory outside the frameworks' allocators (NumPy arrays, Python objects, "
        "native libraries): host RSS 28?.? MiB of 28?.? MiB; for the line, run the test with --tfmem-explain",
    ])
    explained = pytester.runpytest("--tfmem-budget=200MB", "-p", "no:randomly", "--tfmem-explain")
    explained.stdout.fnmatch_lines([
        "tfmem: what used it: mostly host memory * the line that needed the most: "
        "test_one.py:4 `block = np.ones(300 * 10**6, dtype=np.uint8)` +28?.? MiB",
    ])
    assert "what used it" not in next(line for line in explained.outlines if line.startswith("FAILED "))


def test_what_used_it_names_the_larger_part_by_the_figures_of_the_same_message():
    """Host RSS counts TensorFlow's allocator too: what lies outside is RSS less the allocator's share."""
    from pytest_tfmem.core.measure import Measurement, ViewReading
    from pytest_tfmem.core.verdict import what_used

    mib = 2**20

    def reading(host: float, tensors: float | None) -> Measurement:
        views = [ViewReading("host", 0, int(host * mib), 0)]
        if tensors is not None:
            views.append(ViewReading("tf:CPU:0", 0, int(tensors * mib), 0))
        return Measurement(tuple(views), 0.1)

    # the message said host RSS 61.7 MiB, TF CPU:0 allocator 30.5 MiB, then "mostly host memory ... 61.7 of 61.7"
    assert what_used(reading(61.7, 30.5)) == (
        "mostly host memory outside the frameworks' allocators (NumPy arrays, Python objects, native libraries): "
        "31.2 MiB of 61.7 MiB (host RSS 61.7 MiB, less the TF CPU:0 allocator's 30.5 MiB)")
    assert what_used(reading(61.7, 40.0)) == "mostly tensors: the TF CPU:0 allocator 40.0 MiB of 61.7 MiB"
    # tensors served from TensorFlow's pool: the allocator's figure is the peak, RSS barely moved
    assert what_used(reading(0.5, 80.0)) == "mostly tensors: the TF CPU:0 allocator 80.0 MiB of 80.0 MiB"
    assert what_used(reading(40.0, None)).endswith("host RSS 40.0 MiB of 40.0 MiB")
