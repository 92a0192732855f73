"""TensorFlow's profiler around one run of a test, and what became of the capture.

TensorFlow has one profiler per process. When user code already runs one,
``tf.profiler.experimental.start`` raises ``AlreadyExistsError`` (or ``UnavailableError``);
the capture then records that the profiler was busy and the rest of the trace (the memory
timeline) goes on without it. TensorFlow is never imported here: the capture works on the
module user code loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

# The status of a capture: "captured", "busy", "failed" or "not-loaded".
CAPTURED, BUSY, FAILED, NOT_LOADED = "captured", "busy", "failed", "not-loaded"


@dataclass
class ProfilerCapture:
    """One profiler session writing ``<logdir>/plugins/profile/<run>/<host>.xplane.pb``."""

    tf: ModuleType | None
    logdir: Path
    status: str = NOT_LOADED
    message: str = "TensorFlow is not loaded: no profiler trace"
    files: list[Path] = field(default_factory=list)
    _running: bool = False

    def start(self) -> None:
        if self.tf is None:
            return
        experimental = self.tf.profiler.experimental
        options = experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0, device_tracer_level=1)
        try:
            experimental.start(str(self.logdir), options=options)
        except (self.tf.errors.AlreadyExistsError, self.tf.errors.UnavailableError) as error:
            self.status = BUSY
            self.message = (
                f"TensorFlow's profiler was busy ({type(error).__name__}: {error.message}); "
                "no profiler trace, the memory timeline was kept"
            )
            return
        except Exception as error:  # a profiler that cannot start must not fail the test run
            self.status, self.message = FAILED, f"TensorFlow's profiler did not start: {error!r}"
            return
        self._running = True

    def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        assert self.tf is not None
        try:
            self.tf.profiler.experimental.stop()
        except Exception as error:  # e.g. user code stopped our session: keep the timeline anyway
            self.status, self.message = FAILED, f"TensorFlow's profiler did not stop cleanly: {error!r}"
            return
        self.files = sorted(self.logdir.glob("plugins/profile/*/*.xplane.pb"))
        if self.files:
            self.status, self.message = CAPTURED, "TensorFlow profiler trace (Profile tab in TensorBoard)"
        else:
            self.status, self.message = FAILED, "TensorFlow's profiler wrote no .xplane.pb file"
