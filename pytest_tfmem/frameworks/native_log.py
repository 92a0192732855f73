"""What a framework's C++ code writes to standard error while tfmem starts its runtime or warms it up.

TensorFlow and JAX log from C++ straight to file descriptor 2, around Python's ``sys.stderr``
and pytest's capture of the test's own output: TensorFlow's full wheel prints
``E0000 ... failed call to cuInit: ... UNKNOWN ERROR (303)`` on every machine without an NVIDIA
GPU the moment its runtime starts. When tfmem starts it (before the first measured test, or
inside a test's own first import), that line is tfmem's doing, and its leading ``E`` reads as
tfmem's error. So descriptor 2 goes to a file while tfmem does it (``held``); what was written is
kept, and said once at the end of the session where it matters: a line that is not one of the
lines every start prints on a machine of this kind (``routine``), or every line with ``-v``.
A test's own log lines are never held: only tfmem's start and warm-ups are.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Lines every start of TensorFlow or JAX prints and that say nothing about this machine's devices
# or memory: the absl preamble, CPU feature notes, oneDNN's note, CUDA plugins registered twice.
_ALWAYS_ROUTINE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called|oneDNN custom operations are on|"
    r"This TensorFlow binary is optimized to use available CPU instructions|To enable the following instructions|"
    r"Unable to register cu(DNN|FFT|BLAS) factory|computation placer already registered|TF-TRT Warning|"
    r"Could not find cuda drivers on your machine|cudart_stub|Unable to initialize backend 'cuda'|"
    r"An NVIDIA GPU may be present on this machine"
)
# Lines that say no CUDA device is there: routine on a machine without one, an error on one with one.
_NO_DEVICE = re.compile(r"failed call to cuInit|CUDA_ERROR_NO_DEVICE|no CUDA-capable device|cuInit: UNKNOWN ERROR")


def has_nvidia_device() -> bool:
    """An NVIDIA device node exists (Linux's ``/dev/nvidia0`` ...); elsewhere, CUDA's variable says so."""
    devices = Path("/dev")
    if devices.is_dir():
        return any(devices.glob("nvidia[0-9]*"))
    return bool(os.environ.get("CUDA_VISIBLE_DEVICES"))


def routine(line: str, nvidia_device: bool) -> bool:
    """Whether ``line`` is one every start prints on a machine like this one (nothing to say)."""
    if not line.strip() or _ALWAYS_ROUTINE.search(line):
        return True
    return bool(_NO_DEVICE.search(line)) and not nvidia_device


class HeldLog:
    """What the frameworks wrote while tfmem held descriptor 2, in the order written."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def notable(self, nvidia_device: bool | None = None) -> list[str]:
        """The lines that are not routine on this machine (``nvidia_device``: whether it has one;
        looked up where not given)."""
        device = has_nvidia_device() if nvidia_device is None else nvidia_device
        return [line for line in self.lines if not routine(line, device)]

    @contextmanager
    def held(self) -> Iterator[None]:
        """Descriptor 2 to a file while the block runs; its lines kept here. Python's own
        ``sys.stderr`` is flushed first, so nothing written before the block is held."""
        for stream in (sys.stderr, sys.__stderr__):
            if stream is not None:
                stream.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile(mode="w+b") as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                sink.seek(0)
                self.lines += sink.read().decode("utf-8", "replace").splitlines()

    @staticmethod
    def heading(verbose: bool) -> str:
        return ("tfmem: what the frameworks logged while tfmem started them (their runtime and first use)"
                + ("" if verbose else "; -v shows every line"))

    def summary_lines(self, verbose: bool, nvidia_device: bool | None = None) -> list[str]:
        """What the session's end says: the heading, then each notable line (every line with
        ``-v``); nothing where there is none."""
        shown = self.lines if verbose else self.notable(nvidia_device)
        return [self.heading(verbose), *(f"  {line}" for line in shown)] if shown else []
