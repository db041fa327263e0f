"""One listing per job: a Loader lists its files once, and every rank and worker reads that one.

A file added or removed while the ranks list would otherwise give each rank
another listing, and dealing two different listings to consumers duplicates
some records and loses others without a word. So:

* under ``torch.distributed`` (several ranks) with ``even_batches`` on (the
  default there), rank 0 lists and broadcasts the listings to every rank
  (``broadcast_object_list`` on a gloo group), once per Loader, when its first
  epoch's graph is built. ``even_batches`` already makes every rank iterate
  its Loader, so this adds no new duty, and it saves the other ranks their
  listing. A Loader with ``even_batches=False`` never talks to other ranks
  (one rank alone may iterate it, e.g. for an evaluation on rank 0), so each
  rank lists for itself, as without ``torch.distributed``;
* DataLoader workers receive the listings with the recipe they run (inherited
  with ``fork``, pickled once per worker with ``spawn``) and never list;
* where the ranks list for themselves but share a store (dynamic dispatch, whose
  store every rank reaches; or ``torch.distributed`` initialized with
  ``even_batches=False``, through its default store, without a collective),
  each rank's listings are compared with the first rank's through the store
  (:func:`check_same_listings`): a difference is a
  :class:`ListingMismatchError` naming the files, never a silent overlap;
* without ``torch.distributed`` or a store (``rank``/``world_size`` as
  arguments) ranks cannot talk: each lists for itself. The checkpoint keeps
  every file list's listing digest, so a resume over changed files is refused.

The listing is made once per Loader and kept for its life (across epochs and
``close()``), as the built graph kept it before; a new Loader lists again.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from typing import Any

from datapipes.loader.even_batches import NO_GROUP
from datapipes.pipe import DataPipe
from datapipes.steps.files import Files
from nodes import Context
from nodes.credentials import shown_url
from nodes.sources.files import FileSet, Listings


class ListingMismatchError(RuntimeError):
    """Ranks of one job listed different files (they changed while the ranks listed)."""


def check_same_listings(
    compare_set: Callable[[str, str, str], Any], key: str, listings: Listings, who: str
) -> None:
    """Refuse (:class:`ListingMismatchError`, naming the files) ``listings`` unlike those
    the first rank wrote at ``key`` of a shared store (``compare_set`` is the store's)."""
    # In their shown form: the store may be a file on disk, and a rank's password is no file.
    listed = {
        shown_url(pattern): [shown_url(url) for url in urls]
        for pattern, urls in listings.listed().items()
    }
    mine = json.dumps(sorted(listed.items()), separators=(",", ":"))
    theirs = compare_set(key, "", mine)
    theirs = theirs.decode() if isinstance(theirs, bytes) else str(theirs)
    if theirs == mine:
        return
    first, here = dict(json.loads(theirs)), dict(json.loads(mine))
    lines = []
    for pattern in sorted(set(first) | set(here)):
        only_here = sorted(set(here.get(pattern, [])) - set(first.get(pattern, [])))
        only_there = sorted(set(first.get(pattern, [])) - set(here.get(pattern, [])))
        for name, files in (("only here", only_here), ("only in the first rank's", only_there)):
            if files:
                shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if files[5:] else "")
                lines.append(f"  {name}: {shown}")
    raise ListingMismatchError(
        f"{who} listed other files than the first rank of this job, so the ranks would read "
        "some records twice and others never:\n" + "\n".join(lines) + "\nThe files changed "
        "while the ranks listed them: keep the data still while a job starts (write new "
        "files elsewhere and move them in between jobs), or name the files explicitly."
    )


class JobListings:
    """A Loader's listings: made at its first epoch's build (the same point on every rank)."""

    __slots__ = ("_pipe", "_group", "_listings", "_compare")

    def __init__(
        self,
        pipe: DataPipe[Any],
        group: Callable[[], Any],
        compare: Callable[[Listings], None] | None = None,
    ) -> None:
        """``group()``: the process group the Loader's ranks talk on, or ``NO_GROUP``
        (:meth:`datapipes.loader.even_batches.EvenBatchesPolicy.group`); ``compare``: compares the
        listings of a rank that listed for itself with the other ranks' (see
        :func:`default_store_comparison`)."""
        self._pipe, self._group, self._compare = pipe, group, compare
        self._listings: Listings | None = None

    def get(self, ctx: Context) -> Listings:
        """The listings of every file list of the recipe, agreed on by all ranks."""
        if self._listings is None:  # once per Loader: under torch.distributed a collective
            listings = agreed_listings(file_sets(self._pipe, ctx), self._group)
            listings.digest_all()  # here once, rather than in every worker's states
            if self._compare is not None and len(listings) and self._group() is NO_GROUP:
                self._compare(listings)
            self._listings = listings
        return self._listings


def default_store_comparison(
    rank: int, world_size: int, fingerprint: str
) -> Callable[[Listings], None] | None:
    """For ranks that list for themselves under ``torch.distributed``: their listings
    compared through the default process group's store (no collective: one rank alone may
    iterate its Loader). ``None`` when there is nothing to compare with."""
    if world_size == 1:
        return None

    def compare(listings: Listings) -> None:
        import torch.distributed as dist

        from nodes.adapters.torch import default_store

        if not (dist.is_available() and dist.is_initialized()):
            return  # ranks as arguments: nothing they share to compare through
        store = default_store()
        if store is None:
            return
        # Loaders pair across ranks by the order each rank makes them (as dispatch's do).
        jobs = f"datapipes/listings/{world_size}x"
        made = store.add(f"{jobs}/loaders/{rank}", 1)
        key = f"{jobs}/{made - 1}/{fingerprint}"
        check_same_listings(store.compare_set, key, listings, f"rank {rank}")

    return compare


def file_sets(pipe: DataPipe[Any], ctx: Context) -> list[FileSet]:
    """The file sets a recipe's file lists name, one per listing, in recipe order."""
    found: dict[str, FileSet] = {}
    stack = [pipe]
    seen: set[int] = set()
    order: list[Files] = []
    while stack:  # depth first, inputs in order: the same order on every rank
        step = stack.pop()
        if id(step) in seen:
            continue
        seen.add(id(step))
        if isinstance(step, Files):
            order.append(step)
        stack.extend(reversed(step.inputs))
    for step in order:
        files = step.file_set(ctx)
        found.setdefault(files.listing_key, files)
    return list(found.values())


def agreed_listings(sets: list[FileSet], group: Callable[[], Any]) -> Listings:
    """The listings of ``sets``: made by rank 0 and broadcast on ``group()`` when the
    ranks talk, else made here (each process lists for itself)."""
    if not sets:
        return Listings()  # nothing to list: no collective, no group made
    talk = group()
    if talk is NO_GROUP:
        return Listings({files.listing_key: files.list() for files in sets})
    return Listings(_broadcast_from_rank_0(sets, talk))


def _broadcast_from_rank_0(sets: list[FileSet], group: Any) -> dict[str, list[str]]:
    import torch.distributed as dist

    rank = dist.get_rank()
    payload: list[Any] = [None]
    failure: BaseException | None = None
    if rank == 0:
        try:
            payload = [("listed", {files.listing_key: files.list() for files in sets})]
        except Exception as error:  # noqa: BLE001 - every rank must hear of it, not hang
            failure = error
            payload = [("failed", _portable(error))]
    dist.broadcast_object_list(payload, src=0, group=group)
    if failure is not None:
        raise failure
    outcome = payload[0]
    if not (isinstance(outcome, tuple) and len(outcome) == 2):
        raise RuntimeError(
            f"rank {rank} received {type(outcome).__name__} instead of rank 0's file listings; "
            "every rank must run the same datapipes version and build its Loader from the "
            "same recipe"
        )
    kind, value = outcome
    if kind == "failed":
        raise value
    missing = [files for files in sets if files.listing_key not in value]
    if missing:
        raise RuntimeError(
            f"rank {rank} reads the files {missing[0].patterns!r}, which rank 0's recipe does "
            "not list (rank 0 lists the files for every rank): every rank must build its Loader "
            "from the same recipe with the same storage options"
        )
    return {files.listing_key: value[files.listing_key] for files in sets}


def _portable(error: Exception) -> Exception:
    """``error`` as the other ranks can receive it: itself when it pickles, else its text."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any error that does not round-trip
        return RuntimeError(f"rank 0 could not list the files: {type(error).__name__}: {error}")
    return error
