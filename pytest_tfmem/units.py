"""Parse and format memory sizes.

``MB``/``GB`` are decimal (10**6, 10**9), ``MiB``/``GiB`` binary (2**20, 2**30), as in
the SI/IEC convention; output always carries its unit. A size the user wrote remembers how
(``Size``), so that a message quoting a limit shows it as written beside its binary value:
``budget 400MB (381.5 MiB)``.
"""

from __future__ import annotations

import re

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


def format_limit(limit: int) -> str:
    """A limit written in decimal units as the user wrote it beside its binary value,
    ``400MB (381.5 MiB)``; ``format_size`` of any other."""
    shown = format_size(limit)
    match = _SIZE.match(getattr(limit, "written", ""))
    decimal = match is not None and match.group(2).lower() in _DECIMAL_UNITS
    return f"{match.group(0).strip()} ({shown})" if match is not None and decimal else shown
