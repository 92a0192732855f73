"""The file-backed pages a process has in memory, for a fork of it to map again before it runs a test.

Linux does not copy a fork the page-table entries of file mappings never written (libraries' code
and read-only data): the fork maps each such page again the first time it touches it, though the
pages are in memory and shared, and its resident size and high-water mark count them then. A test
run in a fork of a process that imported TensorFlow would count the library pages it runs, which a
fresh interpreter mapped while it imported them: a small Keras fit grew a plain fork by 32.4 MiB and
the process by 14.1 MiB (``python -m benchmarks.fork_file_pages``). ``FilePages.read()`` in the parent
notes the ranges in memory (``/proc/self/maps`` and ``/proc/self/pagemap``'s present bit), and
``map_again()`` in the fork faults them in with ``madvise(MADV_POPULATE_READ)`` (Linux 5.14),
before the test: the fork then reads as the parent, or a fresh interpreter, would.

Only the standard library, ``ctypes`` once there is something to map: ``tfmem run``'s agent loads
the platform modules into a script's process, and the project's tests' forking process loads this
one by its path.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass

MADV_POPULATE_READ = 22
_PRESENT = 1 << 63  # a /proc/self/pagemap entry's bit: the page is in memory
_ENTRY = 8  # bytes of a pagemap entry


@dataclass(frozen=True)
class FilePages:
    """``(address, length)`` ranges of file-backed pages in memory; none where they cannot be read."""

    ranges: tuple[tuple[int, int], ...] = ()

    @property
    def size(self) -> int:
        return sum(length for _, length in self.ranges)

    @classmethod
    def read(cls) -> FilePages:
        """This process's resident file-backed ranges (Linux); none where ``/proc`` will not say."""
        page = os.sysconf("SC_PAGE_SIZE")
        ranges = []
        try:
            with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pagemap:
                for line in maps:
                    fields = line.split()
                    if len(fields) < 6 or not fields[5].startswith("/") or fields[5].startswith("/dev/"):
                        continue  # anonymous memory (a fork has it mapped), or a device's (no pages to map)
                    start, end = (int(address, 16) for address in fields[0].split("-"))
                    count = (end - start) // page
                    pagemap.seek(start // page * _ENTRY)
                    entries = struct.unpack(f"{count}Q", pagemap.read(count * _ENTRY))
                    first = None
                    for index, entry in enumerate((*entries, 0)):
                        if entry & _PRESENT and first is None:
                            first = index
                        elif not entry & _PRESENT and first is not None:
                            ranges.append((start + first * page, (index - first) * page))
                            first = None
        except (OSError, struct.error):  # no /proc, or a mapping that changed while it was read
            return cls()
        return cls(tuple(ranges))

    def map_again(self) -> None:
        """In a fork of the process that read them: fault the ranges in, read-only. Nothing on a
        kernel older than 5.14, which does not know the advice; a range no longer mapped is skipped."""
        if not self.ranges:
            return
        import ctypes

        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        for address, length in self.ranges:
            if madvise(address, length, MADV_POPULATE_READ) != 0 and ctypes.get_errno() == errno.EINVAL:
                return
