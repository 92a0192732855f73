"""The session's account in the terminal: start -> end, who left the most, the share explained."""

from __future__ import annotations

from pytest_tfmem.core.retained import FIXTURE, IMPORT, RUNTIME, ProcessAccount, SessionAccount
from pytest_tfmem.units import format_size

NOTABLE_GROWTH = 32 * 2**20  # a session that grew less is not worth a section
TOP_RETAINERS = 5


def _signed(size: int) -> str:
    return format_size(size, signed=True)


def process_line(process: ProcessAccount) -> str:
    """``gw0: 601.0 MiB -> 848.0 MiB (+247.0 MiB) over 191 tests: tests +200.0 MiB, ...; 97% explained``."""
    parts = [f"tests {_signed(process.tests_bytes)}"]
    for kind, label in ((FIXTURE, "fixtures"), (IMPORT, "first imports"), (RUNTIME, "TensorFlow's runtime start")):
        if process.bookings(kind):
            parts.append(f"{label} {_signed(process.booked_bytes(kind))}")
    if process.pool_free_growth:
        parts.append(f"TensorFlow's pool, free for reuse {_signed(process.pool_free_growth)}")
    if process.between_tests:
        parts.append(f"between measured tests {_signed(process.between_tests)}")
    share = process.explained_share
    explained = f"; {100 * share:.0f}% explained by tests, fixtures, imports and the pool" if share is not None else ""
    who = f"{process.worker}: " if process.worker else "process "
    return (
        f"{who}{format_size(process.start.total)} -> {format_size(process.end.total)} ({_signed(process.growth)}) "
        f"over {len(process.tests)} measured test{'s' if len(process.tests) != 1 else ''}: "
        + ", ".join(parts) + explained
    )


def account_lines(account: SessionAccount, *, always: bool = False, top: int = TOP_RETAINERS) -> list[str]:
    """The terminal section, or nothing when no process grew notably (unless ``always``)."""
    if not account.processes:
        return []
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
        tests = sum(len(process.tests) for process in account.processes)
        lines.append(f"--tfmem-clear-session gave back {format_size(max(cleared, 0))} over {tests} tests"
                     + (f" (the level rose {format_size(-cleared)} while clearing)" if cleared < 0 else ""))
    return lines
