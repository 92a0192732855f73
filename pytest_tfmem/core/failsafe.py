"""What the plugin does around a test must never hide the test's own outcome: an error in it
becomes a warning on the test, and the test's result stands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@contextmanager
def warn_instead(item: pytest.Item, what: str) -> Iterator[None]:
    """Run the block; an error in it (``pytest.exit`` aside) becomes the test's warning
    ``pytest-tfmem: {what}: {error!r}`` instead of replacing the test's outcome."""
    try:
        yield
    except pytest.exit.Exception:
        raise
    except Exception as error:
        item.warn(pytest.PytestWarning(f"pytest-tfmem: {what}: {error!r}"))
