"""Notebooks run as tests: a kernel's start and first imports are the kernel's, not the notebook's.

Under nbmake (a notebook, one test, in a kernel it starts) and nbval (a cell, one test, in a kernel
started before the first cell), a measured test's figure includes the kernel: ``import numpy,
keras`` in a first cell read 585 MiB before any of the notebook's own work. Before the first
notebook item of a measured session (a session that runs none pays nothing), tfmem writes each
installed Python kernelspec again, in a folder of its own named first in ``JUPYTER_PATH``, with
one argument more: ``--ext=pytest_tfmem.probes.process_books``.
The kernels the runners start then book their start and each first import in ``TFMEM_PROCESS_BOOKS``
(``probes.process_books``), and the windows leave those out of the kernel's figure, as a test
process's own first imports are: the budget holds the notebook's own need, and the test's section
says what was booked apart. ``--tfmem-notebook-kernel=whole`` (ini ``tfmem_notebook_kernel``) keeps
the runners' kernels as they are, so that the whole kernel is held to the budget (a 12 GB Colab
machine). Both variables are put back, and the folder removed, when the session ends.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pytest_tfmem.core import settings
from pytest_tfmem.core.manager import manager
from pytest_tfmem.probes.process_books import FOLDER

OWN, WHOLE = "own", "whole"
EXTENSION = "pytest_tfmem.probes.process_books"


def _parse_kernel(value: object, what: str) -> str:
    if value not in (OWN, WHOLE):
        raise ValueError(f"invalid {what} {value!r}: expected {OWN} (the notebook's own need; the kernel's start "
                         f"and first imports booked apart) or {WHOLE} (the whole kernel)")
    return str(value)


NOTEBOOK_KERNEL = settings.Option(
    "notebook_kernel",
    f"under nbmake or nbval, what a notebook test is held to: {OWN} (default: its own need; the kernel's start and "
    f"first imports are booked apart) or {WHOLE} (the whole kernel, as a machine's limit sees it)",
    _parse_kernel,
    OWN,
)
OPTIONS = [NOTEBOOK_KERNEL]


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser, OPTIONS)


class KernelBooks:
    """The kernelspecs and the books' folder of one process of the session, while it runs tests."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.kernel = settings.read_option(config, NOTEBOOK_KERNEL)[0]
        self.folder: Path | None = None
        self._saved: dict[str, str | None] = {}
        self._prepared = False  # the first notebook item came
        self._notebooks = False  # the session collected notebook items

    @pytest.hookimpl(tryfirst=True)  # before pytest sets up the item's collectors: nbval starts its kernel there
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Before the first notebook item of a measured session (nbmake's, nbval's), once: a session
        that runs no notebook pays nothing (reading the kernelspecs takes almost half a second)."""
        if self._prepared or not is_notebook_item(item):
            return
        self._prepared = True
        if not manager(self.config).is_measured(item) or self.kernel == WHOLE or FOLDER in os.environ:
            return
        specs = python_kernelspecs()
        if not specs:
            return
        self.folder = Path(tempfile.mkdtemp(prefix="tfmem-kernels-"))
        for name, spec in specs.items():
            directory = self.folder / "kernels" / name
            directory.mkdir(parents=True)
            (directory / "kernel.json").write_text(json.dumps({**spec, "argv": [*spec["argv"], f"--ext={EXTENSION}"]}))
        books = self.folder / "books"
        books.mkdir()
        self._set(FOLDER, str(books))
        self._set("JUPYTER_PATH", os.pathsep.join(filter(None, [str(self.folder), os.environ.get("JUPYTER_PATH")])))

    def _set(self, name: str, value: str) -> None:
        self._saved.setdefault(name, os.environ.get(name))
        os.environ[name] = value

    @pytest.hookimpl
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self._notebooks = any(is_notebook_item(item) for item in items)

    @pytest.hookimpl
    def pytest_report_collectionfinish(self) -> list[str]:
        """Said where notebooks are among the session's tests, and measured."""
        if not self._notebooks or not manager(self.config).measure_all:
            return []
        if self.kernel == WHOLE:
            return ["tfmem: notebook kernels are held whole, their start and first imports included "
                    "(--tfmem-notebook-kernel=whole)"]
        return ["tfmem: notebook kernels book their start and first imports apart (--tfmem-notebook-kernel=whole "
                "holds the whole kernel)"]

    @pytest.hookimpl
    def pytest_unconfigure(self) -> None:
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def is_notebook_item(item: pytest.Item) -> bool:
    """A notebook (nbmake) or a notebook's cell (nbval), whose code runs in a kernel."""
    return type(item).__module__.split(".", 1)[0] in ("nbmake", "nbval")


def python_kernelspecs() -> dict[str, dict[str, Any]]:
    """Every installed kernelspec that runs ipykernel (``python3``, a virtual environment's), by
    name, as jupyter_client finds it (imported only where nbmake or nbval already imported it)."""
    if "jupyter_client" not in sys.modules:
        return {}
    from jupyter_client.kernelspec import KernelSpecManager

    found = {}
    manager_ = KernelSpecManager()
    for name in manager_.find_kernel_specs():
        try:
            spec = manager_.get_kernel_spec(name).to_dict()
        except Exception:  # a broken kernelspec is the runner's to report
            continue
        if any("ipykernel" in str(argument) for argument in spec.get("argv", [])):
            found[name] = spec
    return found


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(KernelBooks(config), "tfmem-kernels")
