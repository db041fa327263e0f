"""A listing of files and how it is dealt to consumers, whole or split inside files."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nodes import elastic as el
from nodes.base import Node, NotReset, State
from nodes.context import Context
from nodes.errors import InvalidStateError, StateMismatchError
from nodes.iterators import list_iterator_position, positioned_iterator
from nodes.rng import IndexPermutation
from nodes.state_checks import at, check_int, expect_int, expect_keys
from nodes.storage import SourceFile, as_patterns, list_files, listing_digest
from nodes.storage.retry import RetryPolicy

DEFAULT_BLOCK_SIZE = 1 << 20


class Listings:
    """The listings of one job's file lists in this process, each made once and then shared.

    A :class:`datapipes.Loader` owns one (see :mod:`datapipes.loader.listings`): its
    graph and the DataLoader workers it ships it to read every file list's
    URLs from here, instead of each listing the files again (a worker that
    listed for itself could see other files than its peers, and pays the
    listing's time and memory once more). Keyed by what a file set lists (its
    patterns and storage options), so two steps over the same files share one
    listing.
    """

    def __init__(self, listed: Mapping[str, list[str]] | None = None) -> None:
        self._listed: dict[str, list[str]] = dict(listed or {})
        self._states: dict[str, State] = {}

    def urls(self, files: FileSet) -> list[str]:
        """``files``' listing: the one held here, else listed now and kept."""
        key = files.listing_key
        if key not in self._listed:
            self._listed[key] = files.list()
        return self._listed[key]

    def listing_state(self, files: FileSet) -> State:
        """``{"files", "digest"}`` of ``files``' listing, computed once for every consumer."""
        key = files.listing_key
        if key not in self._states:
            urls = self.urls(files)
            self._states[key] = {"files": len(urls), "digest": listing_digest(urls)}
        return self._states[key]

    def digest_all(self) -> None:
        """Compute every listing's digest now, before workers inherit or receive a copy."""
        for key, urls in self._listed.items():
            if key not in self._states:
                self._states[key] = {"files": len(urls), "digest": listing_digest(urls)}

    def __contains__(self, files: object) -> bool:
        return isinstance(files, FileSet) and files.listing_key in self._listed

    def listed(self) -> dict[str, list[str]]:
        """Every listing held, by what it lists (a copy)."""
        return {key: list(urls) for key, urls in self._listed.items()}

    def __len__(self) -> int:
        return len(self._listed)

    def __repr__(self) -> str:
        counts = ", ".join(str(len(urls)) for urls in self._listed.values())
        return f"Listings({len(self._listed)} listing(s) of [{counts}] files)"


class FileSet:
    """The files a recipe names, listed once per process on first use.

    ``urls`` is a URL, a glob or a brace pattern (or a list of them), read
    through fsspec with ``storage_options``. ``shuffle_key`` (with
    ``shuffle_seed``) reorders the files every epoch with a permutation that
    every rank and worker computes identically. With ``listings`` the listing
    comes from there (made once per job, shared with the DataLoader workers);
    without, this file set lists the files itself on first use.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        storage_options: dict[str, Any],
        *,
        shuffle_key: list[int] | None = None,
        shuffle_seed: int | None = None,
        retries: int | RetryPolicy | None = 3,
        block_size: int = DEFAULT_BLOCK_SIZE,
        listings: Listings | None = None,
    ) -> None:
        self.patterns = urls
        self.storage_options = storage_options
        self.shuffle_key = shuffle_key
        self.shuffle_seed = shuffle_seed
        self.retries = retries
        self.block_size = block_size
        self.listings = listings
        self._urls: list[str] | None = None
        self._listing_state: State | None = None

    @property
    def urls(self) -> list[str]:
        """The sorted listing (the shared one when this file set has ``listings``)."""
        if self._urls is None:
            self._urls = self.list() if self.listings is None else self.listings.urls(self)
        return self._urls

    def list(self) -> list[str]:
        """List the files now, through the storage (``urls`` lists once and keeps it)."""
        return list_files(self.patterns, self.storage_options, self.retries)

    @property
    def listing_key(self) -> str:
        """What this file set lists (patterns and storage options), as a short digest.

        Equal for file sets that list the same files the same way, in every
        process; credentials in the storage options are hashed, never shown.
        """
        options = sorted((str(name), repr(value)) for name, value in self.storage_options.items())
        named = repr((as_patterns(self.patterns), options))
        return hashlib.sha256(named.encode()).hexdigest()[:16]

    def source(self, index: int) -> SourceFile:
        """File ``index`` of the listing, ready to open."""
        return SourceFile(self.urls[index], self.storage_options, self.retries, self.block_size)

    def order(self, ctx: Context) -> list[int]:
        """The listing's indices in this epoch's order (the same on every consumer)."""
        n = len(self.urls)
        if self.shuffle_key is None:
            return list(range(n))
        permutation = IndexPermutation(n, ctx.random_key(*self.shuffle_key, seed=self.shuffle_seed))
        return permutation.apply(np.arange(n, dtype=np.int64)).tolist()

    def check_state(self, state: State) -> None:
        """Refuse a state taken over a different listing: its positions would be wrong."""
        saved = state.get("listing")
        ours = self.listing_state()
        if saved is not None and saved != ours:
            raise ValueError(
                f"the files changed since this state was taken: it was taken over "
                f"{saved['files']} files (digest {saved['digest']}), {self.patterns!r} now "
                f"lists {ours['files']} (digest {ours['digest']}). Resume needs the same files."
            )

    def listing_state(self) -> State:
        """``{"files", "digest"}`` of the listing; computed once, as states are taken often."""
        if self._listing_state is None:
            if self.listings is not None:  # digested once per job, not once per worker
                self._listing_state = self.listings.listing_state(self)
            else:
                self._listing_state = {"files": len(self.urls), "digest": listing_digest(self.urls)}
        return dict(self._listing_state)


@dataclass(frozen=True)
class Unit:
    """A piece of work: part ``part`` of ``parts`` of file ``file`` (an index into the listing)."""

    file: int
    part: int = 0
    parts: int = 1


def plan_units(order: list[int], ctx: Context, splittable: bool) -> list[Unit]:
    """This consumer's units of work, so that every record reaches exactly one consumer.

    With at least as many files as consumers (or a format that cannot split a
    file) consumer ``c`` of ``C`` gets whole files ``order[c], order[c + C], ...``.
    With fewer files, every file is split into parts (file ``k`` of ``F`` into
    ``C // F`` parts, one more for the first ``C % F``) so that each consumer
    gets exactly one part and none reads a whole file the others also read.

    >>> ctx = Context(rank=1, world_size=3)
    >>> plan_units([0, 1], ctx, splittable=True)
    [Unit(file=0, part=1, parts=2)]
    """
    consumers, me = ctx.num_consumers, ctx.consumer_index
    if len(order) >= consumers or not splittable:
        return [Unit(file) for file in order[me::consumers]]
    base, extra = divmod(consumers, len(order))
    units = [
        Unit(file, part, base + (k < extra))
        for k, file in enumerate(order)
        for part in range(base + (k < extra))
    ]
    return [units[me]]


def unit_piece(unit: Unit, cursor: Any = None, index: int = 0, *, one: bool = False) -> el.Piece:
    """A piece of remaining work: ``unit`` from the block at ``cursor``, record ``index``."""
    return {
        "file": unit.file,
        "part": [unit.part, unit.parts],
        "cursor": cursor,
        "index": index,
        "one": one,
    }


def consumer_units(
    files: FileSet, ctx: Context, place: str | None, splittable: bool
) -> tuple[list[Unit], list[el.Piece] | None]:
    """This consumer's units, and the plan's pieces when it reads a dealt share."""
    plan = ctx.plan_for(place)
    if plan is None:
        return plan_units(files.order(ctx), ctx, splittable), None
    return [Unit(p["file"], p["part"][0], p["part"][1]) for p in plan], plan


class FileListNode(Node):
    """Yields the URLs of this consumer's files (whole files), in this epoch's order.

    State: ``{"position": k, "listing": ...}``; resume is O(1).
    """

    kind = "file list"
    elastic = "source"
    elastic_kind = el.FILES

    def __init__(self, files: FileSet, ctx: Context) -> None:
        super().__init__()
        self._files = files
        self._ctx = ctx
        self._it: Iterator[str] = NotReset(self)
        self._mine: list[str] = []
        self._units: list[Unit] = []
        self._was_reset = False

    def reset(self, state: State | None = None) -> None:
        if state is not None:
            self._files.check_state(state)
        urls = self._files.urls
        self._units = consumer_units(self._files, self._ctx, self.place, False)[0]
        self._was_reset = True
        self._mine = [urls[unit.file] for unit in self._units]
        self._it = positioned_iterator(self._mine, 0 if state is None else state["position"])

    def __next__(self) -> str:
        return next(self._it)

    def __iter__(self) -> Iterator[str]:
        return self._it

    def state_dict(self) -> State:
        position = list_iterator_position(self._it, len(self._mine))
        return {"position": position, "listing": self._files.listing_state()}

    def validate_state(self, state: Any, path: str = "node") -> None:
        """Refuse a position outside this consumer's files, or one taken over other files."""
        units = consumer_units(self._files, self._ctx, self.place, False)[0]
        validate_file_list(self._files, units, state, path)

    # ----- elastic resume (nodes.elastic) ---------------------------------------------------
    def validate_plan(self, plan: Any, path: str) -> None:
        el.check_records(plan, path, len(self._files.urls))

    def last_origin(self) -> el.Origin:
        unit = self._units[list_iterator_position(self._it, len(self._mine)) - 1]
        return self.place, unit_piece(unit)  # type: ignore[return-value]

    def untouched(self) -> list[el.Piece]:
        """The files this consumer has not started (all of its share before a reset)."""
        if self._was_reset:
            units = self._units[list_iterator_position(self._it, len(self._mine)) :]
        else:
            units = consumer_units(self._files, self._ctx, self.place, False)[0]
        return [unit_piece(unit) for unit in units]


def check_listing(files: FileSet, state: dict[str, Any], path: str) -> None:
    """Refuse a state taken over another listing (its positions would point elsewhere)."""
    saved = state.get("listing")
    where = at(path, "listing")
    expect_keys(saved, where, {"files", "digest"})
    check_int(saved["files"], at(where, "files"))
    if not isinstance(saved["digest"], str):
        raise InvalidStateError(at(where, "digest"), "the listing's digest (a string)", saved)
    ours = files.listing_state()
    if saved != ours:
        raise StateMismatchError(
            f"{where}: the files changed since this state was taken: it was taken over "
            f"{saved['files']} files (digest {saved['digest']}), {files.patterns!r} now lists "
            f"{ours['files']} (digest {ours['digest']}). Resume needs the same files."
        )


def validate_file_list(files: FileSet, units: list[Unit], state: Any, path: str) -> None:
    """A :class:`nodes.FileListNode` state: a position within this consumer's ``units``."""
    expect_keys(state, path, {"position", "listing"})
    check_listing(files, state, path)
    expect_int(state, "position", path, 0, len(units))
