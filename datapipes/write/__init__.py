"""``dp.write``: a dataset written from a recipe, exactly once, whatever is killed on the way.

Every rank of a job calls :func:`write` with the same recipe and destination.
The recipe's input is cut into units (:mod:`datapipes.write.shard_plan`); each unit
becomes its own shards, named after the unit, written by whichever rank or
DataLoader worker gets it (a :class:`datapipes.Loader` deals the units, with
the Loader's own options). A rank that has written its share helps with the
units nobody holds any more (their writer died or stalled), so the call
returns once every unit is done, on every rank, and then writes the manifest.

Nothing is kept in memory or in a checkpoint: the destination itself is the
state. Kill any rank or worker at any moment and call :func:`write` again, on
any number of ranks: the units already done are skipped, the others written
again, and the output is byte for byte that of one uninterrupted process.

May import: nodes, datapipes.pipe, datapipes.identity, datapipes.steps, datapipes.resume,
datapipes.loader.
"""

from __future__ import annotations

import json
import time
import warnings
from typing import Any

from datapipes.pipe import DataPipe
from datapipes.write.checksum import check_algorithm
from datapipes.write.destination import META, Destination
from datapipes.write.manifest import (
    MANIFEST,
    Manifest,
    ShardEntry,
    ShardMismatchError,
    WriteConflictError,
    parse_manifest,
    read_manifest,
)
from datapipes.write.shard_plan import WriteOptions, WritePlan, make_plan
from datapipes.write.unit import UnitWriter, encode_json, read_unit_record
from nodes.credentials import scrubbing

__all__ = [
    "Manifest", "ShardEntry", "ShardMismatchError", "WriteConflictError", "read_manifest", "write",
]  # fmt: skip

PLAN = f"{META}/plan.json"
#: Seconds between looks at the units other ranks still hold.
HELP_POLL_SECONDS = 0.2


@scrubbing
def write(
    pipe: DataPipe[Any],
    dest: str,
    *,
    format: str = "jsonl",
    records_per_shard: int | None = 10_000,
    bytes_per_shard: int | None = None,
    min_units: int = 8,
    unit_items: int = 10_000,
    seed: int = 0,
    prefix: str = "shard",
    checksum: str = "crc32",
    overwrite: bool = False,
    stale_seconds: float = 60.0,
    storage_options: dict[str, Any] | None = None,
    **loader_options: Any,
) -> Manifest:
    """Write ``pipe``'s records to ``dest`` (any fsspec URL) as ``format`` shards
    (``"jsonl"``, ``"tar"``: webdataset samples, ``"parquet"``: pyarrow); the manifest.

    Call it on every rank of a job; ``loader_options`` are the
    :class:`datapipes.Loader`'s (``rank``, ``world_size``, ``num_workers``,
    ``dispatch``, ``store``, ``progress``...) and say who writes which units.
    It returns on each rank once the whole output is written.

    A shard holds at most ``records_per_shard`` records and about
    ``bytes_per_shard`` bytes, and never spans units: unit ``u`` is written as
    ``<prefix>-<u>-<k>.<format>``. Units are input files, split into parts
    until there are ``min_units`` (splittable formats), or runs of
    ``unit_items`` positions of a random-access source; a unit killed midway
    is written again whole, so keep them small enough to redo.

    Each shard appears complete or not at all; the manifest (``manifest.json``:
    every shard with its record count, size and ``checksum`` (``"crc32"``, or
    ``"sha256"`` for a content hash), and the recipe's fingerprint) appears
    last; :meth:`Manifest.verify` checks the shards against it. Calling it
    again on a complete output returns the manifest and writes nothing; a
    destination holding another recipe's or another input's output is a
    :class:`WriteConflictError` unless
    ``overwrite=True``. A unit whose writer has not shown a sign of life for
    ``stale_seconds`` (killed, or stopped) is written again by another rank.

    >>> import datapipes as dp
    >>> manifest = dp.write(dp.range(25).map(lambda x: {"x": x}), "memory://doc/write",
    ...                     records_per_shard=10, min_units=2)
    >>> [shard.records for shard in manifest.shards], manifest.records
    ([10, 2, 10, 3], 25)
    """
    from datapipes.loader.loader import Loader
    from datapipes.steps.sources import from_sequence
    from nodes.workers.dataloader import WorkerDiedError

    check_write_arguments(records_per_shard, bytes_per_shard, min_units, unit_items, stale_seconds)
    if format not in ("jsonl", "tar", "parquet"):
        raise ValueError(f"format must be 'jsonl', 'tar' or 'parquet', got {format!r}")
    check_algorithm(checksum)
    started = time.perf_counter()
    options = WriteOptions(
        format, records_per_shard, bytes_per_shard, min_units, unit_items, seed, prefix, checksum
    )
    destination = Destination(dest, storage_options)
    plan = make_plan(pipe, options)
    done = _existing(destination, plan, overwrite)
    if done is not None:  # written; a writer killed after the others returned left a temporary
        destination.clean_dead(stale_seconds)
        return _with_stats(done, written=0, found=len(plan.units), started=started)
    destination.publish(PLAN, encode_json(_plan_record(plan)))
    destination.clean_dead(stale_seconds)
    writer = UnitWriter(pipe, plan, destination.url, dict(storage_options or {}), stale_seconds)
    pending = [u.index for u in plan.units if read_unit_record(destination, plan, u) is None]
    found = len(plan.units) - len(pending)
    written = 0
    if pending:
        loader_options.setdefault("even_batches", False)  # a dead rank must not hang the rest
        # All the units are dealt, done or not (the writer skips those done): ranks that
        # start apart see other units left, and a deal of those would differ between them.
        units = from_sequence(range(len(plan.units))).map(writer)
        loader = Loader(units, seed, **loader_options)
        try:
            for outcome in loader:
                written += outcome["written"]
        except WorkerDiedError as error:  # the units left are written below, in this process
            warnings.warn(f"dp.write goes on without its DataLoader workers: {error}", stacklevel=2)
        finally:
            loader.close()
        written += _help(destination, plan, writer, loader.rank, loader.world_size, stale_seconds)
    _check_same_plan(destination, plan)
    # Every unit is done: what dead writers left (their units were written again) goes.
    destination.clean_dead(stale_seconds)
    manifest = _manifest(destination, plan)
    destination.publish(MANIFEST, encode_json(manifest.to_json()))
    return _with_stats(manifest, written=written, found=found, started=started)


def check_write_arguments(
    records_per_shard: Any, bytes_per_shard: Any, min_units: Any, unit_items: Any, stale: Any
) -> None:
    for name, value in (
        ("records_per_shard", records_per_shard),
        ("bytes_per_shard", bytes_per_shard),
    ):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
    for name, value in (("min_units", min_units), ("unit_items", unit_items)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if isinstance(stale, bool) or not isinstance(stale, int | float) or not stale > 0:
        raise ValueError(f"stale_seconds must be a number > 0, got {stale!r}")


def _plan_record(plan: WritePlan) -> dict[str, Any]:
    return {
        "fingerprint": plan.fingerprint,
        "input": plan.input_digest,
        "options": plan.options.describe(),
        "units": len(plan.units),
    }


def _existing(dest: Destination, plan: WritePlan, overwrite: bool) -> Manifest | None:
    """The finished output of this very write, if ``dest`` holds it; refuses (or, with
    ``overwrite``, removes) another write's output."""
    raw_manifest, raw_plan = dest.read(MANIFEST), dest.read(PLAN)
    wanted = _plan_record(plan)
    if raw_plan is not None:
        try:
            theirs = json.loads(raw_plan)
        except ValueError:
            theirs = None
        if theirs == wanted:
            if raw_manifest is None:
                return None  # this write, unfinished: go on with it
            manifest = parse_manifest(raw_manifest, dest.url)
            if manifest.fingerprint == plan.fingerprint and manifest.input == plan.input_digest:
                return manifest
        if not overwrite:
            raise WriteConflictError(_conflict(dest, theirs, wanted))
        _remove_output(dest, raw_manifest)
        return None
    if raw_manifest is not None or dest.names(f"{META}/units"):
        if not overwrite:
            raise WriteConflictError(
                f"{dest.url} holds a dataset but no record of how it was written (no "
                f"{PLAN}): pass overwrite=True to replace it, or write elsewhere"
            )
        _remove_output(dest, raw_manifest)
    return None


def _conflict(dest: Destination, theirs: Any, wanted: dict[str, Any]) -> str:
    if not isinstance(theirs, dict):
        what = "a damaged record of how it was written"
    elif theirs.get("fingerprint") != wanted["fingerprint"]:
        what = f"the output of another recipe (fingerprint {theirs.get('fingerprint')})"
    elif theirs.get("input") != wanted["input"]:
        what = "the output of this recipe over other input (files were added, removed or changed)"
    else:
        what = f"this recipe's output with other options ({theirs.get('options')})"
    return (
        f"{dest.url} holds {what}, not this write's (fingerprint {wanted['fingerprint']}): "
        "pass overwrite=True to replace it, or write elsewhere"
    )


def _remove_output(dest: Destination, raw_manifest: bytes | None) -> None:
    """Remove a previous write's shards, records and manifest (not other files)."""
    if raw_manifest is not None:
        try:
            for shard in parse_manifest(raw_manifest, dest.url).shards:
                dest.remove(shard.name)
        except ValueError:
            pass
    for name in dest.names(f"{META}/units"):
        raw = dest.read(f"{META}/units/{name}")
        try:
            for shard in json.loads(raw or b"{}").get("shards", []):
                dest.remove(str(shard["name"]))
        except (ValueError, TypeError, KeyError, AttributeError):
            pass
        dest.remove(f"{META}/units/{name}")
    dest.remove(MANIFEST)
    dest.remove(PLAN)


def _help(
    dest: Destination,
    plan: WritePlan,
    writer: UnitWriter,
    rank: int,
    world_size: int,
    stale_seconds: float,
) -> int:
    """Write the units no live writer holds until every unit is done; how many it wrote.
    Each rank starts at another place in the list, so that helpers seldom meet."""
    written = 0
    while True:
        _check_same_plan(dest, plan)
        done = set(dest.names(f"{META}/units"))
        # A record listed but damaged was written again by this rank's Loader pass (its
        # writer checks each record it is dealt); one written since is found below.
        missing = [u for u in plan.units if f"{u.name}.json" not in done]
        if not missing:
            return written
        held = dest.held_units(stale_seconds)
        start = rank * len(missing) // world_size
        wrote = False
        for unit in missing[start:] + missing[:start]:
            if unit.name in held or read_unit_record(dest, plan, unit) is not None:
                continue
            writer.write(unit)
            written += 1
            wrote = True
        if not wrote:
            time.sleep(HELP_POLL_SECONDS)


def _check_same_plan(dest: Destination, plan: WritePlan) -> None:
    """Refuse to go on when another write (another recipe, other input or options) took
    the destination over since this one started: their units would mix."""
    raw = dest.read(PLAN)
    if raw != encode_json(_plan_record(plan)):
        try:
            theirs = json.loads(raw) if raw is not None else None
        except ValueError:
            theirs = None
        raise WriteConflictError(
            "another dp.write to the same destination started meanwhile: "
            + _conflict(dest, theirs, _plan_record(plan))
        )


def _manifest(dest: Destination, plan: WritePlan) -> Manifest:
    shards: list[ShardEntry] = []
    for unit in plan.units:
        record = read_unit_record(dest, plan, unit)
        if record is None:  # another rank's overwrite removed it meanwhile
            raise WriteConflictError(
                f"unit {unit.name} of the write to {dest.url} vanished before the manifest was "
                "written: another job writes to the same place"
            )
        shards += [ShardEntry(**shard) for shard in record["shards"]]
    return Manifest(
        dest.url, plan.options.format, plan.fingerprint, plan.input_digest, tuple(shards),
        plan.options.describe(),
    )  # fmt: skip


def _with_stats(manifest: Manifest, *, written: int, found: int, started: float) -> Manifest:
    import dataclasses

    stats = {
        "units_written": written,
        "units_found_done": found,
        "records": manifest.records,
        "bytes": sum(shard.bytes for shard in manifest.shards),
        "seconds": time.perf_counter() - started,
    }
    return dataclasses.replace(manifest, stats=stats)
