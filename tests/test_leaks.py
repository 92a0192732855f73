"""Leak checks without TensorFlow: the verdict on synthetic loops, the slope, the diagnosis."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import inline_run_records

from pytest_tfmem import LeakDetected, LeakReport, leak_check
from pytest_tfmem.leaks.check import theil_sen_slope

SYNTHETIC_LOOPS = """
import numpy as np
import pytest

KEPT = []

@pytest.fixture(autouse=True)
def forget_what_was_kept():
    yield
    KEPT.clear()

def leaking_step():
    scratch = np.ones(2 * 10**6, dtype=np.uint8)      # temporary work, dropped
    KEPT.append(np.ones(10**6, dtype=np.uint8))       # 1 MB kept per iteration
    del scratch

def flat_step():
    scratch = np.ones(2 * 10**6, dtype=np.uint8)
    result = np.ones(10**6, dtype=np.uint8)           # the same 1 MB, dropped
    del scratch, result

@pytest.mark.parametrize("run", range(20))
def test_leaking_loop(tfmem, run):
    tfmem.assert_no_leak(leaking_step, iterations=10, warmup=3, max_growth="500KB")

@pytest.mark.parametrize("run", range(20))
def test_flat_loop(tfmem, run):
    tfmem.assert_no_leak(flat_step, iterations=10, warmup=3, max_growth="500KB")
"""


@pytest.mark.longest
@pytest.mark.slow  # 20 sessions of 20 iterations each: 25-50 s on two cores
def test_a_1MB_per_iteration_leak_is_flagged_and_a_flat_loop_passes_in_20_of_20_runs(pytester: pytest.Pytester):
    pytester.makepyfile(SYNTHETIC_LOOPS)
    reprec, records = inline_run_records(pytester, "-p", "no:cacheprovider", "--tfmem-trace=off")
    passed, _, failed = reprec.listoutcomes()
    assert {r.nodeid.split("::")[-1] for r in failed} == {f"test_leaking_loop[{run}]" for run in range(20)}
    assert len(passed) == 20 and all("test_flat_loop" in r.nodeid for r in passed)
    assert all(r.longrepr.reprcrash.message.startswith("tfmem: leak: +") for r in failed)

    growth = {name: record.extra["leak"]["growth_per_iteration"] for name, record in records.items()}
    leaking = [g for name, g in growth.items() if name.startswith("test_leaking_loop")]
    flat = [g for name, g in growth.items() if name.startswith("test_flat_loop")]
    print(f"leaking: {min(leaking):.0f}..{max(leaking):.0f} B/iter; flat: {min(flat):.0f}..{max(flat):.0f} B/iter")
    assert len(leaking) == len(flat) == 20
    assert all(0.9e6 <= g <= 1.15e6 for g in leaking), leaking  # the 1 MB kept, read back
    assert all(abs(g) <= 100e3 for g in flat), flat


@pytest.mark.linux  # malloc_trim hands freed heap back before each reading
def test_the_failure_shows_the_growth_the_readings_and_the_growing_list(pytester: pytest.Pytester):
    pytester.makepyfile(test_loops=SYNTHETIC_LOOPS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--tfmem-trace=off", "test_loops.py::test_leaking_loop[0]")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "tfmem: leak: +9* KiB per iteration > max_growth 488.3 KiB (robust slope over 10 measured iterations after 3 warmup)",
        "  growth per iteration  host RSS +9* KiB",
        "  growing types         none: the growth is not in gc-tracked Python objects *",
        "  growing containers    +1 items per iteration: list 'KEPT' (global of test_loops) holding ndarray (3 -> 13)",
        "  host RSS readings     *, then +* MiB",
        "FAILED test_loops.py::test_leaking_loop* - tfmem: *",
    ])
    # each reading 1 MB (0.95 MiB) above the one before it, to a rounding either way: +0.9 +1.9 +2.8 ...
    readings = next(line for line in result.outlines if line.startswith("  host RSS readings"))
    steps = [float(figure) for figure in readings.split(", then ")[1].removesuffix(" MiB").split()]
    assert len(steps) == 10 and all(abs(step - 0.954 * (n + 1)) < 0.1 for n, step in enumerate(steps)), readings


class Payload:
    pass


class Record:
    def __init__(self) -> None:
        self.payload = [Payload() for _ in range(3)]


RECORDS: list[Record] = []


def test_growing_object_types_are_named_most_telling_first():
    RECORDS.clear()
    report = leak_check(lambda: RECORDS.append(Record()), iterations=5, warmup=1)
    RECORDS.clear()
    types = {growth.label: growth.per_iteration for growth in report.diagnosis.types}
    assert types["Record"] == 1 and types["Payload"] == 3
    assert [g.label for g in report.diagnosis.types][:1] == ["Record"]  # user types before builtins
    assert "growing types         +1 Record, +3 Payload, " in report.describe()
    assert report.diagnosis.containers[0].label == f"list 'RECORDS' (global of {__name__}) holding Record"
    assert report.diagnosis.function_library is None  # TensorFlow is not loaded here
    assert not report.leaked  # a few hundred bytes per iteration are under 1 MB


def test_a_one_off_growth_is_not_a_trend():
    """A cache that fills once (at the third measured iteration) is not reported as growing."""
    calls = []
    cache: dict[int, Record] = {}

    def step():
        calls.append(1)
        if len(calls) == 6:
            cache.update({i: Record() for i in range(50)})

    report = leak_check(step, iterations=6, warmup=3)
    assert "Record" not in {growth.label for growth in report.diagnosis.types}
    assert report.diagnosis.containers == () or all("Record" not in c.label for c in report.diagnosis.containers)


def test_theil_sen_slope_reads_a_steady_trend_through_outliers():
    steady = [1000 + 500 * i for i in range(11)]
    assert theil_sen_slope(steady) == 500
    spiky = list(steady)
    spiky[3] += 40_000  # two readings far off (a transient cache, a late free)
    spiky[8] -= 40_000
    assert theil_sen_slope(spiky) == 500
    assert theil_sen_slope([7, 7, 7, 7]) == 0
    assert theil_sen_slope([7]) == 0


def test_a_single_noisy_jump_does_not_make_a_flat_series_a_leak():
    flat_with_jump = [100_000_000] * 5 + [100_000_000 + 2_000_000] * 6  # one +2 MB step midway
    report = LeakReport(10, 3, 10**6, {"host": tuple(flat_with_jump)}, {"host": theil_sen_slope(flat_with_jump)})
    assert report.growth_per_iteration < 10**6
    assert not report.leaked


def test_report_round_trips_through_its_dict():
    RECORDS.clear()
    report = leak_check(lambda: RECORDS.append(Record()), iterations=3, warmup=0, max_growth=0)
    RECORDS.clear()
    again = LeakReport.from_dict(report.to_dict())
    assert again == report
    assert again.describe() == report.describe()


def test_leak_check_inside_a_measured_block_keeps_the_block_peak(tfmem):
    """Leak-check readings reset no peak: an enclosing window still sees the loop's spikes."""
    def spike():
        block = np.ones(60 * 10**6, dtype=np.uint8)
        del block

    with tfmem.measure() as outer:
        report = leak_check(spike, iterations=3, warmup=1)
    assert not report.leaked
    assert outer.host >= 55 * 10**6


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"iterations": 1}, "invalid iterations 1: expected a whole number >= 2"),
        ({"iterations": True}, "invalid iterations True: expected a whole number >= 2"),
        ({"iterations": "10"}, "invalid iterations '10': expected a whole number >= 2"),
        ({"warmup": -1}, "invalid warmup -1: expected a whole number >= 0"),
        ({"max_growth": "1XB"}, "invalid max_growth '1XB': expected a non-negative number of bytes"),
        ({"max_growth": -5}, "invalid max_growth -5: expected a non-negative number of bytes"),
    ],
)
def test_bad_arguments_name_the_value_and_what_is_accepted(arguments, message):
    with pytest.raises(ValueError) as error:
        leak_check(lambda: None, **arguments)
    assert str(error.value).startswith(message)


def test_a_function_is_required():
    with pytest.raises(TypeError, match="expected a function to call repeatedly, got 42"):
        leak_check(42)  # type: ignore[arg-type]


def test_assert_no_leak_raises_LeakDetected_with_the_table(tfmem):
    kept = []
    with pytest.raises(LeakDetected) as failure:
        tfmem.assert_no_leak(lambda: kept.append(np.ones(3 * 10**6, dtype=np.uint8)), iterations=4, warmup=1)
    message = str(failure.value)
    assert message.startswith("tfmem: leak: +2.")  # 3 MB = 2.9 MiB
    assert "list 'kept'" in message and "host RSS readings" in message
    assert tfmem.leak_reports[-1].leaked


class WarnsWhenLookedAt:
    """Like ``torch.distributed.reduce_op``: any attribute read, ``__class__`` too, warns."""

    def __getattribute__(self, name: str) -> object:
        warnings.warn("this attribute is deprecated", FutureWarning, stacklevel=2)
        return object.__getattribute__(self, name)


def test_scanning_for_growing_containers_raises_no_warning_from_what_it_looks_at():
    from pytest_tfmem.leaks.diagnosis import _container_lengths

    looked_at = [WarnsWhenLookedAt(), [1, 2], {"a": 1}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lengths = _container_lengths(looked_at, set())
    assert lengths == {id(looked_at[1]): 2, id(looked_at[2]): 1}


LEAKING_SCRIPT = """
from pytest_tfmem import LeakDetected, assert_no_leak

kept = []


def grows():
    kept.append(bytearray(4 * 2**20))


try:
    assert_no_leak(grows, iterations=6, warmup=1, max_growth="1MB")
except Exception as error:  # a script's or a notebook's handler
    print("caught:", type(error).__name__, isinstance(error, LeakDetected), str(error).splitlines()[0][:40])
"""

SWALLOWED_IN_A_TEST = """
from pytest_tfmem import assert_no_leak

kept = []


def test_a_handler_in_the_test_does_not_hide_the_leak():
    try:
        assert_no_leak(lambda: kept.append(bytearray(4 * 2**20)), iterations=6, warmup=1, max_growth="1MB")
    except Exception:
        pass
"""


def test_outside_pytest_a_leak_is_an_exception_and_inside_a_test_it_fails_the_test(pytester: pytest.Pytester):
    import subprocess
    import sys

    script = pytester.path / "leaking.py"
    script.write_text(LEAKING_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and done.stdout.startswith("caught: LeakDetected True tfmem: "), done.stdout + done.stderr
    pytester.makepyfile(test_swallowed=SWALLOWED_IN_A_TEST)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(failed=1)  # as before: a test's own handler does not swallow tfmem's failure
    result.stdout.fnmatch_lines(["tfmem: leak: +4.0 MiB per iteration > max_growth*"])
