"""The session's account in the terminal: start -> end, who left the most, the share explained."""

from __future__ import annotations

from pytest_tfmem.core.confirm import OneTimeCosts
from pytest_tfmem.core.retained import FIRST_USE, FIXTURE, IMPORT, RERUN, RUNTIME, ProcessAccount, SessionAccount
from pytest_tfmem.units import format_size

NOTABLE_GROWTH = 32 * 2**20  # a session that grew less is not worth a section
TOP_RETAINERS = 5


def _signed(size: int) -> str:
    return format_size(size, signed=True)


def process_line(process: ProcessAccount) -> str:
    """``gw0: 601.0 MiB -> 848.0 MiB (+247.0 MiB) over 191 tests: tests +200.0 MiB, ...; 97% explained``."""
    parts = [f"tests {_signed(process.tests_bytes)}"]
    kinds = ((FIXTURE, "fixtures"), (IMPORT, "first imports"), (RUNTIME, _runtime_label(process)),
             (RERUN, "tfmem's re-runs"))
    for kind, label in kinds:
        if process.bookings(kind):
            parts.append(f"{label} {_signed(process.booked_bytes(kind))}")
    first_uses: dict[str, int] = {}  # "Keras's first use": bytes, in the order they were paid
    for _, booking in process.bookings(FIRST_USE):
        first_uses[booking.name] = first_uses.get(booking.name, 0) + booking.bytes
    parts += [f"{name} {_signed(size)}" for name, size in first_uses.items()]
    if process.pool_free_growth:
        parts.append(f"TensorFlow's pool, free for reuse {_signed(process.pool_free_growth)}")
    if process.between_tests:
        parts.append(f"between measured tests {_signed(process.between_tests)}")
    share = process.explained_share
    parts_named = "tests, fixtures, imports and the pool" if process.has_pool else "tests, fixtures and imports"
    explained = f"; {100 * share:.0f}% explained by {parts_named}" if share is not None else ""
    who = f"{process.worker}: " if process.worker else "process "
    skipped = f" (and {process.skipped} skipped)" if process.skipped else ""
    return (
        f"{who}{format_size(process.start.total)} -> {format_size(process.end.total)} ({_signed(process.growth)}) "
        f"over {process.tests} measured test{'s' if process.tests != 1 else ''}{skipped}: "
        + ", ".join(parts) + explained
    )


def _runtime_label(process: ProcessAccount) -> str:
    """``TensorFlow's runtime start``, or ``runtime starts`` where several frameworks started."""
    names = {booking.name for _, booking in process.bookings(RUNTIME)}
    return names.pop() if len(names) == 1 else "runtime starts"


def account_lines(account: SessionAccount, *, always: bool = False, top: int = TOP_RETAINERS) -> list[str]:
    """The terminal section, or nothing when no process grew notably (unless ``always``)."""
    if not account.processes:  # isolated tests only: no books, but what re-runs told apart
        return one_time_lines(account.one_time)
    grew = any(process.growth >= NOTABLE_GROWTH for process in account.processes)
    lines: list[str] = []
    if grew or always:
        lines += [process_line(process) for process in account.processes]
    retainers = account.top_retainers(top)
    if retainers and (grew or always):
        lines.append("who left the most:")
        for retainer in retainers:
            where = f" [{retainer.worker}]" if retainer.worker else ""
            what = f": {retainer.what}" if retainer.what else ""
            lines.append(f"  {retainer.kind} {retainer.name}{where} {_signed(retainer.bytes)}{what}")
    cleared = account.cleared
    if cleared is not None:
        # One clearing after each test: what a test makes again after one (JAX's compiled code) is
        # freed again by the next, so the sum is no saving; the process's net growth stands beside it.
        tests = sum(process.tests for process in account.processes)
        grown = "the process" if len(account.processes) == 1 else f"the {len(account.processes)} processes"
        lines.append(f"--tfmem-clear-session freed {format_size(max(cleared, 0))} in {tests} clearings (their sum); "
                     f"{grown} grew {_signed(account.growth)}"
                     + (f" (the level rose {format_size(-cleared)} while clearing)" if cleared < 0 else ""))
        if account.cleared_by:
            lines.append("  after each test: " + ", ".join(account.cleared_by))
    if grew or always:
        lines += native_lines(account)
    return lines + one_time_lines(account.one_time)


def one_time_lines(costs: OneTimeCosts, top: int = TOP_RETAINERS) -> list[str]:
    """The one-time costs re-runs told apart from the tests' own need (``core.confirm``), largest first."""
    if not costs.count:
        return []
    lines = [
        f"one-time costs of the process, told apart by re-runs: {format_size(costs.bytes, signed=True)} "
        f"in {costs.count} test{'s' if costs.count != 1 else ''} (their first runs' peaks beyond their re-runs'; "
        "not held to a budget: --tfmem-session-limit holds the process)"
    ]
    return lines + [f"  {cost.describe()}" for cost in costs.largest[:top]]


def native_lines(account: SessionAccount) -> list[str]:
    """Where most of what the weighed tests kept is memory no Python object accounts for (a
    framework's compiled code, allocator pools): say so, and what gives it back."""
    weighed = sum(process.weighed_tests for process in account.processes)
    kept = sum(process.weighed_bytes for process in account.processes)
    named = sum(process.named_bytes for process in account.processes)
    if not weighed or named * 2 >= kept:
        return []
    clearing = ("" if account.cleared is not None
                else "; --tfmem-clear-session clears Keras's and the frameworks' caches after each test")
    return [
        f"most of it is native memory: of the {format_size(kept)} kept by the {weighed} "
        f"test{'s' if weighed != 1 else ''} whose objects were weighed, the objects named account for "
        f"{format_size(named)}{clearing}; "
        "what a process does not give back, a fresh one does: --tfmem-session-limit=SIZE replaces the "
        "process once it holds more"
    ]
