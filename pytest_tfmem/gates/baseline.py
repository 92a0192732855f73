"""Baseline files: each test's peak memory on a reference run, to compare later runs with.

A baseline is a versioned JSON file keyed by test node id::

    {
      "format": "pytest-tfmem-baseline",
      "version": 1,
      "saved": "2026-01-31T12:00:00+00:00",
      "environment": {"python": "3.11", "tensorflow": "2.21.0", ...},
      "tests": {
        "tests/test_model.py::test_fit": {"peak": 671088640, "views": {"host": 671088640, "tf:CPU:0": 540000000}},
        "tests/test_model.py::test_loop": {"peak": 12582912, "views": {"host": 12582912}, "leak_slope": 6400000.0,
                                           "retained": 1048576},
        "tests/test_model.py::test_small": {"peak": 9437184, "views": {"host": 9437184},
                                            "spread": {"runs": 3, "peak": [8388608, 10485760]}}
      }
    }

An entry measured more than once (``tfmem merge`` of several runs' reports) keeps its spread: the
lowest and highest figure of its runs, beside their median; a gate never calls a figure inside it
a regression. Saving merges into the existing file (tests not run keep their entries unless
pruned) and replaces it atomically; loading validates everything and raises ``BaselineError``
naming the file and the problem (an entry's spread that cannot be read is left out, as in a
baseline written before spreads were kept).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_tfmem import frameworks
from pytest_tfmem.core.handoffs import LeakHandoff
from pytest_tfmem.core.measure import Measurement
from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.files import FileFormatError, VersionedJson
from pytest_tfmem.gates.environment import current_environment


def _is_bytes(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class BaselineError(FileFormatError):
    """A baseline file that cannot be used; the message names the file and the problem."""

    what = "baseline"


FORMAT = VersionedJson(
    "pytest-tfmem-baseline", 1, how_to_make="create one with --tfmem-save-baseline=PATH", error=BaselineError
)


def compared_quantities(measurement: Measurement) -> dict[str, int]:
    """What a baseline holds a test to: the headline ``peak``, and each framework GPU view's
    increase (TensorFlow's and PyTorch's allocators, JAX's devices).

    GPU memory is not part of the headline peak, so each GPU view is held on its own.
    """
    quantities = {"peak": measurement.peak}
    for view in measurement.views:
        if frameworks.is_gpu_view(view.view):
            quantities[view.view] = view.increase
    return quantities


@dataclass(frozen=True)
class Spread:
    """What the runs of a test measured more than once read of each figure: ``figures`` maps
    ``peak`` (and ``retained``, where the runs had it) to the lowest and highest value."""

    runs: int
    figures: dict[str, tuple[int, int]]

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, **{name: list(bounds) for name, bounds in self.figures.items()}}

    @classmethod
    def from_dict(cls, data: object) -> Spread | None:
        """The spread a file holds; ``None`` for one that cannot be read (nothing is refused for it)."""
        if not isinstance(data, dict) or not _is_bytes(data.get("runs")) or data["runs"] < 2:
            return None
        figures = {}
        for name in SPREAD_FIGURES:
            bounds = data.get(name)
            if isinstance(bounds, list) and len(bounds) == 2 and all(map(_is_bytes, bounds)) and bounds[0] <= bounds[1]:
                figures[name] = (bounds[0], bounds[1])
        return cls(data["runs"], figures) if "peak" in figures else None


SPREAD_FIGURES = ("peak", "retained")


def is_saved(record: TestRecord) -> bool:
    """Its figures go into a saved baseline: measured, passed, and not a departure left unconfirmed."""
    return record.measurement is not None and record.outcome == "passed" and not record.unconfirmed


@dataclass(frozen=True)
class BaselineEntry:
    """One test's reference figures, in bytes (``leak_slope`` in bytes per iteration); ``spread``
    where it was measured more than once (then ``peak`` and ``retained`` are the runs' medians)."""

    peak: int
    views: dict[str, int] = field(default_factory=dict)
    leak_slope: float | None = None
    retained: int | None = None  # what the test left behind after its teardown (0 when it freed more)
    spread: Spread | None = None

    def quantities(self) -> dict[str, int]:
        quantities = {"peak": self.peak}
        quantities.update({name: value for name, value in self.views.items() if frameworks.is_gpu_view(name)})
        return quantities

    def bounds(self, quantity: str) -> tuple[int, int] | None:
        """The lowest and highest value the runs of ``quantity`` read, where the entry keeps them."""
        return None if self.spread is None else self.spread.figures.get(quantity)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"peak": self.peak, "views": dict(self.views)}
        if self.leak_slope is not None:
            data["leak_slope"] = self.leak_slope
        if self.retained is not None:
            data["retained"] = self.retained
        if self.spread is not None:
            data["spread"] = self.spread.to_dict()
        return data

    @classmethod
    def from_record(cls, record: TestRecord) -> BaselineEntry:
        assert record.measurement is not None
        leak = LeakHandoff.of(record)  # what the test's leak checks measured
        return cls(
            peak=record.measurement.peak,
            views={view.view: view.increase for view in record.measurement.views},
            leak_slope=leak.growth_per_iteration if leak is not None else None,
            retained=None if record.retained is None else max(0, record.retained.bytes),
        )


@dataclass
class Baseline:
    """The contents of a baseline file."""

    tests: dict[str, BaselineEntry] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    saved: str | None = None

    def merged(self, records: Iterable[TestRecord], *, prune: bool = False) -> Baseline:
        """A new baseline: this one updated with every passed, measured test of ``records``.

        Entries of tests not among ``records`` are kept, or dropped with ``prune``. Tests
        that did not pass keep their old entry: a failing run says little about memory. So do
        tests whose figure departed from it and could not be measured again (``core.confirm``):
        a one-time cost is no baseline.
        """
        fresh, kept = {}, {}
        for record in records:  # read once: a session's records are streamed from the store's file
            if is_saved(record):
                fresh[record.nodeid] = BaselineEntry.from_record(record)
            elif record.unconfirmed and record.nodeid in self.tests:
                kept[record.nodeid] = self.tests[record.nodeid]
        tests = {} if prune else dict(self.tests)
        tests.update(kept)
        tests.update(fresh)
        return Baseline(
            tests=dict(sorted(tests.items())),
            environment=current_environment(),
            saved=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The file's contents, less the format's name and version."""
        return {
            "saved": self.saved,
            "environment": self.environment,
            "tests": {nodeid: entry.to_dict() for nodeid, entry in self.tests.items()},
        }


def save_baseline(baseline: Baseline, path: str | Path) -> None:
    """Write ``baseline`` to ``path`` atomically: on any failure the old file stays intact."""
    FORMAT.write(path, baseline.to_dict())


def load_baseline(path: str | Path, *, missing_ok: bool = False) -> Baseline:
    """Read and validate a baseline file; an absent file is an empty baseline if ``missing_ok``.

    Raises ``BaselineError`` for a missing (unless allowed), unreadable, empty, corrupt or
    wrong-version file, naming the file and the problem.
    """
    data = FORMAT.read(path, missing_ok=missing_ok)
    if data is None:
        return Baseline()
    tests = data.get("tests")
    if not isinstance(tests, dict):
        raise BaselineError(path, '"tests" must be an object keyed by test node id')
    environment = data.get("environment", {})
    if not isinstance(environment, dict):
        raise BaselineError(path, '"environment" must be an object')
    return Baseline(
        tests={nodeid: _parse_entry(path, nodeid, entry) for nodeid, entry in tests.items()},
        environment=environment,
        saved=data.get("saved"),
    )


def _parse_entry(path: str | Path, nodeid: str, entry: object) -> BaselineEntry:
    if not isinstance(entry, dict) or not _is_bytes(entry.get("peak")):
        peak = entry.get("peak") if isinstance(entry, dict) else entry
        raise BaselineError(path, f"test {nodeid!r}: \"peak\" must be a whole number of bytes >= 0, got {peak!r}")
    views = entry.get("views", {})
    if not isinstance(views, dict) or not all(_is_bytes(value) for value in views.values()):
        raise BaselineError(path, f"test {nodeid!r}: \"views\" must map view names to whole numbers of bytes")
    slope = entry.get("leak_slope")
    if slope is not None and (isinstance(slope, bool) or not isinstance(slope, (int, float))):
        raise BaselineError(path, f"test {nodeid!r}: \"leak_slope\" must be a number, got {slope!r}")
    retained = entry.get("retained")
    if retained is not None and not _is_bytes(retained):
        why = f"\"retained\" must be a whole number of bytes >= 0, got {retained!r}"
        raise BaselineError(path, f"test {nodeid!r}: {why}")
    spread = Spread.from_dict(entry.get("spread"))
    return BaselineEntry(entry["peak"], dict(views), None if slope is None else float(slope), retained, spread)
