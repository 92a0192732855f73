"""Turn the recorded runs into Markdown tables (medians, ratios, counts) and target verdicts."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from benchmarks.contenders import (
    ISOLATION_CONTENDERS,
    LEAK_CONTENDERS,
    MEASURING_CONTENDERS,
    NO_PLUGIN,
    PEAK_CONTENDERS,
    TFMEM,
    Contender,
)
from benchmarks.runner import JobResult
from pytest_tfmem.units import format_size

SPIKE_BYTES = 250 * 10**6
SPIKE_CAUGHT = 0.9 * SPIKE_BYTES  # a reported peak this high includes the spike
ORDER_TOLERANCE = 0.10
OVERHEAD_TARGET = 0.03
LEAK_SIZES_MB = (0.25, 0.5, 1, 2)
# How each leak contender's verdict reads; any other failure is an error, not a detection.
LEAK_VERDICTS = {"tfmem-leak": "tfmem: leak:", "memray-leaks": "allowed to leak", "object-count": "new objects by type"}
NOT_A_PEAK = "n/a: reports no memory figure"

OVERHEAD_WORKLOADS = (
    ("keras_fit.py", "small Keras fit (TensorFlow)"),
    ("numpy_heavy.py", "numpy-heavy (no TensorFlow)"),
)
ORDER_TESTS = (
    ("order_numpy.py", "test_numpy_arrays", "numpy heap: 300 MB of 100 KB arrays"),
    ("order_tf.py", "test_tf_tensors", "TensorFlow: 300 MB of tensors"),
    ("order_mixed.py", "test_mixed", "mixed: 300 MB of NumPy data held while 300 MB of tensors are made"),
)
ISOLATION_WORKLOADS = (("isolation_numpy.py", "numpy-only tests"), ("isolation_tf.py", "tests importing TensorFlow"))


@dataclass
class Results:
    jobs: list[JobResult]
    references: dict[tuple[str, str], list[int]]  # (workload, test) -> fresh-process peaks

    def tests(self, section: str, contender: Contender, workload: str | None = None, variant: str | None = None):
        for result in self.jobs:
            job = result.job
            if (job.section, job.contender) != (section, contender):
                continue
            if (workload is None or job.workload == workload) and (variant is None or job.variant == variant):
                yield from result.tests

    def walls(self, section: str, contender: Contender, workload: str) -> list[tuple[float, int]]:
        """(process seconds, tests in the session) of each matching job."""
        return [
            (r.wall_s, int(dict(r.job.sizes)["TFMEM_BENCH_TESTS"]))
            for r in self.jobs
            if (r.job.section, r.job.contender, r.job.workload) == (section, contender, workload)
        ]

    def has(self, section: str) -> bool:
        return any(result.job.section == section for result in self.jobs)


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def _percent(ratio: float) -> str:
    return f"{ratio * 100:+.1f}%"


def _relative_error(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return abs(value - reference) / reference


def _error_cell(error: float | None) -> str:
    return "n/a" if error is None else f"{error * 100:.0f}%"


def overhead_medians(
    results: Results, workload: str, figure: str = "seconds"
) -> dict[Contender, tuple[float | None, int]]:
    """Median of ``figure`` (``seconds`` or ``cpu_seconds``) over passing tests, and their count."""
    medians = {}
    for contender in PEAK_CONTENDERS:
        values = [t[figure] for t in results.tests("overhead", contender, workload) if t["outcome"] == "passed"]
        medians[contender] = (_median(values), len(values))
    return medians


def overhead_section(results: Results) -> list[str]:
    rows = []
    for workload, label in OVERHEAD_WORKLOADS:
        for figure, what in (("seconds", "test time"), ("cpu_seconds", "CPU time")):
            medians = overhead_medians(results, workload, figure)
            base, count = medians[NO_PLUGIN]
            if base is None:
                continue
            row = [f"{label}: {what}, median of {count} tests"]
            for contender in PEAK_CONTENDERS:
                median, _ = medians[contender]
                if median is None:
                    row.append("n/a: no passing run")
                elif contender is NO_PLUGIN:
                    row.append(f"{median:.3f} s")
                else:
                    row.append(f"{median:.3f} s ({_percent(median / base - 1)})")
            rows.append(row)
    lines = markdown_table(["workload", *(c.label for c in PEAK_CONTENDERS)], rows)
    costs = [f"{label.split(' (')[0]} {cost}" for workload, label in OVERHEAD_WORKLOADS
             if (cost := gc_cost(results, workload)) is not None]
    if costs:
        note = ("One full `gc.collect()` in the same processes, with no plugin, after the tests (for scale: "
                "pytest-tfmem collects only new objects before a measured test, and everything now and then): "
                f"{'; '.join(costs)}.")
        lines += ["", note]
    return lines


def gc_cost(results: Results, workload: str) -> str | None:
    """Median wall and CPU time of the session-end ``gc.collect()`` lines, and the objects it walked."""
    lines = [t for t in results.tests("overhead", NO_PLUGIN, workload) if t["outcome"] == "gc"]
    if not lines:
        return None
    wall, cpu = _median(t["seconds"] for t in lines), _median(t["cpu_seconds"] for t in lines)
    objects = _median(t["objects"] for t in lines)
    return f"{wall:.3f} s ({cpu:.3f} s CPU) over {objects:,.0f} objects"


def spike_counts(results: Results, contender: Contender) -> tuple[int, int, float | None]:
    peaks = [t["peak"] for t in results.tests("spike", contender) if t["peak"] is not None]
    return sum(peak >= SPIKE_CAUGHT for peak in peaks), len(peaks), _median(peaks)


def spike_section(results: Results) -> list[str]:
    caught_row, peak_row = ["runs whose peak includes the spike"], ["median reported peak"]
    for contender in PEAK_CONTENDERS:
        if contender is NO_PLUGIN:
            caught_row.append(NOT_A_PEAK)
            peak_row.append(NOT_A_PEAK)
            continue
        caught, runs, median = spike_counts(results, contender)
        caught_row.append(f"{caught}/{runs}")
        peak_row.append(format_size(median))
    return markdown_table(["250 MB living 5 ms", *(c.label for c in PEAK_CONTENDERS)], [caught_row, peak_row])


@dataclass(frozen=True)
class OrderFigures:
    alone: float | None
    after: float | None
    reference: float | None

    @property
    def drift(self) -> float | None:
        return _relative_error(self.after, self.alone)

    @property
    def alone_error(self) -> float | None:
        return _relative_error(self.alone, self.reference)

    @property
    def after_error(self) -> float | None:
        return _relative_error(self.after, self.reference)

    @property
    def within_tolerance(self) -> bool:
        errors = (self.drift, self.alone_error, self.after_error)
        return all(error is not None and error <= ORDER_TOLERANCE for error in errors)


def order_figures(results: Results, contender: Contender, workload: str, test: str) -> OrderFigures:
    def median_peak(variant: str) -> float | None:
        peaks = [t["peak"] for t in results.tests("order", contender, workload, variant) if t["test"] == test]
        return _median(p for p in peaks if p is not None)

    reference = _median(results.references.get((workload, test), []))
    return OrderFigures(median_peak("alone"), median_peak("after a heavier test"), reference)


def order_tests_run(results: Results) -> list[tuple[str, str, str]]:
    """The order section's tests that ran (those with a fresh-process reference)."""
    return [entry for entry in ORDER_TESTS if (entry[0], entry[1]) in results.references]


def order_section(results: Results) -> list[str]:
    rows = []
    for workload, test, label in order_tests_run(results):
        reference = _median(results.references.get((workload, test), []))
        rows.append([f"**{label}**", "fresh-process reference", format_size(reference), "", "", "", ""])
        for contender in MEASURING_CONTENDERS:
            figures = order_figures(results, contender, workload, test)
            rows.append([
                "", contender.label, format_size(figures.alone), format_size(figures.after),
                _error_cell(figures.drift), _error_cell(figures.alone_error), _error_cell(figures.after_error),
            ])
    header = ["test", "measured by", "alone", "after a heavier test", "after vs alone",
              "alone vs reference", "after vs reference"]
    return markdown_table(header, rows)


@dataclass(frozen=True)
class LeakFigures:
    caught: dict[float, tuple[int, int, int]]  # leak MB (0: leak-free) -> (flagged, runs, errors)
    seconds: float | None

    @property
    def smallest_always_caught(self) -> float | None:
        sizes = [mb for mb in LEAK_SIZES_MB if self.caught[mb][1] and self.caught[mb][0] == self.caught[mb][1]]
        return min(sizes, default=None)

    @property
    def false_positives(self) -> int:
        return self.caught[0][0]


def _leak_mb(test_name: str) -> float:
    match = re.search(r"\[([\d.]+)-\d+\]", test_name)
    assert match, test_name
    return float(match.group(1))


def leak_figures(results: Results, contender: Contender) -> LeakFigures:
    tests = list(results.tests("leaks", contender))
    verdict = LEAK_VERDICTS[contender.key]
    caught = {}
    for mb in (0, *LEAK_SIZES_MB):
        runs = [t for t in tests if _leak_mb(t["test"]) == mb]
        flagged = sum(t["outcome"] == "failed" and verdict in t["message"] for t in runs)
        errors = sum(t["outcome"] == "failed" and verdict not in t["message"] for t in runs)
        caught[mb] = (flagged, len(runs), errors)
    return LeakFigures(caught, _median(t["seconds"] for t in tests))


def _count_cell(flagged: int, runs: int, errors: int) -> str:
    return f"{flagged}/{runs}" + (f" ({errors} errors)" if errors else "")


def leak_section(results: Results) -> list[str]:
    rows = []
    for contender in LEAK_CONTENDERS:
        figures = leak_figures(results, contender)
        smallest = figures.smallest_always_caught
        rows.append([
            contender.label,
            _count_cell(*figures.caught[0]),
            *(_count_cell(*figures.caught[mb]) for mb in LEAK_SIZES_MB),
            "none" if smallest is None else f"{smallest:g} MB",
            "n/a" if figures.seconds is None else f"{figures.seconds:.2f} s",
        ])
    header = ["leak check", "leak-free loop flagged", *(f"{mb:g} MB/iter caught" for mb in LEAK_SIZES_MB),
              "smallest leak caught every run", "median time to verdict"]
    return markdown_table(header, rows)


def isolation_section(results: Results) -> list[str]:
    rows = []
    for workload, label in ISOLATION_WORKLOADS:
        in_process, isolated = (results.walls("isolation", c, workload) for c in ISOLATION_CONTENDERS)
        if not in_process or not isolated:
            continue
        tests = in_process[0][1]
        in_s, iso_s = _median(w for w, _ in in_process), _median(w for w, _ in isolated)
        assert in_s is not None and iso_s is not None
        rows.append([f"{label} ({tests} tests)", f"{in_s:.2f} s", f"{iso_s:.2f} s", f"{(iso_s - in_s) / tests:.2f} s"])
    header = ["session", "in-process (whole pytest run)", "isolated (whole pytest run)", "cost per isolated test"]
    return markdown_table(header, rows)


def target_lines(results: Results) -> list[str]:
    """Each target with the figure measured and whether it is met."""
    lines = []

    def verdict(met: bool) -> str:
        return "met" if met else "**not met**"

    if results.has("overhead"):
        wall, cpu = (overhead_medians(results, "keras_fit.py", figure) for figure in ("seconds", "cpu_seconds"))
        if wall[NO_PLUGIN][0] and wall[TFMEM][0] and cpu[NO_PLUGIN][0] and cpu[TFMEM][0]:
            ratio = wall[TFMEM][0] / wall[NO_PLUGIN][0] - 1
            cpu_ratio = cpu[TFMEM][0] / cpu[NO_PLUGIN][0] - 1
            collect = gc_cost(results, "keras_fit.py")
            lines.append(f"- pytest-tfmem overhead on the Keras test <= 3%: test time {_percent(ratio)} "
                         f"(CPU time {_percent(cpu_ratio)}), {verdict(ratio <= OVERHEAD_TARGET)}"
                         + (f"; one full gc.collect() there: {collect}" if collect else ""))
    if results.has("spike"):
        caught, runs, _ = spike_counts(results, TFMEM)
        lines.append(f"- spike caught in every run: {caught}/{runs}, {verdict(runs > 0 and caught == runs)}")
    if results.has("order"):
        for workload, test, label in order_tests_run(results):
            figures = order_figures(results, TFMEM, workload, test)
            lines.append(
                f"- order independence within 10% ({label}): after vs alone {_error_cell(figures.drift)}, "
                f"vs fresh-process reference {_error_cell(figures.alone_error)} alone / "
                f"{_error_cell(figures.after_error)} after, {verdict(figures.within_tolerance)}"
            )
    if results.has("leaks"):
        for contender in LEAK_CONTENDERS[:2]:
            figures = leak_figures(results, contender)
            smallest = figures.smallest_always_caught
            runs = figures.caught[0][1]
            met = smallest is not None and figures.false_positives == 0 and runs > 0
            found = "no leak size" if smallest is None else f"{smallest:g} MB/iteration"
            lines.append(f"- {contender.label}: {found} caught in every run, leak-free loop flagged "
                         f"{figures.false_positives}/{runs}, {verdict(met)}")
    return lines
