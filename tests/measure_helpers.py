"""A peak source the test drives by hand, for tests of peak windows without real memory."""

from __future__ import annotations


class ScriptedSource:
    """A peak source whose level the test sets by hand."""

    name = "scripted"

    def __init__(self) -> None:
        self.level = 0
        self.high = 0

    def set(self, level: int) -> None:
        self.level = level
        self.high = max(self.high, level)

    def current(self) -> int:
        return self.level

    def peak(self) -> int:
        return self.high

    def reset_peak(self) -> None:
        self.high = self.level
