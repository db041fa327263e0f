"""Writing one unit: its graph read to the end, its shards published, then its record.

A unit is done when its record (``_datapipes/units/<unit>.json``: its shards
with their record counts, sizes and checksums) exists; the shards are published
before it, each complete or absent. A writer killed anywhere leaves either
the record (done) or no record (the unit is written again, and its shards,
the same bytes under the same names, replace whatever it had published).

A shard is written to its temporary file as it is encoded (no whole shard in
memory), then fsynced, checksummed (mapped from the page cache, one call
without the GIL) and renamed on a thread of the writer's while the next one
is read and encoded: checksums and file I/O release the GIL, so they overlap
the encoding where a core is free.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from datapipes.pipe import DataPipe
from datapipes.write.destination import META, Destination, NewFile
from datapipes.write.formats import ShardFormat, shard_format
from datapipes.write.shard_plan import Unit, WritePlan

#: Bumped when the layout of unit records or the manifest changes.
WRITE_VERSION = 2


def unit_record_name(unit: Unit) -> str:
    return f"{META}/units/{unit.name}.json"


def encode_json(value: Any) -> bytes:
    """JSON bytes that depend on nothing but ``value`` (sorted keys, fixed spacing)."""
    return (json.dumps(value, sort_keys=True, indent=1) + "\n").encode()


def read_unit_record(dest: Destination, plan: WritePlan, unit: Unit) -> dict[str, Any] | None:
    """``unit``'s record if it is done for this plan, else ``None`` (not written yet, or
    damaged: written again)."""
    raw = dest.read(unit_record_name(unit))
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not (
        isinstance(record, dict)
        and record.get("version") == WRITE_VERSION
        and record.get("unit") == unit.index
        and record.get("fingerprint") == plan.fingerprint
        and record.get("input") == plan.input_digest
        and isinstance(record.get("shards"), list)
    ):
        return None
    return record


@dataclass
class UnitWriter:
    """Writes units of ``plan`` to ``dest`` (picklable: DataLoader workers write too)."""

    pipe: DataPipe[Any]
    plan: WritePlan
    url: str
    storage_options: dict[str, Any]
    stale_seconds: float

    def __post_init__(self) -> None:
        self._dest: Destination | None = None
        self._format: ShardFormat | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_dest": None, "_format": None}

    @property
    def dest(self) -> Destination:
        if self._dest is None:
            self._dest = Destination(self.url, self.storage_options)
        return self._dest

    def __call__(self, index: int) -> dict[str, Any]:
        """Write unit ``index`` unless it is done; ``{"unit": index, "written": bool}``."""
        unit = self.plan.units[index]
        done = read_unit_record(self.dest, self.plan, unit) is not None
        if not done:
            self.write(unit)
        return {"unit": index, "written": not done}

    def write(self, unit: Unit) -> dict[str, Any]:
        dest, options = self.dest, self.plan.options
        if self._format is None:
            self._format = shard_format(options.format)
        fmt = self._format
        marker = dest.mark_writing(unit.name)
        touched = time.monotonic()
        publisher = _Publisher(options.checksum)
        records: list[Any] = []
        size = 0
        count = 0  # records of the unit in earlier shards
        per_shard, per_bytes = options.records_per_shard, options.bytes_per_shard
        touch_after = self.stale_seconds / 4

        def flush() -> None:
            nonlocal records, size, count
            name = self.plan.shard_name(unit, publisher.shards)
            keys: list[str] = []
            if fmt.keyed:
                prefix = f"{unit.name}-"
                keys = [f"{prefix}{i:08d}" for i in range(count, count + len(records))]
            shard = dest.create(name)
            try:
                fmt.write_shard(records, keys, shard)
            except BaseException:
                shard.discard()
                raise
            publisher.put(name, shard, len(records))
            count += len(records)
            records, size = [], 0

        root = self.pipe.build(self.plan.context(unit))
        monotonic = time.monotonic
        try:  # a unit that fails here is no longer being written: its marker goes
            root.reset(None)
            for record in root:
                records.append(record)
                if per_bytes is not None:
                    size += fmt.size_of(record)
                if (per_shard is not None and len(records) >= per_shard) or (
                    per_bytes is not None and size >= per_bytes
                ):
                    flush()
                if monotonic() - touched > touch_after:
                    marker = dest.mark_writing(unit.name)  # still alive: not abandoned
                    touched = monotonic()
            if records:
                flush()
            shards = publisher.finish()
        except BaseException:
            publisher.close()
            dest.remove(marker)
            raise
        finally:
            root.close()
        record = {
            "version": WRITE_VERSION,
            "unit": unit.index,
            "fingerprint": self.plan.fingerprint,
            "input": self.plan.input_digest,
            "shards": shards,
        }
        dest.publish(unit_record_name(unit), encode_json(record))
        dest.remove(marker)
        return record


class _Publisher:
    """Publishes one unit's shards in order on a thread of its own (see the module doc):
    each written to its file by the unit's writer, then fsynced, checksummed (mapped from
    the page cache) and renamed here while the next one is written."""

    def __init__(self, checksum: str) -> None:
        self.checksum = checksum
        self.entries: list[dict[str, Any]] = []
        self.shards = 0  # shards put so far
        self._pending: Future[dict[str, Any]] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def put(self, name: str, shard: NewFile, records: int) -> None:
        try:
            self._wait()
        except BaseException:
            shard.discard()
            raise
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="datapipes-write")
        self._pending = self._pool.submit(self._publish, name, shard, records, self.checksum)
        self.shards += 1

    @staticmethod
    def _publish(name: str, shard: NewFile, records: int, checksum: str) -> dict[str, Any]:
        try:
            size, digest = shard.commit(checksum)
        except BaseException:
            shard.discard()
            raise
        return {"name": name, "records": records, "bytes": size, "checksum": digest}

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.entries.append(pending.result())  # a failed publish raises here

    def finish(self) -> list[dict[str, Any]]:
        """Every shard's entry, once all are published."""
        self._wait()
        self.close()
        return self.entries

    def close(self) -> None:
        """Wait for the shard being published (its error is the caller's to raise, or not)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
