"""The session's test records, kept on disk as they come, so that what tfmem holds in memory per
test stays small and does not grow with the suite.

A record stays in memory from its call report until its teardown report, which adds what the
test left behind (``TfmemManager._add_retained``); then its fields (``TestRecord.to_dict``) are
written out, pickled, to an unnamed temporary file (gone with the process, whatever ends it; only
this process reads it, so pickle's speed is had without its risks: a quarter of the time the same
dict took to encode as JSON). In memory, each test costs its node id and where its record starts
in the file. The summaries and reports at the session's end read the records back and build them
again from those fields (``TestRecord.from_dict``): records unpickled whole kept objects with
larger dictionaries, 190 bytes a test more in the session's account at the end.

One record per test: the last attempt's (pytest-rerunfailures), with the number of attempts
before it (``core.attempts``).
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Iterator
from typing import IO

from pytest_tfmem.core.record import TestRecord


class RecordStore:
    """Every measured test's record of this session (``TestRecord``), on disk once complete."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None  # opened with the first record written
        self._open: dict[str, TestRecord] = {}  # awaiting their teardown report, in arrival order
        self._offsets: dict[str, list[int]] = {}  # where each test's written records start
        self._replaced: set[int] = set()  # written records of attempts a later attempt replaced
        self._size = 0  # bytes written
        self._at_end = True  # the file's position: moved by a read, found again before a write
        self._count = 0
        self.changes = 0  # how many times a record was added or written: readers cache by it

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def add(self, record: TestRecord) -> None:
        """Keep ``record`` in memory until ``close``; a later attempt's record replaces the earlier
        attempts'. Those are the ones ``record`` counts, and those retried (outcome ``rerun``): a
        report tfmem makes itself for an isolated test whose process died has no count."""
        if record.nodeid in self._open:
            self.close(record.nodeid)
        offsets = self._offsets.get(record.nodeid, [])
        earlier = [offset for offset in offsets if record.reruns or self._read_at(offset).outcome == "rerun"]
        if earlier:
            record.reruns = max(record.reruns, len(earlier))
            self._replaced.update(earlier)
            self._offsets[record.nodeid] = [offset for offset in offsets if offset not in earlier]
            self._count -= len(earlier)
        self._open[record.nodeid] = record
        self._count += 1
        self.changes += 1

    def open_record(self, nodeid: str) -> TestRecord | None:
        """The test's record while it awaits its teardown report, or ``None``."""
        return self._open.get(nodeid)

    def close(self, nodeid: str) -> None:
        """The test's record is complete: write it out of memory."""
        record = self._open.pop(nodeid, None)
        if record is None:
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="tfmem-records-")  # noqa: SIM115 (open for the session)
        if not self._at_end:  # (a seek flushes the file's buffer: not one per test)
            self._file.seek(self._size)
            self._at_end = True
        self._offsets.setdefault(nodeid, []).append(self._size)
        pickled = pickle.dumps(record.to_dict(), protocol=pickle.HIGHEST_PROTOCOL)
        self._file.write(pickled)
        self._size += len(pickled)
        self.changes += 1

    def __iter__(self) -> Iterator[TestRecord]:
        """The records, read back: those written, in the order their tests completed, then those
        still awaiting a teardown report (a test whose process was lost)."""
        if self._file is not None:
            self._file.flush()
            end, offset = self._size, 0
            self._at_end = False
            while offset < end:
                self._file.seek(offset)  # the reader may have moved it (a record written, another read)
                record = TestRecord.from_dict(pickle.load(self._file))
                written, offset = offset, self._file.tell()
                if written not in self._replaced:
                    yield record
        yield from list(self._open.values())

    def by_nodeid(self) -> Iterator[TestRecord]:
        """The records in node-id order, as ``sorted(store, key=nodeid)`` gives them (a test's
        records in the order ``__iter__`` yields them), each read from disk as it is reached: only
        the node ids and where their records start are sorted in memory."""
        written = [(nodeid, 0, offset) for nodeid, offsets in self._offsets.items() for offset in offsets]
        still_open = [(nodeid, 1, index) for index, nodeid in enumerate(self._open)]
        if self._file is not None:
            self._file.flush()
        opened = list(self._open.values())
        for _, where, place in sorted(written + still_open):
            yield self._read_at(place) if where == 0 else opened[place]

    def _read_at(self, offset: int) -> TestRecord:
        assert self._file is not None
        self._at_end = False
        self._file.seek(offset)
        return TestRecord.from_dict(pickle.load(self._file))

    def remove(self) -> None:
        """Remove the file (the session is over)."""
        if self._file is not None:
            self._file.close()
