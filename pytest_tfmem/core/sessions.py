"""The session every process of a pytest session (or a ``tfmem run``) serves: its id and origin.

Kept apart from ``processes`` (which needs pytest) so that ``tfmem run`` can name its run
without importing pytest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Session:
    """The session every process of it serves (the main process's figures)."""

    started: float  # time.time() when the main process made it
    pid: int
    pid_created: float  # the main process's start time (tells a reused pid apart)
    rootdir: str
    args: tuple[str, ...]  # the main process's command-line arguments

    @property
    def id(self) -> str:
        """``18c9f0a3b2e-4242``: the start in milliseconds (hex) and the pid."""
        return f"{int(self.started * 1000):x}-{self.pid}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["args"] = list(self.args)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Session:
        return cls(**{**data, "args": tuple(data["args"])})
