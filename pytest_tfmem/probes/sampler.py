"""The one background sampling thread every sampler runs on.

``Sampler`` calls a function at once, then every ``interval_s``, on a daemon thread, until
``stop()`` (which waits for the thread) or until the function returns ``False`` (what it reads
is gone). The readings are the function's business: RSS where the kernel keeps no peak
(``host``), NVML (``nvml``), host and TensorFlow memory at once (``mixed``), an isolated test's
process tree (``watchdog``), the journal's readings and the trace's timeline.

Nothing here imports the rest of the package, so ``nvml`` can be loaded without it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

_S = TypeVar("_S", bound="Sampler")


class Sampler:
    """Run ``sample()`` at once and then every ``interval_s`` on a daemon thread named ``name``."""

    def __init__(self, sample: Callable[[], object], interval_s: float, name: str) -> None:
        self.sample = sample
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while self.sample() is not False and not self._stop.wait(self.interval_s):
            pass

    def start(self: _S) -> _S:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop sampling; once this returns, ``sample`` is not running and will not run again."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
