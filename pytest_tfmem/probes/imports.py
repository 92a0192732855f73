"""First imports, booked to the import: what loading a module for the first time in the process cost.

The first ``import tensorflow`` costs ~580 MiB and ~2 s; every later one costs nothing. A test
that happens to run first would carry that cost in its figure. ``ImportLedger`` is a finder at the
front of ``sys.meta_path``: for the *outermost* import of a module not yet in ``sys.modules``
(``import x``, ``from x import y``, ``importlib.import_module``, ``__import__`` as
``pytest.importorskip`` calls it) it wraps the module's loader, so that it sees the import start
(``create_module``) and end (``exec_module`` returns or raises). Imports nested inside the outermost
one are part of it. Listeners hear of the span as it opens and closes, so that open measurement
windows can leave it out, and each span becomes a ``FirstImport`` booking.

The ledger costs nothing where no first import happens: Python asks ``sys.meta_path`` only for
modules missing from ``sys.modules``. It changes nothing of the import either: the module gets its
own loader back before its code runs, errors propagate, ``importlib.reload`` and
``importlib.util.find_spec`` are not touched, namespace packages and loaders without
``exec_module`` are left alone (and not booked).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, Protocol

# The import system's own function that asks the finders on behalf of an import statement (CPython
# 3.8 to 3.13): a finder called from elsewhere (``importlib.util.find_spec``) is only being asked
# where a module is, and its answer must carry the module's own loader.
_IMPORTING_FRAME = "_find_and_load_unlocked"


@dataclass(frozen=True)
class FirstImport:
    """One outermost first import, in bytes of host memory (RSS) and seconds.

    ``host_bytes`` is what the process held more at its end than at its start (what the import
    kept); ``peak_bytes`` is its high-water mark above the start level (what it needed at most);
    ``raised`` says the import ended in an exception (its memory was spent all the same).
    """

    module: str
    host_bytes: int
    peak_bytes: int
    duration_s: float
    raised: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FirstImport:
        return cls(
            module=data["module"],
            host_bytes=int(data["host_bytes"]),
            peak_bytes=int(data["peak_bytes"]),
            duration_s=float(data["duration_s"]),
            raised=bool(data.get("raised", False)),
        )


class HostLevel(Protocol):
    """The host memory reading a ledger needs: ``probes.host.HostRSS`` is one."""

    def current(self) -> int: ...

    def peak(self) -> int: ...

    def reset_peak(self) -> None: ...


class ImportListener(Protocol):
    """Told of every outermost first import, on the importing thread.

    ``import_started`` comes before the ledger reads the start level and resets the high-water
    mark (fold peaks seen so far now); ``import_finishing`` comes after the module's code ran and
    before the ledger reads the end level: work done here (starting TensorFlow's runtime) is part
    of the import. ``import_booked`` comes once the booking is made.
    """

    def import_started(self, module: str) -> None: ...

    def import_finishing(self, module: str) -> None: ...

    def import_booked(self, booking: FirstImport) -> None: ...


class ImportLedger:
    """Books every outermost first import once ``install()``-ed, until ``uninstall()``.

    ``mark()`` and ``since(mark)`` list the bookings made in between; ``add_listener`` hears of
    each span as it happens. One span at a time in the process: an import another thread starts
    while one is under way is part of it.
    """

    def __init__(self, host: HostLevel) -> None:
        self.host = host
        self._bookings: list[FirstImport] = []
        self._listeners: list[ImportListener] = []
        self._lock = threading.Lock()
        self._open: _Span | None = None

    # -- what the rest of tfmem reads -------------------------------------------------------

    @property
    def installed(self) -> bool:
        return any(finder is self for finder in sys.meta_path)

    def install(self) -> None:
        """Put the ledger in front of ``sys.meta_path`` (again, if another finder went before it)."""
        self.uninstall()
        sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not self]

    def add_listener(self, listener: ImportListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: ImportListener) -> None:
        self._listeners.remove(listener)

    def mark(self) -> int:
        """A point in the ledger, for ``since``."""
        return len(self._bookings)

    def since(self, mark: int) -> tuple[FirstImport, ...]:
        """The bookings made after ``mark()`` returned ``mark``, oldest first."""
        return tuple(self._bookings[mark:])

    @property
    def importing(self) -> bool:
        """An outermost first import is under way."""
        return self._open is not None

    # -- the finder -------------------------------------------------------------------------

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        """Ask the finders behind this one; wrap the loader of an outermost first import."""
        if self._open is not None or target is not None or name in sys.modules:
            return None  # nested in the span under way, or a reload: the import system goes on
        try:
            asked_by = sys._getframe(2).f_code.co_name  # 1: the import system's ``_find_spec``
        except ValueError:
            return None
        if asked_by != _IMPORTING_FRAME:
            return None
        spec = self._spec_from_later_finders(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec  # not found (the import system asks everyone again), namespace, legacy loader
        spec.loader = _SpanLoader(self, name, spec.loader)  # type: ignore[assignment]  # a loader by protocol
        return spec

    def _spec_from_later_finders(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> ModuleSpec | None:
        own = next((index for index, finder in enumerate(sys.meta_path) if finder is self), None)
        for finder in sys.meta_path[own + 1 :] if own is not None else ():
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = find_spec(name, path, target)
            if spec is not None:
                return spec
        return None

    # -- spans ------------------------------------------------------------------------------

    def _begin(self, module: str) -> _Span | None:
        """Open the span of ``module``'s import, unless one is open already (another thread's)."""
        with self._lock:  # the level is read once the span is open: reading it may import (psutil's)
            if self._open is not None:
                return None
            span = self._open = _Span(module, 0, time.perf_counter())
        try:
            for listener in list(self._listeners):
                listener.import_started(module)
        except BaseException:
            self._end(span, raised=True)
            raise
        self.host.reset_peak()
        span.start_level = self.host.current()
        span.started = time.perf_counter()
        return span

    def _end(self, span: _Span, raised: bool) -> None:
        """Close the span: booked and heard of even when a listener or the import raised. Imports
        the listeners make are part of the span (none is booked on its own while they run)."""
        try:
            for listener in list(self._listeners):
                listener.import_finishing(span.module)
        finally:
            end = self.host.current()
            peak = max(self.host.peak(), end)
            booking = FirstImport(
                span.module, end - span.start_level, max(0, peak - span.start_level),
                time.perf_counter() - span.started, raised,
            )
            self._bookings.append(booking)
            try:
                for listener in list(self._listeners):
                    listener.import_booked(booking)
            finally:
                self._open = None


@dataclass(eq=False)
class _Span:
    module: str
    start_level: int
    started: float


# ``_SpanLoader.exec_module`` is a frame between an import statement and the module's code. A
# module that warns as it is imported (``warnings.warn(..., stacklevel=2)``) names its importer:
# the warnings machinery counts frames up from the module, skipping the import system's own
# (``warnings._is_internal_frame``: a file name holding both ``importlib`` and ``_bootstrap``).
# Compiled under such a name, this frame is skipped as theirs are, so the warning points at the
# importing line and ``-W``/``filterwarnings`` entries naming a module match as without tfmem.
_IMPORT_SYSTEM_FILE = "<pytest_tfmem's first-import span, seen as importlib._bootstrap>"
_EXEC_MODULE = """
def _exec_module_as_the_import_system(self, module):
    self._give_loader_back(module)
    raised = True
    try:
        self._loader.exec_module(module)
        raised = False
    finally:
        self._close(raised)
"""
_namespace: dict[str, Any] = {}
exec(compile(_EXEC_MODULE, _IMPORT_SYSTEM_FILE, "exec"), _namespace)
_exec_module_as_the_import_system = _namespace["_exec_module_as_the_import_system"]


class _SpanLoader:
    """The module's own loader, seen through: the span opens in ``create_module`` and closes when
    ``exec_module`` returns or raises. The module and its spec get the own loader back before the
    module's code runs, so nothing after the import can tell the ledger was there."""

    def __init__(self, ledger: ImportLedger, name: str, loader: Any) -> None:
        self._ledger = ledger
        self._name = name
        self._loader = loader
        self._span: _Span | None = None

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._loader, attribute)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        self._span = self._ledger._begin(self._name)
        try:
            return self._loader.create_module(spec)
        except BaseException:
            self._close(raised=True)
            raise

    def _give_loader_back(self, module: ModuleType) -> None:
        spec = vars(module).get("__spec__")
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        if vars(module).get("__loader__") is self:
            module.__loader__ = self._loader

    exec_module = _exec_module_as_the_import_system

    def _close(self, raised: bool) -> None:
        span, self._span = self._span, None
        if span is not None:
            self._ledger._end(span, raised)
