"""What an isolated run leaves behind, turned into numbers, messages and reports' extras.

The child's events (``child.py``) and the watchdog's ``WatchResult`` become the record's
``extra["isolated"]`` section, the failure message of a child that died, the child's
warnings issued again here, and the rows of the terminal's table of isolated tests.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import pytest

from pytest_tfmem import platforms
from pytest_tfmem.core.measure import Measurement, ViewReading
from pytest_tfmem.core.record import TestRecord, publish, published_record, record_from_report
from pytest_tfmem.core.summary import result_word
from pytest_tfmem.platforms import SAMPLED
from pytest_tfmem.probes.system import MemoryLimit
from pytest_tfmem.probes.watchdog import WatchResult, describe_signal, downsample
from pytest_tfmem.units import format_limit, format_size

PROCESS_PEAK_PROPERTY = "tfmem_isolated_process_peak_bytes"  # beside the record, for JUnit XML


def isolated_rows(records: list[TestRecord]) -> list[list[str]]:
    """test, in-process method's peak, the child's peak increase, its absolute peak, wall time, result."""
    rows = [["test", "peak (views)", "process peak increase", "process peak", "child wall", "result"]]
    for record in records:
        isolated = record.extra["isolated"]
        rows.append(
            [
                record.nodeid,
                format_size(record.measurement.peak) if record.measurement else "-",
                format_size(isolated.get("process_peak_increase")),
                format_size(isolated["process_peak"]),
                f"{isolated['wall_s']:.2f} s",
                result_word(record, isolated.get("death")),
            ]
        )
    return rows


def last_call(events: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The child's last ``call`` event and the ``call_end`` after it (``None`` where missing).
    The last: with pytest-rerunfailures the child runs each attempt of the test."""
    starts = [index for index, event in enumerate(events) if event["event"] == "call"]
    if not starts:
        return None, None
    end = next((event for event in events[starts[-1]:] if event["event"] == "call_end"), None)
    return events[starts[-1]], end


def died_in_call(events: list[dict[str, Any]]) -> bool:
    """The child's last call phase began and never ended. (pytest-rerunfailures logs an
    attempt's reports once it is over, so the reports cannot tell.)"""
    call, call_end = last_call(events)
    return call is not None and call_end is None


def has_teardown_report(reports: list[pytest.TestReport]) -> bool:
    """The child reported the test's teardown."""
    return any(report.when == "teardown" for report in reports)


def ran_to_its_end(reports: list[pytest.TestReport], events: list[dict[str, Any]]) -> bool:
    """The child ran the test to its end: it reported the teardown, and its last call phase
    (the last attempt's, with pytest-rerunfailures) ended."""
    return has_teardown_report(reports) and not died_in_call(events)


def isolated_section(
    result: WatchResult, events: list[dict[str, Any]], reports: list[pytest.TestReport]
) -> dict[str, Any]:
    """The numbers of an isolated run that go into the record's ``extra["isolated"]``.

    ``process_peak`` is the child's peak RSS over the test body, exact: the kernel's
    high-water mark (reset when the body starts) read when the body ends, folded with the
    record's own host peak, which survives resets by nested ``tfmem.measure()`` windows.
    For a child that died it is the higher of the child's high-water mark as the watchdog
    last read it (exact up to that reading, start-up included) and the tree's sampled peak.
    """
    call, call_end = last_call(events)
    call_start_rss = call["rss"] if call else None
    host_peak = 0
    for report in reports:
        record = record_from_report(report) if report.when == "call" else None
        host_view = record.measurement.view("host") if record and record.measurement else None
        if host_view is not None:
            host_peak = host_view.peak
            call_start_rss = host_view.start  # exact, taken after freed memory was released
    if call_end is not None:
        process_peak = max(call_end["peak_rss"], host_peak)
    else:
        process_peak = max(result.child_peak_rss, result.peak_rss)
    death = None
    if result.killed_at_limit:
        death = "killed at kill_at"
    elif result.signal is not None:
        death = f"killed by {result.signal}"
    return {
        "process_peak": process_peak,
        "call_start_rss": call_start_rss,
        "process_peak_increase": None if call_start_rss is None else max(0, process_peak - call_start_rss),
        "tree_peak_sampled": result.peak_rss,
        "tree_last_sampled": result.last_rss,
        "wall_s": round(result.elapsed_s, 3),
        "kill_at": result.kill_at,
        "returncode": result.returncode,
        "death": death,
        "timeline": [[round(t, 3), rss] for t, rss in downsample(result.timeline, 200)],
    }


def add_isolated_numbers(report: pytest.TestReport, isolated: dict[str, Any]) -> None:
    """Add the isolated run's numbers to the record the child attached to a report (the
    call and teardown reports carry it), and a section to the call report."""
    record = published_record(report)
    if record is not None:
        record.extra["isolated"] = isolated
        publish(report, record)
        report.user_properties.append((PROCESS_PEAK_PROPERTY, isolated["process_peak"]))
    if report.when != "call":
        return
    increase = format_size(isolated["process_peak_increase"])
    report.sections.append(
        (
            "tfmem isolated",
            (
                f"child process peak RSS {format_size(isolated['process_peak'])} ({increase} above its "
                f"level when the test body started); child wall time {isolated['wall_s']:.2f} s"
            ),
        )
    )


def sampled_measurement(result: WatchResult, call_start_rss: int | None, interval_s: float) -> Measurement | None:
    """What the watchdog saw of a test that died: sampled, so not exact."""
    if call_start_rss is None or not result.timeline:
        return None
    peak = max(result.peak_rss, result.child_peak_rss)
    view = ViewReading("host", call_start_rss, max(peak, call_start_rss), result.last_rss)
    note = (f"the test died: its figure is its process tree's peak, {format_size(max(peak, call_start_rss))}, "
            f"above the tree's size as its call began, {format_size(call_start_rss)}; the tree was sampled every "
            f"{interval_s * 1000:.0f} ms by the watchdog")
    return Measurement((view,), result.elapsed_s, SAMPLED, platforms.current().counts, notes=(note,))


def reissue_warnings(events: list[dict[str, Any]]) -> None:
    """Warnings the child recorded for the test, issued again here so the summary shows them."""
    for event in events:
        if event["event"] != "warning":
            continue
        category = warning_category(event["category"])
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn_explicit(event["message"], category, event["filename"], event["lineno"])


def warning_category(qualified_name: str) -> type[Warning]:
    module_name, _, name = qualified_name.rpartition(".")
    module = sys.modules.get(module_name)
    category = getattr(module, name, None)
    return category if isinstance(category, type) and issubclass(category, Warning) else UserWarning


def watch_summary_lines(result: WatchResult) -> list[str]:
    """The watchdog's readings a failure message shows: last, peak, elapsed, timeline."""
    lines = [
        (
            f"the process tree (the test's process and every process it started, which kill_at counts): last "
            f"{format_size(result.last_rss)}, peak {format_size(result.peak_rss)} (sampled); of it, the test's own "
            f"process at most {format_size(result.child_peak_rss)} (from {platforms.current().marks_named}); after "
            f"{result.elapsed_s:.2f} s"
        ),
    ]
    if result.timeline:
        points = ", ".join(f"{t:.2f}s {format_size(rss)}" for t, rss in downsample(result.timeline, 12))
        lines.append(f"timeline: {points}")
    return lines


def death_message(
    kill_at: int | None,
    events: list[dict[str, Any]],
    result: WatchResult,
    limit: MemoryLimit,
    process: str = "the isolated test's process",
    ended: bool = True,
) -> tuple[str, str]:
    """The failed check (``kill_at``, ``signal`` or ``died``) and the message for a child
    (``process``: how the message names it) that ended (or, not ``ended``, went on) before
    reporting its test."""
    available = (
        f"available memory at the last reading: {format_size(result.available)} of "
        f"{format_size(limit.bytes)} ({limit.source})"
    )
    readings = "\n".join(watch_summary_lines(result))
    if result.killed_at_limit:
        assert kill_at is not None
        head = (
            f"tfmem: killed at kill_at {format_limit(kill_at)}: the isolated test's process tree "
            f"reached {format_size(result.last_rss)} after {result.elapsed_s:.2f} s"
        )
        return "kill_at", f"{head}\n{readings}\n{available}"
    if result.signal is not None:
        described = describe_signal(result.signal, result.oom_kills, result.oom_scope)
        return "signal", f"tfmem: {process} was {described}\n{readings}\n{available}"
    problems = [event["text"] for event in events if event["event"] == "collect_error"]
    if any(event["event"] == "not_collected" for event in events):
        problems.append(f"{process} did not collect this test")
    detail = "\n".join(problems)
    if not ended:
        head = f"tfmem: {process} did not run the test"
    else:
        head = f"tfmem: {process} exited with code {result.returncode} before reporting the test"
    return "died", "\n".join(part for part in (head, detail, readings) if part)
