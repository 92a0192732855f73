"""Tolerances, comparisons, baseline files and atomic writes, without running pytest."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from pytest_tfmem.core.measure import Measurement, ViewReading
from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.files import write_text_atomic
from pytest_tfmem.gates.baseline import (
    Baseline,
    BaselineEntry,
    BaselineError,
    Spread,
    load_baseline,
    save_baseline,
)
from pytest_tfmem.gates.compare import (
    IMPROVEMENT,
    NEW,
    REGRESSION,
    WITHIN,
    baseline_verdict,
    compare,
)
from pytest_tfmem.leaks.check import leak_check
from pytest_tfmem.units import Tolerance, parse_tolerance

MIB = 2**20


def measured(peak: int, gpu: int | None = None, gpu_view: str = "tf:GPU:0") -> Measurement:
    views = [ViewReading("host", 1000, 1000 + peak, 1000)]
    if gpu is not None:
        views.append(ViewReading(gpu_view, 0, gpu, 0))
    return Measurement(tuple(views), 0.1)


@pytest.mark.parametrize(
    ("text", "fraction", "size"),
    [
        ("10%", 0.10, None),
        ("2.5 %", 0.025, None),
        ("16MB", None, 16 * 10**6),
        ("64MiB", None, 64 * MIB),
        ("10%+16MB", 0.10, 16 * 10**6),
        ("16MB + 10%", 0.10, 16 * 10**6),
        ("0%", 0.0, None),
    ],
)
def test_tolerance_forms(text, fraction, size):
    tolerance = parse_tolerance(text)
    assert (tolerance.fraction, tolerance.size) == (fraction, size)


@pytest.mark.parametrize("bad", ["", "10", "10%%", "-5%", "10%+20%", "1MB+2MB", "10%+", "ten percent", 10, 0.1, None, True])
def test_bad_tolerance_names_the_value_and_the_forms(bad):
    with pytest.raises(ValueError) as error:
        parse_tolerance(bad, "--tfmem-tolerance value")
    assert f"invalid --tfmem-tolerance value {bad!r}" in str(error.value)
    assert "'10%+16MB'" in str(error.value)


def test_percentage_and_size_add_up():
    assert parse_tolerance("10%+16MB").allowance(1000 * 10**6) == 116 * 10**6
    assert parse_tolerance("10%").allowance(0) == 0


@pytest.mark.parametrize(
    ("now", "status", "message"),
    [
        (812, REGRESSION, "peak 812.0 MiB vs baseline 640.0 MiB (+26.9% > 10%)"),
        (650, WITHIN, "peak 650.0 MiB vs baseline 640.0 MiB (+1.6%, within 10%)"),
        (500, IMPROVEMENT, "peak 500.0 MiB vs baseline 640.0 MiB (-21.9%, more than 10% below)"),
    ],
)
def test_comparison_statuses_and_messages(now, status, message):
    (comparison,) = compare("t", measured(now * MIB), BaselineEntry(640 * MIB), parse_tolerance("10%"))
    assert comparison.status == status
    assert comparison.message() == message
    assert baseline_verdict([comparison]).ok is (status != REGRESSION)


def test_size_tolerance_message_shows_bytes():
    (comparison,) = compare("t", measured(812 * MIB), BaselineEntry(640 * MIB), parse_tolerance("10%+16MB"))
    assert comparison.message() == "peak 812.0 MiB vs baseline 640.0 MiB (+26.9%, +172.0 MiB > 10%+16MB)"


def test_a_test_without_entry_is_new_and_passes():
    comparisons = compare("t", measured(5 * MIB), None, parse_tolerance("10%"))
    assert [c.status for c in comparisons] == [NEW]
    verdict = baseline_verdict(comparisons)
    assert verdict.ok and verdict.message == "peak 5.0 MiB: no baseline entry, not compared"


def test_gpu_views_are_held_to_their_own_baseline():
    entry = BaselineEntry(100 * MIB, {"host": 100 * MIB, "tf:GPU:0": 200 * MIB})
    comparisons = compare("t", measured(100 * MIB, gpu=400 * MIB), entry, parse_tolerance("10%"))
    assert {c.quantity: c.status for c in comparisons} == {"peak": WITHIN, "tf:GPU:0": REGRESSION}
    verdict = baseline_verdict(comparisons)
    assert not verdict.ok and verdict.message.startswith("GPU:0 peak 400.0 MiB vs baseline 200.0 MiB (+100.0% > 10%)")


@pytest.mark.parametrize("view", ["jax:gpu:0", "torch:cuda:0"])
def test_jax_and_pytorch_gpu_views_are_held_to_their_own_baseline_too(view: str):
    entry = BaselineEntry(100 * MIB, {"host": 100 * MIB, view: 200 * MIB, "nvml:0": 900 * MIB})
    assert entry.quantities() == {"peak": 100 * MIB, view: 200 * MIB}  # NVML's pool is not held
    comparisons = compare("t", measured(100 * MIB, gpu=400 * MIB, gpu_view=view), entry, parse_tolerance("10%"))
    assert {c.quantity: c.status for c in comparisons} == {"peak": WITHIN, view: REGRESSION}
    device = view.split(":", 1)[1]
    assert baseline_verdict(comparisons).message.startswith(f"{device} peak 400.0 MiB vs baseline 200.0 MiB")


def record(nodeid: str, peak: int, outcome: str = "passed", extra: dict | None = None) -> TestRecord:
    return TestRecord(nodeid, measured(peak), outcome=outcome, extra=extra or {})


def test_merge_keeps_tests_not_run_updates_passed_ones_and_skips_failed_ones():
    old = Baseline({"a": BaselineEntry(1), "b": BaselineEntry(2), "c": BaselineEntry(3)})
    merged = old.merged([record("a", 10), record("b", 20, "failed"), record("d", 40)])
    assert {k: v.peak for k, v in merged.tests.items()} == {"a": 10, "b": 2, "c": 3, "d": 40}
    assert merged.tests["a"].views == {"host": 10}
    assert merged.environment["python"]
    pruned = old.merged([record("a", 10)], prune=True)
    assert set(pruned.tests) == {"a"}


@pytest.mark.linux  # malloc_trim hands freed heap back before each reading
def test_leak_growth_of_a_real_leak_check_is_saved_as_the_leak_slope(tmp_path):
    kept = []
    report = leak_check(lambda: kept.append(np.ones(2 * MIB // 8)), iterations=6, warmup=1, max_growth="100MB")
    assert report.growth_per_iteration > 1.5 * MIB  # 2 MiB kept per call
    path = tmp_path / "b.json"
    save_baseline(Baseline().merged([record("t::a", 10 * MIB, extra={"leak": report.to_dict()})]), path)
    data = json.loads(path.read_text())
    assert data["format"] == "pytest-tfmem-baseline" and data["version"] == 1
    entry = {"peak": 10 * MIB, "views": {"host": 10 * MIB}, "leak_slope": report.growth_per_iteration}
    assert data["tests"]["t::a"] == entry
    assert load_baseline(path).tests["t::a"] == BaselineEntry(10 * MIB, {"host": 10 * MIB}, report.growth_per_iteration)


def test_missing_file_is_an_empty_baseline_only_when_allowed(tmp_path):
    assert load_baseline(tmp_path / "none.json", missing_ok=True).tests == {}
    with pytest.raises(BaselineError, match="none.json'.*no such file"):
        load_baseline(tmp_path / "none.json")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"format": "pytest-tfmem-baseline", "version": 1, "tests": []}, '"tests" must be an object'),
        ({"format": "pytest-tfmem-baseline", "version": 1, "tests": {"t": {"peak": -1}}}, "must be a whole number"),
        ({"format": "pytest-tfmem-baseline", "version": 1, "tests": {"t": {"peak": 1, "views": {"h": 1.5}}}}, '"views"'),
        ({"format": "pytest-tfmem-baseline", "version": "1", "tests": {}}, "version '1' is not supported"),
        ([1, 2], "not a pytest-tfmem baseline"),
    ],
)
def test_invalid_contents_name_the_problem(tmp_path, data, problem):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BaselineError) as error:
        load_baseline(path)
    assert problem in str(error.value) and str(path) in str(error.value)


def test_failed_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "b.json"
    path.write_text("old contents")
    os.chmod(path, 0o640)

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(path, "new contents")
    assert path.read_text() == "old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["b.json"]
    monkeypatch.undo()
    write_text_atomic(path, "new contents")
    assert path.read_text() == "new contents"
    assert path.stat().st_mode & 0o777 == 0o640  # permissions kept


def test_tolerance_prints_as_written():
    assert str(parse_tolerance("10% + 16MB")) == "10%+16MB"
    assert str(Tolerance(0.1, 16 * MIB)) == "10%+16.0 MiB"


def test_environment_names_the_gpus_through_nvml(monkeypatch):
    from fake_nvml import FakeGpu, FakeNvml

    from pytest_tfmem.gates.environment import current_environment, environment_differences

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu("Fake H100", 80 * 2**30)]))
    with_gpu = current_environment()
    assert with_gpu["gpus"] == ["Fake H100"]
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    without = current_environment()
    assert without["gpus"] == []
    assert environment_differences(with_gpu, without) == ["gpus Fake H100 in the baseline, none here"]


def test_a_figure_inside_the_spread_of_the_baselines_runs_is_no_regression_whatever_the_tolerance():
    runs = BaselineEntry(peak=27 * MIB, spread=Spread(5, {"peak": (25 * MIB, 33 * MIB)}))
    exact = parse_tolerance("0%")
    (inside,) = compare("t.py::test_fit", measured(32 * MIB), runs, exact)
    assert inside.status == WITHIN and inside.inside_spread
    assert inside.message() == "peak 32.0 MiB vs baseline 27.0 MiB (+18.5%, inside the spread of its runs, 25.0 MiB - 33.0 MiB)"
    (beyond,) = compare("t.py::test_fit", measured(34 * MIB), runs, exact)
    assert beyond.status == REGRESSION
    assert beyond.message().endswith("(+25.9% > 0%; its runs read 25.0 MiB - 33.0 MiB)")
    (below,) = compare("t.py::test_fit", measured(24 * MIB), runs, exact)
    assert below.status == IMPROVEMENT
    # without a spread, the same figure against the same median is a regression
    (single,) = compare("t.py::test_fit", measured(32 * MIB), BaselineEntry(peak=27 * MIB), exact)
    assert single.status == REGRESSION


def test_a_spread_survives_the_file_and_a_bad_or_missing_one_reads_as_before(tmp_path):
    path = tmp_path / "baseline.json"
    kept = Spread(3, {"peak": (25 * MIB, 33 * MIB), "retained": (0, 2 * MIB)})
    save_baseline(Baseline(tests={"t.py::test_fit": BaselineEntry(27 * MIB, retained=MIB, spread=kept)}), path)
    assert load_baseline(path).tests["t.py::test_fit"].spread == kept
    data = json.loads(path.read_text())
    for bad in ({"runs": 3, "peak": [33, 25]}, {"runs": "3", "peak": [1, 2]}, {"runs": 1, "peak": [1, 2]}, [1, 2], None):
        data["tests"]["t.py::test_fit"]["spread"] = bad
        path.write_text(json.dumps(data))
        entry = load_baseline(path).tests["t.py::test_fit"]
        assert (entry.peak, entry.spread) == (27 * MIB, None)


def test_merge_with_prefer_spread_keeps_the_runs_median_and_spread():
    from pytest_tfmem.gates.merge import Shard, merge_shards

    runs = [Shard(f"r{n}.json", "report", {"t.py::test_fit": BaselineEntry(peak * MIB, retained=kept * MIB)}, {})
            for n, (peak, kept) in enumerate([(27, 1), (33, 3), (25, 2)])]
    runs.append(Shard("r3.json", "report", {"t.py::test_other": BaselineEntry(5 * MIB)}, {}))
    merged = merge_shards(runs, prefer="spread").baseline.tests
    assert merged["t.py::test_fit"] == BaselineEntry(
        27 * MIB, retained=2 * MIB, spread=Spread(3, {"peak": (25 * MIB, 33 * MIB), "retained": (MIB, 3 * MIB)}))
    assert merged["t.py::test_other"].spread is None  # measured once: no spread
    again = merge_shards([Shard("m.json", "baseline", merged, {}), runs[0]], prefer="spread").baseline.tests
    assert again["t.py::test_fit"].spread == Spread(4, {"peak": (25 * MIB, 33 * MIB), "retained": (MIB, 3 * MIB)})
