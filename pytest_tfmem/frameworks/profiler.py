"""A framework's profiler around one run of a test, and what became of the capture.

The profiler followed is the one of the framework the test runs on (``frameworks.primary``):
TensorFlow's and JAX's write ``<logdir>/plugins/profile/<run>/<host>.xplane.pb`` (TensorBoard's
Profile tab), PyTorch's ``<logdir>/*.pt.trace.json``. Each framework has one profiler per
process; when user code already runs one, the capture records that the profiler was busy and
the rest of the trace (the memory timeline) goes on without it. No framework is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .base import Framework, ProfilerBusy

# The status of a capture: "captured", "busy", "failed" or "not-loaded".
CAPTURED, BUSY, FAILED, NOT_LOADED = "captured", "busy", "failed", "not-loaded"


@dataclass
class ProfilerCapture:
    """One profiler session of ``framework`` writing into ``logdir``."""

    framework: Framework | None
    logdir: Path
    status: str = NOT_LOADED
    message: str = "no framework is loaded (TensorFlow, JAX, PyTorch): no profiler trace"
    files: list[Path] = field(default_factory=list)
    _running: bool = False

    def start(self) -> None:
        if self.framework is None:
            return
        name = self.framework.name
        try:
            self.framework.start_profiler(self.logdir)
        except ProfilerBusy as error:
            self.status = BUSY
            self.message = f"{name}'s profiler was busy ({error}); no profiler trace, the memory timeline was kept"
            return
        except Exception as error:  # a profiler that cannot start must not fail the test run
            self.status, self.message = FAILED, f"{name}'s profiler did not start: {error!r}"
            return
        self._running = True

    def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        assert self.framework is not None
        name = self.framework.name
        try:
            self.files = self.framework.stop_profiler(self.logdir)
        except Exception as error:  # e.g. user code stopped our session: keep the timeline anyway
            self.status, self.message = FAILED, f"{name}'s profiler did not stop cleanly: {error!r}"
            return
        if self.files:
            self.status, self.message = CAPTURED, self.framework.profile_description()
        else:
            self.status, self.message = FAILED, f"{name}'s profiler wrote no trace file"
