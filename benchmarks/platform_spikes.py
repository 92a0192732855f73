"""How often each way of reading a peak catches a short spike: 300 MiB held 5 ms, 20 times.

    python -m benchmarks.platform_spikes [--repeats 20] [--output docs/platforms.md]

Each path runs in a fresh interpreter of its own (one path's resets must not reach another's
readings) and measures the spikes through pytest-tfmem's own peak source (``probes.host.HostRSS``)
and window (``core.measure.PeakTracker``), as a test's window does:

- ``native``: the platform this system is (Linux: the kernel's ``VmHWM``, reset per window through
  ``clear_refs``; macOS: the footprint's interval mark; Windows: the lifetime peak working set);
- ``lifetime`` (Linux only): Linux's own mark with ``clear_refs`` taken away, so that it is a
  lifetime mark, as Windows' peak working set and macOS < 10.14's footprint mark are: exact for
  the windows that raise it, sampled every millisecond for the rest;
- ``portable``: psutil's RSS, sampled every millisecond.

A spike is caught when the window's increase is at least 95% of it; ``exact`` counts the windows
whose figure was a mark, not a sample. The macOS and Windows jobs of ``.github/workflows/tests.yml``
run this script, so their native rows are in those jobs' logs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import machine
from pytest_tfmem import platforms
from pytest_tfmem.core.measure import PeakTracker
from pytest_tfmem.platforms import SAMPLED, Platform
from pytest_tfmem.platforms.portable import Portable
from pytest_tfmem.probes.host import SAMPLE_INTERVAL_S, HostRSS
from pytest_tfmem.units import format_size

SPIKE_BYTES = 300 * 2**20
HOLD_S = 0.005
CAUGHT = 0.95  # of the spike: the window's increase includes it
PAUSE_S = 0.05  # between two spikes
PATHS = {
    "native": "this system's own marks",
    "lifetime": "Linux's VmHWM as a lifetime mark (clear_refs unwritable), the rule Windows and macOS < 10.14 get",
    "portable": f"psutil's RSS, sampled every {SAMPLE_INTERVAL_S * 1000:g} ms",
}


def platform_for(path: str) -> Platform:
    if path == "portable":
        return Portable()
    if path == "lifetime":
        from pytest_tfmem.platforms.linux import Linux

        return Linux(clear_refs="/nonexistent/clear_refs")
    return platforms.native()


def spikes(path: str, repeats: int) -> dict[str, object]:
    """The spikes one path caught, measured in this process."""
    platform = platform_for(path)
    source = HostRSS(platform)
    tracker = PeakTracker(source)
    caught = exact = 0
    increases = []
    for _ in range(repeats):
        time.sleep(PAUSE_S)
        window = tracker.open()
        block = np.ones(SPIKE_BYTES, dtype=np.uint8)  # every page written
        time.sleep(HOLD_S)
        del block
        reading = tracker.close(window)
        increases.append(reading.increase)
        caught += reading.increase >= CAUGHT * SPIKE_BYTES
        exact += tracker.method(window) != SAMPLED
    return {"platform": platform.name, "method": source.method, "counts": source.counts, "caught": caught,
            "exact": exact, "lowest": min(increases), "repeats": repeats}


def measured_path(path: str, repeats: int) -> dict[str, object]:
    """``spikes(path)`` in a fresh interpreter."""
    child = subprocess.run(
        [sys.executable, "-m", "benchmarks.platform_spikes", "--child", path, "--repeats", str(repeats)],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    return dict(json.loads(child.stdout))


def table(results: dict[str, dict[str, object]]) -> str:
    lines = [
        f"A spike of {format_size(SPIKE_BYTES)} held {HOLD_S * 1000:g} ms in a window, "
        f"{next(iter(results.values()))['repeats']} times per path; caught: the window's increase is at "
        f"least {CAUGHT:.0%} of it; exact: the figure was a mark, not a sample.",
        "",
        "| path | platform | peaks | counts | caught | of them exact | lowest figure |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for path, result in results.items():
        lines.append(
            f"| {path}: {PATHS[path]} | {result['platform']} | {result['method']} | {result['counts']} | "
            f"{result['caught']}/{result['repeats']} | {result['exact']} | {format_size(int(result['lowest']))} |"  # type: ignore[call-overload]
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="spikes per path (default 20)")
    parser.add_argument("--output", help="also write the table, with the command, into this Markdown page")
    parser.add_argument("--child", choices=sorted(PATHS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(spikes(args.child, args.repeats)))
        return 0
    paths = [path for path in PATHS if path != "lifetime" or sys.platform.startswith("linux")]
    results = {path: measured_path(path, args.repeats) for path in paths}
    text = table(results)
    print(text, end="")
    if args.output:
        written = f"{machine.written_by('-m benchmarks.platform_spikes', argv)}.\n\n{text}"
        machine.write_section(Path(args.output), "benchmarks/platform_spikes.py", written,
                              "Platforms: what tfmem reads on each operating system")
    return 0


if __name__ == "__main__":
    sys.exit(main())
