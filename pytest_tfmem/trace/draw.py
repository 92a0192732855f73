"""A traced run's memory timeline drawn in a process of its own: TensorBoard scalars and a PNG.

TensorBoard's protos and matplotlib are our tools, not the test's frameworks: a JAX or PyTorch
test's process never imports them for its trace. ``draw`` hands the timeline to
``python -m pytest_tfmem.trace.draw`` as JSON on stdin; the child writes both files into the
trace directory and answers, on stdout, the scalar tags written, the PNG's name and a note for
each file it could not write.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_tfmem.trace.timeline import Timeline, plot_png, write_scalars

PNG = "timeline.png"
TIMEOUT_S = 120


@dataclass
class Drawn:
    """What the drawing wrote: the scalars' tags, the PNG's name (``None``: not written), notes,
    and the modules it missed (said once a session, by the trace feature's summary: not a note on
    every trace)."""

    tags: list[str] = field(default_factory=list)
    png: str | None = None
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def draw(directory: Path, timeline: Timeline, starts: dict[str, int], *, title: str, budget: int | None,
         exact_peak: int | None, verdict_peak: int | None) -> Drawn:
    """Write ``timeline`` as scalars and a PNG into ``directory``, in a child."""
    job = {"directory": str(directory), "timeline": asdict(timeline), "starts": starts, "title": title,
           "budget": budget, "exact_peak": exact_peak, "verdict_peak": verdict_peak}
    package_root = str(Path(__file__).resolve().parents[2])  # found as the test's process found it
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    try:
        done = subprocess.run([sys.executable, "-m", __name__], input=json.dumps(job), capture_output=True,
                              text=True, timeout=TIMEOUT_S, check=False, env={**os.environ, "PYTHONPATH": path})
    except (OSError, subprocess.TimeoutExpired) as error:
        return Drawn(notes=[f"no scalars and no {PNG}: drawing them failed: {error!r}"])
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Drawn(notes=[f"no scalars and no {PNG}: drawing them exited with {done.returncode}: {last}"])
    return Drawn(**json.loads(done.stdout))


def _draw_here(job: dict[str, Any]) -> Drawn:
    directory = Path(job["directory"])
    timeline = Timeline(**job["timeline"])
    drawn = Drawn()
    try:
        drawn.tags = write_scalars(directory, timeline, job["starts"], job["budget"])
    except ImportError as error:
        drawn.missing.append(error.name or str(error))
    except Exception as error:
        drawn.notes.append(f"no TensorBoard scalars: {error!r}")
    try:
        plot_png(directory / PNG, timeline, job["starts"], title=job["title"], budget=job["budget"],
                 exact_peak=job["exact_peak"], verdict_peak=job["verdict_peak"])
        drawn.png = PNG
    except ImportError as error:
        drawn.missing.append(error.name or str(error))
    except Exception as error:
        drawn.notes.append(f"no {PNG}: {error!r}")
    return drawn


if __name__ == "__main__":
    print(json.dumps(asdict(_draw_here(json.load(sys.stdin)))))
