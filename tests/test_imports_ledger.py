"""The import ledger: first imports booked to the import, and imports behaving as without it.

Throwaway modules written to ``tmp_path`` allocate real memory at import; no TensorFlow here.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib.machinery import ExtensionFileLoader, SourceFileLoader
from pathlib import Path

import pytest

from pytest_tfmem.probes.host import HostRSS
from pytest_tfmem.probes.imports import FirstImport, ImportLedger

MIB = 2**20
REPO = Path(__file__).resolve().parent.parent


class Heard:
    """A listener that writes down what it heard, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def import_started(self, module: str) -> None:
        self.events.append(("started", module))

    def import_finishing(self, module: str) -> None:
        self.events.append(("finishing", module))

    def import_booked(self, booking: FirstImport) -> None:
        self.events.append(("booked", booking.module))


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on ``sys.path`` for throwaway modules; they leave ``sys.modules`` afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("tfmemtest_"):
            del sys.modules[name]


@pytest.fixture
def ledger() -> Iterator[ImportLedger]:
    ledger = ImportLedger(HostRSS())
    ledger.install()
    yield ledger
    ledger.uninstall()


def write(folder: Path, name: str, source: str) -> None:
    path = folder.joinpath(*name.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))


@pytest.mark.linux  # exact marks: sampling misses a block made and freed between two of its turns
def test_a_first_import_is_booked_with_what_it_kept_and_what_it_needed(modules: Path, ledger: ImportLedger):
    write(modules, "tfmemtest_kept", """
        DATA = b"k" * (50 * 2**20)
        import tfmemtest_nested  # part of this import, not booked apart
    """)
    write(modules, "tfmemtest_nested", """
        SCRATCH = b"t" * (40 * 2**20)  # past glibc's largest mmap threshold: freed at once
        del SCRATCH  # needed, not kept
    """)
    heard = Heard()
    ledger.add_listener(heard)
    mark = ledger.mark()

    import tfmemtest_kept  # type: ignore[import-not-found]

    (booking,) = ledger.since(mark)
    assert booking.module == "tfmemtest_kept" and not booking.raised
    assert 48 * MIB <= booking.host_bytes <= 60 * MIB
    assert 88 * MIB <= booking.peak_bytes <= 105 * MIB  # the nested module's 40 MiB on top
    assert 0 < booking.duration_s < 5
    assert heard.events == [("started", "tfmemtest_kept"), ("finishing", "tfmemtest_kept"), ("booked", "tfmemtest_kept")]
    # The module has its own loader, as without the ledger.
    assert type(tfmemtest_kept.__loader__) is SourceFileLoader
    assert tfmemtest_kept.__spec__.loader is tfmemtest_kept.__loader__
    # Imported already: nothing more is booked, whatever the form of the import.
    import tfmemtest_kept as again  # type: ignore[import-not-found]  # noqa: F401

    importlib.import_module("tfmemtest_nested")
    assert ledger.since(mark) == (booking,)
    assert FirstImport.from_dict(json.loads(json.dumps(booking.to_dict()))) == booking


def test_every_form_of_import_is_booked(modules: Path, ledger: ImportLedger):
    for name in ("tfmemtest_plain", "tfmemtest_module", "tfmemtest_dunder", "tfmemtest_pkg.sub"):
        write(modules, name, "VALUE = 1\n")
    write(modules, "tfmemtest_pkg.__init__", "")
    mark = ledger.mark()
    import tfmemtest_plain  # type: ignore[import-not-found]  # noqa: F401
    from tfmemtest_pkg import sub  # type: ignore[import-not-found]  # noqa: F401

    importlib.import_module("tfmemtest_module")
    __import__("tfmemtest_dunder")  # as pytest.importorskip does
    assert [b.module for b in ledger.since(mark)] == [
        "tfmemtest_plain", "tfmemtest_pkg", "tfmemtest_pkg.sub", "tfmemtest_module", "tfmemtest_dunder",
    ]


def test_an_import_that_raises_is_booked_and_raises_as_without_the_ledger(modules: Path, ledger: ImportLedger):
    write(modules, "tfmemtest_broken", """
        DATA = b"b" * (40 * 2**20)
        raise RuntimeError("broken at import")
    """)
    mark = ledger.mark()
    for _ in range(2):  # not in sys.modules after the error: the second try is a first import too
        with pytest.raises(RuntimeError, match="broken at import"):
            import tfmemtest_broken  # type: ignore[import-not-found]  # noqa: F401
        assert "tfmemtest_broken" not in sys.modules
    bookings = ledger.since(mark)
    assert [(b.module, b.raised) for b in bookings] == [("tfmemtest_broken", True)] * 2
    assert all(b.peak_bytes >= 39 * MIB for b in bookings), bookings
    with pytest.raises(ModuleNotFoundError, match="No module named 'tfmemtest_missing'"):
        import tfmemtest_missing  # type: ignore[import-not-found]  # noqa: F401
    assert len(ledger.since(mark)) == 2


def test_reload_find_spec_and_namespace_packages_are_left_alone(modules: Path, ledger: ImportLedger):
    write(modules, "tfmemtest_reloaded", "import itertools\nCOUNT = next(itertools.count())\n")
    write(modules, "tfmemtest_namespace.inner", "VALUE = 2\n")  # no __init__.py: a namespace package
    mark = ledger.mark()
    spec = importlib.util.find_spec("tfmemtest_reloaded")
    assert spec is not None and type(spec.loader) is SourceFileLoader  # only asked where it is
    import tfmemtest_reloaded  # type: ignore[import-not-found]

    assert importlib.reload(tfmemtest_reloaded) is tfmemtest_reloaded
    import tfmemtest_namespace.inner  # type: ignore[import-not-found]

    assert tfmemtest_namespace.inner.VALUE == 2
    assert [b.module for b in ledger.since(mark)] == ["tfmemtest_reloaded", "tfmemtest_namespace.inner"]


def test_a_c_extension_is_booked_and_keeps_its_loader(ledger: ImportLedger):
    candidates = ("_bz2", "_lzma", "_sqlite3", "_curses", "_dbm", "_gdbm", "_tkinter", "xxlimited", "_testbuffer")
    name = next((n for n in candidates if n not in sys.modules and importlib.util.find_spec(n)), None)
    if name is None:
        pytest.fail(f"every one of {candidates} is imported already or missing: pick another extension module")
    mark = ledger.mark()
    module = importlib.import_module(name)
    assert [b.module for b in ledger.since(mark)] == [name]
    assert type(module.__loader__) is ExtensionFileLoader
    assert module.__spec__.loader is module.__loader__


def test_install_is_idempotent_and_uninstall_stops_booking(modules: Path):
    ledger = ImportLedger(HostRSS())
    ledger.install()
    ledger.install()
    assert [finder for finder in sys.meta_path if finder is ledger] == [ledger]
    ledger.uninstall()
    assert not ledger.installed
    write(modules, "tfmemtest_unbooked", "")
    import tfmemtest_unbooked  # type: ignore[import-not-found]  # noqa: F401

    assert ledger.since(0) == ()


IMPORTS_REPORT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pytest_tfmem.probes.host import HostRSS
from pytest_tfmem.probes.imports import ImportLedger
if sys.argv[2] == "with":
    ImportLedger(HostRSS()).install()
before = set(sys.modules)
import json.tool, sqlite3, tfmemtest_fresh
print(json.dumps({
    "new": sorted(set(sys.modules) - before),
    "loaders": {name: type(sys.modules[name].__loader__).__name__ for name in sorted(set(sys.modules) - before)},
}))
"""


def test_sys_modules_are_what_they_are_without_the_ledger(modules: Path):
    write(modules, "tfmemtest_fresh", "import csv, decimal, tfmemtest_fresh_child\n")
    write(modules, "tfmemtest_fresh_child", "import statistics\n")

    def imported(mode: str) -> dict[str, object]:
        run = subprocess.run(
            [sys.executable, "-c", IMPORTS_REPORT, str(modules), mode],
            capture_output=True, text=True, check=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""},
        )
        return json.loads(run.stdout)  # type: ignore[no-any-return]

    without, with_ledger = imported("without"), imported("with")
    assert "tfmemtest_fresh_child" in without["new"] and "_sqlite3" in without["new"]  # type: ignore[operator]
    assert with_ledger == without


class ImportsWhenBooked(Heard):
    """A listener that imports a module of its own while it hears of a booking."""

    def import_booked(self, booking: FirstImport) -> None:
        super().import_booked(booking)
        importlib.import_module("tfmemtest_listeners_own")


class FailsWhileFinishing(Heard):
    def import_finishing(self, module: str) -> None:
        raise LookupError(f"listener failed on {module}")


def test_listeners_imports_are_the_spans_and_their_errors_close_it(modules: Path, ledger: ImportLedger):
    for name in ("tfmemtest_outer", "tfmemtest_listeners_own", "tfmemtest_second"):
        write(modules, name, "")
    importing = ImportsWhenBooked()
    ledger.add_listener(importing)
    mark = ledger.mark()
    import tfmemtest_outer  # type: ignore[import-not-found]  # noqa: F401

    assert [b.module for b in ledger.since(mark)] == ["tfmemtest_outer"]
    assert "tfmemtest_listeners_own" in sys.modules and not ledger.importing
    ledger.remove_listener(importing)
    ledger.add_listener(FailsWhileFinishing())
    with pytest.raises(LookupError, match="listener failed on tfmemtest_second"):
        import tfmemtest_second  # type: ignore[import-not-found]  # noqa: F401
    assert [b.module for b in ledger.since(mark)] == ["tfmemtest_outer", "tfmemtest_second"]
    assert not ledger.importing
