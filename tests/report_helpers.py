"""A pytest session run in a fresh interpreter with a JSON report (``--tfmem-report``), read by
test name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Run:
    folder: Path
    returncode: int
    output: str
    report: dict

    def entry(self, name: str) -> dict:
        """The report's entry of the test whose node id ends with ``::name``."""
        return next(t for t in self.report["tests"] if t["nodeid"].endswith("::" + name))

    def peak(self, name: str) -> int:
        return self.entry(name)["measurement"]["peak"]
