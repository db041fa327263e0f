"""The Loader state of a ``torch.distributed.checkpoint`` (DCP) folder, merged over its ranks.

A job that saves ``dcp.save({"model": ..., "data": loader}, checkpoint_id=path)`` on every
rank writes each rank's position under its own key (``data.ranks.<R>.*``, see
:mod:`datapipes.resume.records`) and what the ranks share once. :func:`load_dcp_states`
reads those entries back, in any process (no process group needed, and none used when
one is up), and merges them with :func:`datapipes.merge_states` into one state that
loads into a Loader of any topology.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from datapipes.checkpoint.reading import read_dcp_entries, read_dcp_metadata

__all__ = ["load_dcp_states"]

#: The keys that make a dict a Loader state (as
#: :func:`datapipes.resume.graph_record.find_loader_states`).
_LOADER_KEYS = ("version", "fingerprint", "ranks")


def load_dcp_states(path: str | os.PathLike[str], key: str | None = None) -> dict[str, Any]:
    """The merged Loader state of every rank that saved the DCP checkpoint at ``path``.

    The checkpoint must hold a :class:`datapipes.Loader` (or its ``state_dict()``) as an
    entry, saved by every rank of the job, e.g. ``dcp.save({"model": model.state_dict(),
    "data": loader}, checkpoint_id=path)``: then each rank wrote its own position, and
    this returns :func:`datapipes.merge_states` of them all, a plain state that
    ``Loader.load_state_dict`` takes on any rank, world size and number of workers.

    ``key`` names the entry that holds the Loader, dotted for a nested one
    (``"data"``, ``"extra.loader"``); by default the checkpoint's one Loader state is
    found (it must hold exactly one then).

    A resumed job, on every new rank (any world size)::

        state = dp.load_dcp_states(path, key="data")
        loader.load_state_dict(state)

    Load the model and optimizer with ``dcp.load`` as usual, without the Loader in the
    dict given to it (``dcp.load`` would hand the Loader only the positions saved under
    this rank's own number, which is no whole-job state when the world size changed).

    Reading runs no collective: it works in a process without a process group, and
    under one every rank reads the files on its own, so it may be called on some ranks
    only. Taking the states runs none either: ``Loader.state_dict()`` only reads this
    rank's nodes (the ranks agree on ``even_batches`` while iterating, never while a
    state is taken), so a ``state_dict()`` called on only some ranks, for a log or a
    rank-0-only save, never hangs. (``dcp.save`` itself is collective: every rank
    calls it.) Only the Loader's entries are read (no tensor, nothing else), and
    nothing is unpickled but DCP's metadata classes and plain data
    (``torch.load(weights_only=True)``).

    Raises ``FileNotFoundError`` when ``path`` does not exist, ``ValueError`` when it is
    no DCP folder, holds no Loader state, several (without ``key``), or no Loader
    state at ``key``, and :class:`datapipes.StateMismatchError` (from
    :func:`datapipes.merge_states`) when the saved ranks do not make one whole job,
    e.g. a rank is missing.
    """
    folder = Path(path)
    name = repr(str(folder))
    if not folder.exists():
        raise FileNotFoundError(f"no DCP checkpoint at {name}: no such file or directory")
    if not folder.is_dir():
        raise ValueError(
            f"{name} is a file, not a torch.distributed.checkpoint folder; for per-rank "
            "torch.save files, load every rank's file and call dp.merge_states on their "
            "Loader states"
        )
    if not (folder / ".metadata").is_file():
        raise ValueError(
            f"{name} is not a torch.distributed.checkpoint folder: it has no .metadata file "
            "(or the save did not finish)"
        )
    metadata = read_dcp_metadata(folder)  # a ValueError (CheckpointError) naming the file
    paths = _entry_paths(metadata)
    state = _find_state(folder, metadata, paths, key)
    from datapipes.resume import merge_states  # here: datapipes imports this module

    # Each rank wrote its own entry and the shared part once: merge_states parses the
    # whole and checks that together the entries make one whole job.
    return merge_states([state])


# ----- reading the folder -----------------------------------------------------------------


def _entry_paths(metadata: Any) -> dict[str, tuple[Any, ...]]:
    """Each saved entry's place in the saved (nested) state dict, by its DCP key."""
    planner_data = getattr(metadata, "planner_data", None) or {}
    return {fqn: tuple(planner_data.get(fqn, (fqn,))) for fqn in metadata.state_dict_metadata}


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(map(str, path))


def _loader_places(paths: dict[str, tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Where flattened Loader states sit: places with ``version``, ``fingerprint``, ``ranks.*``."""
    places = set(paths.values())
    found = []
    for place in sorted({p[:-1] for p in places if p and p[-1] == "version"}, key=_dotted):
        has_ranks = any(p[: len(place) + 1] == (*place, "ranks") for p in places)
        if (*place, "fingerprint") in places and has_ranks:
            found.append(place)
    return found


def _find_state(
    folder: Path, metadata: Any, paths: dict[str, tuple[Any, ...]], key: str | None
) -> dict[str, Any]:
    """The (not yet merged) Loader state at ``key``, or the checkpoint's only one."""
    from datapipes.resume.graph_record import find_loader_states

    name = repr(str(folder))
    places = _loader_places(paths)
    if key is not None:
        wanted = {f for f, p in paths.items() if _under(p, key)}
        loaded = read_dcp_entries(folder, metadata, wanted)
        state = _get(loaded, key, paths, wanted)
        if _is_loader_state(state):
            return state
        others = [_dotted(p) for p in places] or [
            p for p, _ in find_loader_states(read_dcp_entries(folder, metadata, None))
        ]
        where = f"Loader states are at {others}" if others else "it holds no Loader state"
        what = "nothing" if state is None else f"a {type(state).__name__}"
        raise ValueError(
            f"no Loader state at key={key!r} in {name} (it holds {what} there); {where}"
        )
    if len(places) == 1:
        key = _dotted(places[0])
        wanted = {f for f, p in paths.items() if _under(p, key)}
        return _get(read_dcp_entries(folder, metadata, wanted), key, paths, wanted)
    if places:
        raise ValueError(
            f"{name} holds several Loader states, at {[_dotted(p) for p in places]}: "
            "say which with key="
        )
    # Not flattened the usual way (a Loader state saved as one entry): look at everything.
    everything = read_dcp_entries(folder, metadata, None)
    found = find_loader_states(everything)
    if len(found) == 1:
        return found[0][1]
    if found:
        raise ValueError(
            f"{name} holds several Loader states, at {[p for p, _ in found]}: say which with key="
        )
    top = sorted({str(place[0]) for place in paths.values() if place})
    raise ValueError(
        f"no Loader state in the DCP checkpoint {name} (top-level entries: {top}); save the "
        'Loader itself (or its state_dict()) as an entry, e.g. {"data": loader}'
    )


def _under(path: tuple[Any, ...], key: str) -> bool:
    dotted = _dotted(path)
    return dotted == key or dotted.startswith(key + ".")


def _get(
    loaded: dict[str, Any], key: str, paths: dict[str, tuple[Any, ...]], wanted: set[str]
) -> Any:
    """The object at the dotted ``key`` of the nested ``loaded`` (``None``: nothing there)."""
    if not wanted:
        return None
    # The place's own parts: the prefix of a saved path that spells ``key``.
    path = paths[next(iter(wanted))]
    parts = next(path[:n] for n in range(1, len(path) + 1) if _dotted(path[:n]) == key)
    value: Any = loaded
    for part in parts:
        value = value[part]
    return value


def _is_loader_state(value: Any) -> bool:
    return isinstance(value, dict) and all(k in value for k in _LOADER_KEYS)
