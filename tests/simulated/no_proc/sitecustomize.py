"""A system without ``/proc``, as macOS is, for pytest-tfmem's own modules: a path under ``/proc``
opened, listed or tested by code in ``pytest_tfmem`` does not exist. psutil still reads the
system its own way, as it does on macOS. Used as ``PYTHONPATH=tests/simulated/no_proc`` by
tests/test_platforms.py.
"""

import builtins
import io
import os
import sys

_open, _os_open, _listdir, _exists = builtins.open, os.open, os.listdir, os.path.exists


def _hidden(path) -> bool:
    return str(path).startswith("/proc") and "pytest_tfmem" in sys._getframe(2).f_code.co_filename


def _refuse(path):
    raise FileNotFoundError(2, "No such file or directory (no /proc here)", str(path))


def _open_file(file, *args, **kwargs):
    return _refuse(file) if _hidden(file) else _open(file, *args, **kwargs)


def _open_descriptor(path, *args, **kwargs):
    return _refuse(path) if _hidden(path) else _os_open(path, *args, **kwargs)


def _list(path="."):
    return _refuse(path) if _hidden(path) else _listdir(path)


def _path_exists(path):
    return False if _hidden(path) else _exists(path)


builtins.open = io.open = _open_file
os.open = _open_descriptor
os.listdir = _list
os.path.exists = _path_exists
