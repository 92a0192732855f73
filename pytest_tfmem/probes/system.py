"""The machine's side of memory: the limit that applies to this process, what is still
available, and how often the OOM killer has struck, as the platform tells them (``platforms``:
Linux's memory cgroups and their ``oom_kill`` counts; physical memory elsewhere, with no count).
"""

from __future__ import annotations

from pytest_tfmem import platforms
from pytest_tfmem.platforms.base import MemoryLimit, OomKillCount

__all__ = ["MemoryLimit", "OomKillCount", "applicable_memory_limit", "available_memory", "oom_kill_counter",
           "oom_kills_since"]


def applicable_memory_limit() -> MemoryLimit:
    """The tightest limit on this process's memory: a cgroup's, else physical memory."""
    return platforms.current().memory_limit()


def available_memory() -> int:
    """Memory a process could still take, under every limit that applies."""
    return platforms.current().available_memory()


def oom_kill_counter() -> OomKillCount | None:
    """The OOM killer's count of kills where this process runs (this cgroup's, else the machine's);
    ``None`` where the platform keeps none."""
    return platforms.current().oom_kill_counter()


def oom_kills_since(before: OomKillCount | None) -> OomKillCount | None:
    """How far the count read as ``before`` has risen since (same scope); ``None`` if unknown."""
    return platforms.current().oom_kills_since(before)
