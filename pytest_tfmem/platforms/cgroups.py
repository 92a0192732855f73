"""Linux's memory cgroups: the limit that applies to this process, what is still available, and
how often the kernel's OOM killer has struck.

The limit is the tightest of the cgroup limits on the way from this process's cgroup to the
root (cgroup v2 ``memory.max``, cgroup v1 ``memory.limit_in_bytes``) and physical memory.
Inside a container the cgroup path in ``/proc/self/cgroup`` may not exist under the
mounted hierarchy (the container sees its own cgroup as the root); the mount's root files
are read then.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .base import MemoryLimit, OomKillCount

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
VMSTAT = Path("/proc/vmstat")
# cgroup v1 writes "no limit" as the largest page-aligned 64-bit number.
_V1_UNLIMITED = 2**62


@dataclass(frozen=True)
class _CgroupFiles:
    """The files of one memory cgroup that tfmem reads."""

    version: int
    directory: Path

    @property
    def limit_file(self) -> Path:
        return self.directory / ("memory.max" if self.version == 2 else "memory.limit_in_bytes")

    @property
    def usage_file(self) -> Path:
        return self.directory / ("memory.current" if self.version == 2 else "memory.usage_in_bytes")

    @property
    def events_file(self) -> Path:
        return self.directory / ("memory.events" if self.version == 2 else "memory.oom_control")


def memory_cgroup_dirs(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> list[_CgroupFiles]:
    """This process's memory cgroup and its ancestors, innermost first."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return []
    found: list[_CgroupFiles] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2 unified hierarchy: "0::/path"
            version, mount = 2, root if (root / "cgroup.controllers").exists() else root / "unified"
        elif "memory" in controllers.split(","):
            version, mount = 1, root / "memory"
        else:
            continue
        directory = mount / path.lstrip("/")
        if not directory.is_dir():  # namespaced: the container's cgroup is the mount's root
            directory = mount
        while True:
            files = _CgroupFiles(version, directory)
            if files.limit_file.exists() or files.events_file.exists():
                found.append(files)
            if directory == mount or directory.parent == directory:
                break
            directory = directory.parent
    return found


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2, no limit) -> None


def applicable_memory_limit(
    physical: int, root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP
) -> MemoryLimit:
    """The tightest of the cgroup limits (v2 or v1) and ``physical`` memory."""
    best = MemoryLimit(physical, "physical memory")
    for cgroup in memory_cgroup_dirs(root, proc_cgroup):
        value = _read_int(cgroup.limit_file)
        if value is None or value >= _V1_UNLIMITED:
            continue
        if value < best.bytes:
            name = "memory.max" if cgroup.version == 2 else "memory.limit_in_bytes"
            best = MemoryLimit(value, f"cgroup v{cgroup.version} {name} ({cgroup.limit_file})")
    return best


def available_memory(system_available: int, root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int:
    """Memory a process could still take: the smaller of ``system_available`` and the room left
    under each limited cgroup on the way to the root."""
    available = system_available
    for cgroup in memory_cgroup_dirs(root, proc_cgroup):
        limit, usage = _read_int(cgroup.limit_file), _read_int(cgroup.usage_file)
        if limit is not None and limit < _V1_UNLIMITED and usage is not None:
            available = min(available, max(0, limit - usage))
    return available


def oom_kill_count(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """Processes the kernel's OOM killer has killed in this process's memory cgroup
    (``oom_kill`` in ``memory.events`` or v1 ``memory.oom_control``); ``None`` if unknown."""
    for cgroup in memory_cgroup_dirs(root, proc_cgroup):
        try:
            lines = cgroup.events_file.read_text().splitlines()
        except OSError:
            continue
        count = _oom_kill_line(lines)
        if count is not None:
            return count
    return None


def machine_oom_kill_count(vmstat: Path = VMSTAT) -> int | None:
    """Processes the kernel's OOM killer has killed on the machine since boot (``oom_kill``
    in ``/proc/vmstat``, Linux >= 4.13); ``None`` if unknown."""
    try:
        return _oom_kill_line(vmstat.read_text().splitlines())
    except OSError:
        return None


def _oom_kill_line(lines: list[str]) -> int | None:
    for line in lines:
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def oom_kill_counter() -> OomKillCount | None:
    """This cgroup's ``oom_kill`` count where the cgroup keeps one, else the machine's."""
    cgroup = oom_kill_count()
    if cgroup is not None:
        return OomKillCount(cgroup, "this cgroup")
    machine = machine_oom_kill_count()
    return None if machine is None else OomKillCount(machine, "the machine")


def oom_kills_since(before: OomKillCount | None) -> OomKillCount | None:
    """How far the count read as ``before`` has risen since (same scope); ``None`` if unknown."""
    if before is None:
        return None
    now = oom_kill_count() if before.scope == "this cgroup" else machine_oom_kill_count()
    return None if now is None else OomKillCount(now - before.count, before.scope)
