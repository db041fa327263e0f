"""A saved position as text: one line per level of its node tree, a block per worker process.

:class:`Writer` walks a node state by a :class:`datapipes.inspect.tree.RecipeGraph`
and writes one line per level with its kind, steps and scalar fields (long
lists summarised, never printed, :func:`scalar`) and what they mean for a
resume where that is not plain; for worker processes the snapshot, the next
worker and one tree per worker. :mod:`datapipes.inspect.render` puts the
lines in the report.
"""

from __future__ import annotations

from typing import Any

from datapipes.inspect.tree import Level, RecipeGraph
from nodes.adapters import torchdata
from nodes.credentials import shown_url

#: Lists of scalars longer than this are summarised ("16 positions"), never printed.
_LIST_INLINE = 6


def scalar(value: Any) -> str:
    """A field's value in one short piece.

    >>> scalar(list(range(16))), scalar([1, "a"]), scalar({"files": 3})
    ('16 positions', "[1, 'a']", '{files: 3}')
    """
    if isinstance(value, str):  # a long one (a node state that does not parse) is cut
        return repr(value) if len(value) <= 200 else f"{value[:120]!r}... ({len(value)} chars)"
    if isinstance(value, list | tuple):
        if len(value) > _LIST_INLINE or any(isinstance(v, dict | list) for v in value):
            noun = "positions" if all(isinstance(v, int) for v in value) else "items"
            return f"{len(value)} {noun}"
        return "[" + ", ".join(scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        text = "{" + ", ".join(f"{k}: {scalar(v)}" for k, v in value.items()) + "}"
        return text if len(text) <= 100 else f"{{{len(value)} keys}}"
    return repr(value)


class Writer:
    """Collects the indented lines of the text view of one Loader state."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def position(self, depth: int, state: Any, graph: RecipeGraph) -> None:
        """One line per level of a node state, and a block per worker process."""
        if state is None:  # nothing read yet
            self.line(depth, "at the start of the epoch")
            return
        if not isinstance(state, dict):
            self.line(depth, scalar(state))
            return
        for level in graph.levels(state):
            if level.kind == "workers":
                self._workers(depth + level.depth, level, graph)
            else:
                self._level(depth + level.depth, level, graph)

    def _level(self, depth: int, level: Level, graph: RecipeGraph) -> None:
        kind, label = level.kind, level.steps
        if label and kind and not label.startswith(kind + " "):
            name = f"{label} ({kind})"
        else:
            name = label or kind or "?"
        head = (f"{level.key}: " if level.key else "") + name
        state = level.state
        fields = ", ".join(f"{k}={scalar(v)}" for k, v in state.items() if k not in level.nested)
        self.line(depth, f"{head}: {fields}{_note(level, graph)}" if fields else head)
        saved_kind = level.saved.get("kind") if level.saved is not None else None
        if level.saved is not None and saved_kind != kind:
            node = graph.node(level)
            self.line(
                depth + 1,
                f"! the recipe has a {type(node).__name__ if node else kind} ({kind}) here, "
                f"but the checkpoint's state here was taken by a {saved_kind} node",
            )

    def _workers(self, depth: int, level: Level, graph: RecipeGraph) -> None:
        """The StatefulDataLoader state: snapshot, next worker, and a tree per worker."""
        label = level.steps
        head = (f"{level.key}: " if level.key else "") + (
            f"{label.lstrip('.')} over " if label else ""
        )
        loader = level.state.get("dataloader")
        if not isinstance(loader, dict):
            self.line(depth, f"{head}worker processes: the epoch has ended")
            return
        workers = torchdata.worker_dataset_states(loader)
        where = torchdata.snapshot_summary(loader)
        count, since, step = where["num_workers"], where["steps_since"], where["snapshot_step"]
        # Transfers of several items (items_per_transfer): the DataLoader counts transfers.
        taken = level.state.get("taken")
        unit = "transfer" if "taken" in level.state else "item"
        self.line(depth, f"{head}{count} worker processes")
        self.line(
            depth + 1,
            f"snapshot after {unit} {step} of the epoch; {since} {unit}s returned since, "
            "which a resume replays",
        )
        if where["last_worker"] is not None and count:
            following = (where["last_worker"] + 1 + since) % count
            self.line(
                depth + 1,
                f"next: {unit} {step + since}, from worker {following} "
                "(workers take turns while all of them have data)",
            )
        if unit == "transfer":
            per = level.state.get("items_per_transfer", "?")
            self.line(
                depth + 1,
                f"{taken} item(s) of that transfer returned already (items_per_transfer={per})",
            )
        if where["finished"]:
            self.line(depth + 1, "the DataLoader iterator has finished")
        for worker_id, dataset in workers:
            if not dataset:
                self.line(depth + 1, f"worker {worker_id}: no position yet (starts at the start)")
                continue
            consumer = dataset.get("consumer") or []
            at = "consumer ?"
            if len(consumer) == 4:
                rank, world, wid, num = consumer
                at = f"consumer {rank * num + wid} of {world * num}"
            skipped = dataset.get("skipped") or {}
            skip_text = ", ".join(f"{n} by {s}" for s, n in skipped.items()) or "none"
            self.line(
                depth + 1,
                f"worker {worker_id} ({at}): epoch {dataset.get('epoch')}, skipped: {skip_text}",
            )
            try:
                worker_graph = graph.worker(worker_id, dataset, level)
            except Exception:  # noqa: BLE001 - the recipe is a help; the recorded graph still works
                worker_graph = RecipeGraph(level.entry.get("workers") if level.entry else None)
            self.position(depth + 2, dataset.get("node"), worker_graph)


def _note(level: Level, graph: RecipeGraph) -> str:
    """What a level's fields mean for a resume, where that is not plain."""
    state = level.state
    if level.kind == "buffer shuffle":
        try:
            replay = int(state["seq"]) - int(state["anchor_seq"])
        except (KeyError, TypeError, ValueError):
            return ""
        return f"; a resume re-reads {replay} items from the anchor"
    if level.kind == "dispatched source":
        claims = state.get("claims")
        if not isinstance(claims, list):
            return ""
        if not claims:
            return "; no unit claimed before this position"
        noun = "unit" if len(claims) == 1 else "units"
        return f"; {len(claims)} {noun} claimed, inside unit {claims[-1]!r}"
    if level.kind == "reader":
        if state.get("file") is None:
            return "; this consumer's files are done"
        url = graph.url(level, state["file"])
        if url is not None:
            return f"; file {state['file']} is {shown_url(url)}"
    return ""
