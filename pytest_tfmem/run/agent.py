"""The agent a Python script runs with under ``tfmem run``, started before the script's first line.

    python .../pytest_tfmem/run/agent.py READINGS (SCRIPT | -m MODULE) [ARGS...]

It installs one thread, then runs the script as ``python SCRIPT`` (or ``python -m MODULE``)
would: ``__main__``, ``sys.argv`` and ``sys.path[0]`` as Python sets them. It is run by its
path, not as ``-m pytest_tfmem.run.agent``: importing the package would bring pytest into the
script's process (13 MiB and a tenth of a second here), and the script's figures would include
them. Of pytest-tfmem it loads only ``probes/sampler.py`` and ``probes/imports.py``, the framework modules
(``frameworks/tensorflow.py``, ``jax.py``, ``torch.py``, ``base.py``) and the platform modules
(``platforms/``, ``fork_sizes.py`` among them), which need nothing but the standard library, by
their paths. Forks of the script write their size at the fork into a page beside READINGS
(``fork_sizes``), which ``tfmem run``'s watchdog reads: what a fork worker grew is then known to
the page.

The thread (``tfmem-run-agent``) wakes every ``INTERVAL_S`` and reads, changing nothing the
script does: where the main thread is (its Python stack), this process's RSS, which frameworks
have started their runtime (TensorFlow, JAX, PyTorch), and, once one has, its device views'
``current`` and ``peak`` (``Framework.device_views``: TensorFlow's allocators, a JAX GPU's
``memory_stats()``, PyTorch's CUDA allocator; read, never reset). It never starts a runtime
itself, so the script can still configure its devices. A reading that differs from the last one
written (another place in the script's own code, RSS moved by 1 MiB or more, a view's level
changed), or a second after the last one, is appended to READINGS as one line of JSON in one
``write``: a kill loses none of what was written. When the script ends (by ``SystemExit``, an
exception, or falling off its end) a last line holds the process's high-water mark (the
platform's: ``VmHWM`` on Linux) and the views' peaks.
Its cost: one thread, a reading of a few microseconds ten times a second, and a line a reading
at most (about 200 bytes). Each first import of a module is a line too (``probes/imports.py``'s
ledger: what the import kept), so that the summary can give the script's own figure, first
imports apart, as the plugin gives a test's.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import sys
import sysconfig
import threading
import time
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

INTERVAL_S = 0.1
HEARTBEAT_S = 1.0
RSS_STEP = 2**20  # RSS moved by this much since the last line: a new line
FRAMES = 8  # the script's own innermost frames kept per reading
# Names of decorators' wrappers, passed over when naming the library function the script called.
WRAPPERS = {"error_handler", "wrapper", "wrapped", "inner", "decorated", "_wrapper", "__call__", "_call"}
WRAPPED_DEPTH = 4
_PROBES = Path(__file__).resolve().parent.parent / "probes"
_FRAMEWORKS = Path(__file__).resolve().parent.parent / "frameworks"
_FRAMEWORKS_PACKAGE = "_tfmem_agent_frameworks"
_PLATFORMS = Path(__file__).resolve().parent.parent / "platforms"
_PLATFORMS_PACKAGE = "_tfmem_agent_platforms"


def _load_probe(name: str) -> ModuleType:
    """``probes/NAME.py`` as a module of its own, without the ``pytest_tfmem`` package."""
    spec = importlib.util.spec_from_file_location(f"_tfmem_agent_{name}", _PROBES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _load_framework(name: str) -> ModuleType:
    """``frameworks/NAME.py`` (with the ``frameworks/`` modules it imports, all standard library
    only) under a package of its own: ``frameworks/__init__.py`` and the rest of pytest-tfmem
    are not run."""
    if _FRAMEWORKS_PACKAGE not in sys.modules:
        package = ModuleType(_FRAMEWORKS_PACKAGE)
        package.__path__ = [str(_FRAMEWORKS)]
        sys.modules[_FRAMEWORKS_PACKAGE] = package
    return importlib.import_module(f"{_FRAMEWORKS_PACKAGE}.{name}")


def _library_prefixes() -> tuple[str, ...]:
    """Where Python's own and installed modules live: frames there are not the script's."""
    paths = sysconfig.get_paths()
    found = {str(Path(paths[key]).resolve()) for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    found.add(str(Path(__file__).resolve().parent.parent))  # pytest-tfmem itself
    return tuple(sorted(found))


def where(frame: FrameType | None, libraries: tuple[str, ...]) -> dict[str, Any]:
    """The script's own innermost frames (``[function, file, line]``, innermost last) and, when
    the innermost of them is in a library call, the function it called (``fit``; decorators'
    wrappers such as Keras's ``error_handler`` passed over: ``None`` when only a wrapper is
    running, between its own lines)."""
    frames: list[tuple[str, str, int, bool]] = []
    while frame is not None:
        code = frame.f_code
        mine = not code.co_filename.startswith("<") and not os.path.abspath(code.co_filename).startswith(libraries)
        frames.append((code.co_name, code.co_filename, frame.f_lineno, mine))
        frame = frame.f_back
    frames.reverse()  # outermost first
    own = [index for index, (*_, mine) in enumerate(frames) if mine]
    if not own:
        return {"stack": [], "calling": None}
    last = own[-1]
    called = [name for name, *_ in frames[last + 1 : last + 1 + WRAPPED_DEPTH]]
    calling = next((name for name in called if name not in WRAPPERS), None)
    return {"stack": [[name, path, line] for name, path, line, mine in frames if mine][-FRAMES:], "calling": calling}


def _load_platforms() -> ModuleType:
    """``platforms/`` (its modules need only the standard library until they read another
    process) as a package of its own: the rest of pytest-tfmem is not run."""
    spec = importlib.util.spec_from_file_location(
        _PLATFORMS_PACKAGE, _PLATFORMS / "__init__.py", submodule_search_locations=[str(_PLATFORMS)]
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules[_PLATFORMS_PACKAGE] = package
    spec.loader.exec_module(package)
    return package


class _LevelNow:
    """The level an import ledger reads (``probes.imports.HostLevel``), never reset: the agent
    keeps the process's own high-water mark whole, for its last line. An import's peak is then
    its level at its end; what it kept is exact."""

    def __init__(self, current: Any) -> None:
        self.current = current
        self.peak = current

    def reset_peak(self) -> None:
        pass


class Agent:
    """Reads the script's process from a thread of its own and appends readings to a file."""

    def __init__(self, readings: str) -> None:
        self._descriptor = os.open(readings, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._libraries = _library_prefixes()
        self._main = threading.main_thread().ident or 0
        # the frameworks whose runtime the script started (named in each reading), those whose device
        # views are still to be found (a GPU's appear when the script first uses it), and the rest
        self._started: list[str] = []
        self._viewless: list[Any] = []
        self._waiting: list[Any] = [
            _load_framework("tensorflow").TensorFlow(), _load_framework("jax").Jax(), _load_framework("torch").Torch()
        ]
        self._views: list[Any] = []
        self._last: dict[str, Any] = {}
        self._written_at = float("-inf")
        self._lock = threading.Lock()
        self._sampler = _load_probe("sampler").Sampler(self._read, INTERVAL_S, "tfmem-run-agent")
        # The script's forks tell their size at the fork, for the watchdog's figures of them.
        self._platform = _load_platforms().current()  # this process's size and mark
        fork_sizes = importlib.import_module(f"{_PLATFORMS_PACKAGE}.fork_sizes")
        self._fork_sizes = fork_sizes.ForkSizes(self._platform.current_size, fork_sizes.told_sizes_path(readings))
        # What each first import kept, so that the summary gives the script's own figure beside the process's.
        self._imports = _load_probe("imports").ImportLedger(_LevelNow(self._platform.current_size))
        self._imports.add_listener(self)

    def start(self) -> Agent:
        self._write({"event": "agent", "pid": os.getpid(), "interval_s": INTERVAL_S, "time": time.time(),
                     "rss": self._platform.current_size()})  # the script's level before its first line
        self._sampler.start()
        self._fork_sizes.tell_forks()
        self._imports.install()
        atexit.register(self.finish)
        return self

    # the import ledger's listener: each first import's booking is a line
    def import_started(self, module: str) -> None:
        pass

    def import_finishing(self, module: str) -> None:
        pass

    def import_booked(self, booking: Any) -> None:
        with self._lock:
            self._write({"event": "import", "time": time.time(), "module": booking.module,
                         "host_bytes": booking.host_bytes})

    def _write(self, entry: dict[str, Any]) -> None:
        os.write(self._descriptor, (json.dumps(entry) + "\n").encode())

    def _runtimes(self) -> list[str]:
        """The frameworks whose runtime has started (``TensorFlow``, ``JAX``), in the order seen."""
        for framework in [f for f in self._waiting if f.runtime_started_elsewhere()]:
            self._waiting.remove(framework)
            self._viewless.append(framework)
            self._started.append(framework.name)
        return list(self._started)

    def _view_levels(self) -> dict[str, list[int]]:
        """``{view: [current, peak]}`` of the started frameworks' device views (``tf:CPU:0``)."""
        for framework in list(self._viewless):
            views = framework.device_views()
            if views:
                self._viewless.remove(framework)
                self._views += views
        levels = {}
        for view in self._views:
            try:
                levels[view.name] = [view.current(), view.peak()]
            except Exception:  # the framework shutting down
                continue
        return levels

    def _read(self) -> bool:
        try:
            frame = sys._current_frames().get(self._main)  # noqa: SLF001 - the one way to see another thread's stack
            runtimes = self._runtimes()  # first: a framework's views are looked for once it has started
            reading = {"rss": self._platform.current_size(), "views": self._view_levels(), "runtimes": runtimes,
                       **where(frame, self._libraries)}
        except Exception:  # the interpreter is shutting down
            return False
        del frame
        now = time.time()
        with self._lock:
            last = self._last
            moved = abs(reading["rss"] - last.get("rss", 0)) >= RSS_STEP
            changed = moved or any(reading[key] != last.get(key) for key in ("views", "runtimes", "stack"))
            if changed or time.monotonic() - self._written_at >= HEARTBEAT_S:
                self._last = reading
                self._written_at = time.monotonic()
                self._write({"event": "reading", "time": now, **reading})
        return True

    def finish(self) -> None:
        """The last line: the process's own high-water mark and the device views' peaks."""
        self._sampler.stop()
        self._imports.uninstall()
        try:
            views = self._view_levels()
            mark = self._platform.peak_mark()  # never reset here: the process's whole life
        except Exception:
            views, mark = {}, None
        with self._lock:
            self._write({"event": "exit", "time": time.time(), "high_water_mark": mark, "views": views})
            os.close(self._descriptor)


def _run(argv: list[str]) -> None:
    """Run ``SCRIPT ARGS`` or ``-m MODULE ARGS`` as ``python`` would, as ``__main__``.

    Not through ``runpy``: its frames are frozen (``<frozen runpy>``), and for each frame of a
    file that no module in ``sys.modules`` holds, ``inspect.stack()`` scans all of
    ``sys.modules``; TensorFlow's and Keras's imports call it often enough that ``import
    tensorflow`` took 0.1 s of CPU more under ``runpy``. For the same reason this module stays
    in ``sys.modules`` (as ``_tfmem_agent``) once the script is ``__main__``.
    """
    sys.excepthook = _from_the_scripts_first_frame(sys.excepthook)
    sys.modules["_tfmem_agent"] = sys.modules[__name__]
    main = ModuleType("__main__")
    if argv[0] == "-m":
        sys.path[0] = os.getcwd()
        spec = importlib.util.find_spec(argv[1])
        if spec is not None and spec.submodule_search_locations is not None:  # a package: its __main__
            spec = importlib.util.find_spec(f"{argv[1]}.__main__")
        if spec is None or spec.loader is None or spec.origin is None:
            raise SystemExit(f"{sys.executable}: No module named {argv[1]}")
        code = spec.loader.get_code(spec.name)  # type: ignore[attr-defined]
        main.__file__, main.__spec__, main.__loader__, main.__package__ = spec.origin, spec, spec.loader, spec.parent
        sys.argv = [spec.origin, *argv[2:]]
    else:
        script = os.path.abspath(argv[0])
        with open(script, "rb") as source:
            code = compile(source.read(), script, "exec")
        main.__file__ = script
        sys.argv = argv
        sys.path[0] = os.path.dirname(script)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _from_the_scripts_first_frame(hook: Any) -> Any:
    """An ``excepthook`` printing a traceback as ``python SCRIPT`` would: without the agent's
    frames above the script's first one."""
    ours = {os.path.abspath(__file__)}

    def print_from_the_script(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        while tb is not None and tb.tb_next is not None and (
            tb.tb_frame.f_code.co_filename in ours or os.path.abspath(tb.tb_frame.f_code.co_filename) in ours
        ):
            tb = tb.tb_next
        hook(kind, error.with_traceback(tb), tb)  # Python prints the exception's own traceback

    return print_from_the_script


def main() -> None:
    readings, *argv = sys.argv[1:]
    Agent(readings).start()
    _run(argv)


if __name__ == "__main__":
    main()
