"""How much a test's peak may move from its baseline before it counts: ``10%``, ``16MB``, ``10%+16MB``.

A percentage alone fails tiny tests on noise (a 100 KiB test that reads 130 KiB is +30%);
a size alone lets big tests grow a lot. Both together add up: ``10%+16MB`` allows 10% of
the baseline plus 16 MB, so small tests are held by the size part and big ones by the
percentage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pytest_tfmem.units import format_size, parse_size

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
