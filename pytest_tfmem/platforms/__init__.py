"""The operating systems tfmem knows (Linux, macOS, Windows), each behind ``base.Platform``, and a
portable fallback through psutil that any of them can be switched to. No module outside this
package names ``/proc``, a POSIX-only signal or ``os.fork``: each asks ``current()``.

The platform is chosen once per process, at its first use: the portable one where
``TFMEM_PLATFORM=portable`` is set (or ``--tfmem-platform=portable`` selected it, which sets the
variable for the processes the session starts), else the one this system is.
"""

from __future__ import annotations

import os
import sys

from .base import EXACT, EXACT_IF_RAISED, METHODS, SAMPLED, SIGNAL_CAUSES, Ending, Missing, Platform

__all__ = [
    "EXACT", "EXACT_IF_RAISED", "METHODS", "SAMPLED", "SIGNAL_CAUSES", "Ending", "Missing", "Platform",
    "CHOICES", "ENVIRONMENT", "Chosen", "current", "select", "restore", "use", "parse_choice",
]

ENVIRONMENT = "TFMEM_PLATFORM"
AUTO, PORTABLE = "auto", "portable"
CHOICES = (AUTO, PORTABLE)

_current: Platform | None = None


def parse_choice(value: object, what: str) -> str:
    """``auto`` or ``portable``; ``ValueError`` naming the value and the accepted forms."""
    text = str(value).strip().lower()
    if text not in CHOICES:
        raise ValueError(f"invalid {what} {value!r}: expected one of {', '.join(CHOICES)}")
    return text


def native() -> Platform:
    """The module this system is: Linux, macOS, Windows, or the portable one for any other."""
    if sys.platform.startswith("linux"):
        from .linux import Linux

        return Linux()
    if sys.platform == "darwin":
        from .macos import MacOS

        return MacOS()
    if sys.platform == "win32":
        from .windows import Windows

        return Windows()
    from .portable import Portable

    return Portable()


def for_choice(choice: str) -> Platform:
    if choice == PORTABLE:
        from .portable import Portable

        return Portable()
    return native()


def current() -> Platform:
    """This process's platform (chosen at the first call; see the module's docstring)."""
    global _current
    if _current is None:
        _current = for_choice(parse_choice(os.environ.get(ENVIRONMENT, AUTO) or AUTO, f"{ENVIRONMENT} value"))
    return _current


def use(platform: Platform | None) -> None:
    """Use ``platform`` in this process from now on (one made over other files, or a stand-in
    with the same interface: the tests' way to read as another system would); ``None``: choose
    again at the next ``current()``."""
    global _current
    _current = platform


Chosen = tuple[Platform | None, "str | None"]  # a platform and the variable's value, as ``select`` found them


def select(choice: str) -> Chosen:
    """Use ``choice`` (``auto``, ``portable``) in this process and in the processes it starts from
    now (``TFMEM_PLATFORM``); returns what was chosen before, for ``restore``."""
    global _current
    before = (_current, os.environ.get(ENVIRONMENT))
    os.environ[ENVIRONMENT] = choice
    chosen = for_choice(choice)
    if _current is None or _current.name != chosen.name:
        _current = chosen
    return before


def restore(before: Chosen) -> None:
    """Undo ``select``: the platform and ``TFMEM_PLATFORM`` as they were."""
    platform, variable = before
    use(platform)
    if variable is None:
        os.environ.pop(ENVIRONMENT, None)
    else:
        os.environ[ENVIRONMENT] = variable
