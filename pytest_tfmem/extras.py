"""What to install for an optional feature, said so that it can be done.

pytest-tfmem is not on any package index, so ``pip install pytest-tfmem[trace]`` cannot work. A
hint names the packages the extra brings (each on PyPI), as the installed distribution declares
them, and the extra itself as installed from a clone or a wheel built from one.
"""

from __future__ import annotations

import importlib.util
import re
from importlib import metadata

DISTRIBUTION = "pytest-tfmem"
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([\w-]+)["']""")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def extra_packages(extra: str) -> list[str]:
    """The names of the packages ``extra`` brings, in the order the distribution lists them."""
    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    found = []
    for requirement in requirements:
        marker = _EXTRA_MARKER.search(requirement)
        name = _NAME.match(requirement)
        if marker is not None and marker.group(1) == extra and name is not None:
            found.append(name.group(1))
    return list(dict.fromkeys(found))


def install_hint(extra: str) -> str:
    """``pip install tensorboard ... (or the trace extra: pip install "/path/to/pytest-tfmem[trace]")``."""
    packages = " ".join(extra_packages(extra))
    clone = f'pip install "/path/to/pytest-tfmem[{extra}]" from a clone, or a wheel built from one'
    return f"pip install {packages} (or the {extra} extra: {clone})" if packages else clone


def installed(module: str) -> bool:
    """``module`` can be imported here (looked up, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
