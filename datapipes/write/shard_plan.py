"""A write's plan: the recipe's input cut into units, each the source of its own shards.

The units are what dynamic dispatch would hand out of the recipe's first
epoch (:func:`nodes.dispatch.units.units_of`): a file, a part of a file (files
are split into parts until there are about ``min_units``), or a run of at most
``unit_items`` positions of a random-access source (at least ``min_units``
runs). They depend only on
the recipe, its input and these numbers, never on the ranks or workers that
write them: unit ``u`` is read by a graph of its own (rank 0 of 1, seed mixed
with ``u``) and becomes the shards ``<prefix>-<u>-<k>.<ext>``, so whoever
writes it writes the same bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

from datapipes.identity import digest
from datapipes.pipe import DataPipe
from datapipes.resume.claims import epoch_work
from nodes import Context
from nodes.consumer_work import DealtWork
from nodes.dispatch.units import PARTS_PER_CONSUMER, units_of
from nodes.elastic import POSITIONS
from nodes.elastic.pieces import piece_length
from nodes.sources.files import Listings


@dataclass(frozen=True)
class WriteOptions:
    """What, besides the recipe and its input, fixes a write's output."""

    format: str
    records_per_shard: int | None
    bytes_per_shard: int | None
    min_units: int
    unit_items: int
    seed: int
    prefix: str
    checksum: str = "crc32"

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Unit:
    """One unit of the input: ``place`` (its source in the recipe) and its ``pieces``."""

    index: int
    place: str
    pieces: list[Any]

    @property
    def name(self) -> str:
        return f"{self.index:06d}"


@dataclass(frozen=True)
class WritePlan:
    """The units of a write and what identifies it (see the module doc)."""

    fingerprint: str
    options: WriteOptions
    units: list[Unit]
    listings: Listings
    #: A digest of the units and the listings: the same input cut the same way.
    input_digest: str

    def context(self, unit: Unit) -> Context:
        """The context ``unit``'s graph is built in: the same whoever writes it."""
        return Context(
            rank=0, world_size=1, worker_id=0, num_workers=1, epoch=0,
            seed=unit_seed(self.options.seed, unit.index), listings=self.listings,
            work=DealtWork(0, {unit.place: unit.pieces}),
        )  # fmt: skip

    def shard_name(self, unit: Unit, part: int) -> str:
        return f"{self.options.prefix}-{unit.name}-{part:04d}.{self.options.format}"


def unit_seed(seed: int, unit: int) -> int:
    """The seed of unit ``unit``'s graph: its random steps draw other numbers than the
    other units' (a random crop is not the same crop in every unit)."""
    mixed = hashlib.sha256(f"{seed}:{unit}".encode()).digest()
    return int.from_bytes(mixed[:8], "big") >> 1


def make_plan(pipe: DataPipe[Any], options: WriteOptions) -> WritePlan:
    """The plan of writing ``pipe`` with ``options``: its input listed once and cut."""
    listings = Listings()
    work = epoch_work(pipe, Context(epoch=0, seed=options.seed, listings=listings))
    consumers = max(1, -(-options.min_units // PARTS_PER_CONSUMER))
    units: list[Unit] = []
    for place in sorted(work):
        entry = work[place]
        size = options.unit_items
        if entry["kind"] == POSITIONS:  # at least min_units runs, as files are split
            total = sum(piece_length(piece) or 0 for piece in entry["pieces"])
            size = max(1, min(size, -(-total // options.min_units)))
        for pieces in units_of(entry["kind"], entry["pieces"], consumers, size):
            units.append(Unit(len(units), place, pieces))
    listed = sorted(listings.listed().items())
    input_digest = digest([[[u.place, u.pieces] for u in units], listed])[:32]
    return WritePlan(pipe.fingerprint(), options, units, listings, input_digest)
