"""A write's manifest: written last, it lists every shard, and says whose output this is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from datapipes.write.checksum import CHECKSUMS, checksum_stream
from datapipes.write.destination import META, Destination
from datapipes.write.unit import WRITE_VERSION
from nodes.credentials import scrubbing

MANIFEST = "manifest.json"


class WriteConflictError(RuntimeError):
    """The destination holds another recipe's (or another input's) output."""


class ShardMismatchError(ValueError):
    """A written shard is missing or differs from its manifest entry (size or checksum)."""


@dataclass(frozen=True)
class ShardEntry:
    """One shard of a written dataset."""

    name: str
    records: int
    bytes: int
    #: ``"<algorithm>:<hex>"``: ``crc32`` (8 hex digits) or ``sha256`` (64).
    checksum: str


@dataclass(frozen=True)
class Manifest:
    """What :func:`datapipes.write` wrote: every shard, with its record count, size and
    checksum, in order, and the recipe's fingerprint.

    ``urls()`` gives the shards' URLs, ``files()`` a :func:`datapipes.files` over
    them to read the dataset back, ``verify()`` checks every shard's size and
    checksum; ``stats`` what this rank did (units it wrote, units it found done,
    records, bytes, seconds).
    """

    url: str
    format: str
    fingerprint: str
    input: str
    shards: tuple[ShardEntry, ...]
    options: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def records(self) -> int:
        return sum(shard.records for shard in self.shards)

    def urls(self) -> list[str]:
        return [f"{self.url}/{shard.name}" for shard in self.shards]

    def files(self, **options: Any) -> Any:
        """The shards as a :func:`datapipes.files` list (in the manifest's order)."""
        from datapipes.steps.files import files

        return files(self.urls(), **options)

    def verify(self, **storage_options: Any) -> None:
        """Read every shard back and check its size and checksum against the manifest; a
        :class:`ShardMismatchError` names each shard that differs or is missing.

        >>> import datapipes as dp
        >>> dp.write(dp.range(5).map(lambda x: {"x": x}), "memory://doc/verify").verify()
        """
        dest = Destination(self.url, storage_options)
        bad = {shard.name: problem for shard in self.shards if (problem := _problem(dest, shard))}
        if bad:
            # A shard is named <prefix>-<unit>-<part>.<ext>: without its unit's record the
            # unit is written again, the same bytes, and nothing else is.
            records = sorted({f"{META}/units/{name.rsplit('-', 2)[1]}.json" for name in bad})
            raise ShardMismatchError(
                f"{len(bad)} of the {len(self.shards)} shards of {self.url} differ from its "
                "manifest (damaged, truncated, replaced or removed since they were written):\n  "
                + "\n  ".join(f"{name}: {problem}" for name, problem in bad.items())
                + "\nTo write them again (the same bytes), remove "
                + ", ".join([MANIFEST, *records])
                + " from the destination and call dp.write again."
            )

    def __iter__(self) -> Iterator[ShardEntry]:
        return iter(self.shards)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": WRITE_VERSION,
            "format": self.format,
            "fingerprint": self.fingerprint,
            "input": self.input,
            "options": self.options,
            "records": self.records,
            "shards": [shard.__dict__ for shard in self.shards],
        }


def _problem(dest: Destination, shard: ShardEntry) -> str | None:
    """How the shard differs from its entry, or ``None``."""
    algorithm = shard.checksum.partition(":")[0]
    if algorithm not in CHECKSUMS:
        return f"its entry's checksum {shard.checksum!r} names no known algorithm"
    path = dest.path(shard.name)
    try:
        size = dest.fs.size(path)
        if size != shard.bytes:
            return f"{size} bytes, the manifest says {shard.bytes}"
        with dest.fs.open(path, "rb") as stream:
            found = checksum_stream(algorithm, stream)
    except FileNotFoundError:
        return "missing"
    if found != shard.checksum:
        return f"checksum {found}, the manifest says {shard.checksum}"
    return None


def parse_manifest(raw: bytes, url: str) -> Manifest:
    """The manifest in ``raw`` (of the write at ``url``); a damaged one is a clear error."""
    try:
        value = json.loads(raw)
        if value.get("version") != WRITE_VERSION:
            raise ValueError(f"version {value.get('version')!r}, not {WRITE_VERSION}")
        shards = tuple(
            ShardEntry(str(s["name"]), int(s["records"]), int(s["bytes"]), str(s["checksum"]))
            for s in value["shards"]
        )
        return Manifest(
            url, str(value["format"]), str(value["fingerprint"]), str(value["input"]), shards,
            dict(value.get("options") or {}),
        )  # fmt: skip
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise ValueError(
            f"{url}/{MANIFEST} is not a datapipes manifest ({type(error).__name__}: {error}): "
            "it was damaged or edited; write the dataset again (overwrite=True)"
        ) from None


@scrubbing
def read_manifest(url: str, **storage_options: Any) -> Manifest:
    """The manifest of the dataset :func:`datapipes.write` wrote at ``url``.

    >>> import datapipes as dp
    >>> written = dp.write(dp.range(5).map(lambda x: {"x": x}), "memory://doc/read_manifest")
    >>> dp.read_manifest("memory://doc/read_manifest").records
    5
    """
    dest = Destination(url, storage_options)
    raw = dest.read(MANIFEST)
    if raw is None:
        raise FileNotFoundError(
            f"{dest.url} has no {MANIFEST}: nothing was written there, or the write has not "
            "finished (every rank's dp.write returns once it is written)"
        )
    return parse_manifest(raw, dest.url)
