"""Parse and format memory sizes, and tolerances on them.

``MB``/``GB`` are decimal (10**6, 10**9), ``MiB``/``GiB`` binary (2**20, 2**30), as in
the SI/IEC convention; output always carries its unit. A size the user wrote remembers how
(``Size``), so that a message quoting a limit shows it as written beside its binary value:
``budget 400MB (381.5 MiB)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_DECIMAL_UNITS = ("kb", "mb", "gb", "tb")  # written so, a limit is shown beside its binary value
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]*)\s*$")

SIZE_FORMS = (
    "a non-negative number of bytes or a number with a unit: "
    "B, KB, MB, GB, TB (decimal) or KiB, MiB, GiB, TiB (binary), e.g. '4GB', '512 MiB', '1.5GB'"
)


class Size(int):
    """A number of bytes that remembers how it was written (``400MB``; ``""`` for a number)."""

    written: str

    def __new__(cls, value: int, written: str = "") -> Size:
        size = super().__new__(cls, value)
        size.written = written
        return size


def parse_size(value: object, *, what: str = "size") -> int:
    """Return ``value`` in bytes (a ``Size`` that remembers a text as it was written); raise
    ``ValueError`` naming the value and the accepted forms."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"invalid {what} {value!r} ({type(value).__name__}): expected {SIZE_FORMS}")
    if isinstance(value, (int, float)):
        if value < 0 or value != value:
            raise ValueError(f"invalid {what} {value!r}: expected {SIZE_FORMS}")
        return int(value)
    match = _SIZE.match(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"invalid {what} {value!r}: expected {SIZE_FORMS}")
    number = float(match.group(1))
    # '200' reads as 200 bytes to a machine and as 200 MB to most people: text needs a unit (a
    # marker's number, budget=2**30, is bytes)
    if not unit and number:
        raise ValueError(
            f"invalid {what} {value!r}: a size written as text needs a unit ({match.group(1)}B for bytes, "
            f"{match.group(1)}MB, {match.group(1)}GB...): expected {SIZE_FORMS}"
        )
    return Size(int(number * _UNITS[unit]), value.strip())


def format_size(nbytes: float | None, *, signed: bool = False) -> str:
    """``format_size(642_123_776) == '612.4 MiB'``; binary units, always with a unit."""
    if nbytes is None:
        return "-"
    sign = "+" if signed and nbytes >= 0 else ("-" if nbytes < 0 else "")
    size = abs(float(nbytes))
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor:
            return f"{sign}{size / factor:.1f} {unit}"
    return f"{sign}{size:.0f} B"


def format_compared(*sizes: int) -> list[str]:
    """Sizes written to be compared by eye: one unit (the largest's), and as many decimals as it
    takes (up to three; a GiB figure two at least) for sizes that differ to read differently:
    ``format_compared(1_503_238_553, 1_500_000_000) == ['1.400 GiB', '1.397 GiB']``."""
    largest = max((abs(size) for size in sizes), default=0)
    unit, factor = next(((unit, factor) for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
                         if largest >= factor), ("B", 1))
    distinct = len(set(sizes))
    for decimals in range({2**30: 2, 1: 0}.get(factor, 1), 4):  # a GiB figure to a hundredth, at least
        shown = [f"{size / factor:.{decimals}f} {unit}" for size in sizes]
        if len(set(shown)) == distinct:
            return shown
    return shown


def format_limit(limit: int) -> str:
    """A limit written in decimal units as the user wrote it beside its binary value,
    ``400MB (381.5 MiB)``; ``format_size`` of any other."""
    shown = format_size(limit)
    match = _SIZE.match(getattr(limit, "written", ""))
    decimal = match is not None and match.group(2).lower() in _DECIMAL_UNITS
    return f"{match.group(0).strip()} ({shown})" if match is not None and decimal else shown


# Tolerances: how much a test's peak may move from its baseline before it counts: ``10%``, ``16MB``,
# ``10%+16MB``.
# A percentage alone fails tiny tests on noise (a 100 KiB test that reads 130 KiB is +30%);
# a size alone lets big tests grow a lot. Both together add up: ``10%+16MB`` allows 10% of
# the baseline plus 16 MB, so small tests are held by the size part and big ones by the
# percentage.

TOLERANCE_FORMS = (
    "a percentage ('10%'), a size with a unit ('16MB', '64MiB') or both joined by '+' "
    "('10%+16MB': 10% of the baseline plus 16 MB); '0%' allows no change"
)
DEFAULT_TOLERANCE = "10%+16MB"
# The smallest change across a memory history that counts as a step or creep (``tfmem history
# --min-step``), and the least a history gate allows: small Keras tests still move with the order
# they run in, Keras's own by up to 8-9 MiB (docs/measurement.md, "Order"; benchmarks/flat_history.py),
# so a change needs 10 MB and 5% of the level.
DEFAULT_MIN_STEP = "5%+10MB"
_PERCENT = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)\s*%$")
_NUMBER = re.compile(r"^[\d.]+$")  # no unit: ambiguous


@dataclass(frozen=True)
class Tolerance:
    """Allowed change from a baseline: ``fraction`` of the baseline plus ``size`` bytes."""

    fraction: float | None = None
    size: int | None = None
    text: str = field(default="", compare=False)  # as the user wrote it, for messages

    def allowance(self, baseline: int) -> float:
        """Bytes a value may differ from ``baseline`` and still count as unchanged."""
        return (self.fraction or 0.0) * baseline + (self.size or 0)

    def __str__(self) -> str:
        if self.text:
            return self.text
        parts = []
        if self.fraction is not None:
            parts.append(f"{self.fraction * 100:g}%")
        if self.size is not None:
            parts.append(format_size(self.size))
        return "+".join(parts) or "0%"


def parse_tolerance(value: object, what: str = "tolerance") -> Tolerance:
    """``'10%'``, ``'16MB'`` or ``'10%+16MB'`` (either order, spaces allowed).

    A number without a unit is refused (``10`` could mean 10% or 10 bytes). Raises
    ``ValueError`` naming the value and the accepted forms.
    """
    if isinstance(value, Tolerance):
        return value
    problem = f"invalid {what} {value!r}: expected {TOLERANCE_FORMS}"
    if not isinstance(value, str):
        raise ValueError(problem)  # noqa: TRY004 - option and marker parsers report bad values as ValueError
    fraction: float | None = None
    size: int | None = None
    parts = [part.strip() for part in value.split("+")]
    for part in parts:
        percent = _PERCENT.match(part)
        if percent and fraction is None:
            fraction = float(percent.group(1)) / 100
        elif percent or size is not None or _NUMBER.match(part):
            raise ValueError(problem)
        else:
            try:
                size = parse_size(part)
            except ValueError:
                raise ValueError(problem) from None
    return Tolerance(fraction, size, "+".join(parts))
