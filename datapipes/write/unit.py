"""Writing one unit: its graph read to the end, its shards published, then its record.

A unit is done when its record (``_datapipes/units/<unit>.json``: its shards
with their record counts, sizes and sha256) exists; the shards are published
before it, each complete or absent. A writer killed anywhere leaves either
the record (done) or no record (the unit is written again, and its shards,
the same bytes under the same names, replace whatever it had published).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from datapipes.pipe import DataPipe
from datapipes.write.destination import META, Destination
from datapipes.write.formats import ShardFormat, shard_format
from datapipes.write.plan import Unit, WritePlan

#: Bumped when the layout of unit records or the manifest changes.
WRITE_VERSION = 1


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
        shards: list[dict[str, Any]] = []
        records: list[Any] = []
        keys: list[str] = []
        size = 0
        count = 0

        def flush() -> None:
            nonlocal records, keys, size
            name = self.plan.shard_name(unit, len(shards))
            data = fmt.encode(records, keys)
            dest.publish(name, data)
            shards.append(
                {
                    "name": name,
                    "records": len(records),
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
            records, keys, size = [], [], 0

        root = self.pipe.build(self.plan.context(unit))
        try:  # a unit that fails here is no longer being written: its marker goes
            root.reset(None)
            for record in root:
                records.append(record)
                keys.append(f"{unit.name}-{count:08d}")
                count += 1
                if options.bytes_per_shard is not None:
                    size += fmt.size_of(record)
                full = (
                    options.records_per_shard is not None
                    and len(records) >= options.records_per_shard
                ) or (options.bytes_per_shard is not None and size >= options.bytes_per_shard)
                if full:
                    flush()
                if time.monotonic() - touched > self.stale_seconds / 4:
                    marker = dest.mark_writing(unit.name)  # still alive: not abandoned
                    touched = time.monotonic()
            if records:
                flush()
        except BaseException:
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
