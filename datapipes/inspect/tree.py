"""The text view of a saved position: one line per level of a node state, a tree per worker.

Each level shows its steps (from the recipe, or guessed from the saved steps),
its kind and its scalar fields; long lists are summarised, never printed.
"""

from __future__ import annotations

from typing import Any

from datapipes.inspect.graph import Level, RecipeGraph
from datapipes.inspect.shapes import children, kind_taken_by, step_prefixes, worker_states

#: Lists of scalars longer than this are summarised ("16 positions"), never printed.
_LIST_INLINE = 6


def scalar(value: Any) -> str:
    """A field's value in one short piece.

    >>> scalar(list(range(16))), scalar([1, "a"]), scalar({"files": 3})
    ('16 positions', "[1, 'a']", '{files: 3}')
    """
    if isinstance(value, str):
        return repr(value)
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

    def __init__(self, saved_steps: list[str]) -> None:
        self.lines: list[str] = []
        self._saved_steps = [str(step).strip() for step in saved_steps]

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
            at = depth + level.depth
            label = level.steps or self._guess_step(level.kind)
            if level.kind == "workers":
                self._workers(at, level.key, level.state, label, graph)
            else:
                self._level(at, level, label, graph)

    def _guess_step(self, kind: str | None) -> str:
        """The saved step a kind of state comes from, when exactly one step fits."""
        prefixes = step_prefixes(kind)
        matches = [s for s in self._saved_steps if s.startswith(prefixes)] if prefixes else []
        return matches[0] if len(matches) == 1 else ""

    def _level(self, depth: int, level: Level, label: str, graph: RecipeGraph) -> None:
        kind = level.kind
        if label and kind and not label.startswith(kind + " "):
            name = f"{label} ({kind})"
        else:
            name = label or kind or "?"
        head = (f"{level.key}: " if level.key else "") + name
        nested = {key.split("[")[0] for key, _, _ in children(level.state, kind)}
        fields = ", ".join(f"{k}={scalar(v)}" for k, v in level.state.items() if k not in nested)
        self.line(depth, f"{head}: {fields}{_note(level, graph)}" if fields else head)
        expected = kind_taken_by(level.node)
        if expected is not None and expected != kind:
            self.line(
                depth + 1,
                f"! the recipe has a {type(level.node).__name__} here, which takes a {expected} "
                f"state, but the checkpoint holds a {kind or 'different'} state",
            )

    def _workers(
        self, depth: int, key: str, state: dict[str, Any], label: str, graph: RecipeGraph
    ) -> None:
        """The StatefulDataLoader state: snapshot, next worker, and a tree per worker."""
        head = (f"{key}: " if key else "") + (f"{label.lstrip('.')} over " if label else "")
        loader = state.get("dataloader")
        if not isinstance(loader, dict):
            self.line(depth, f"{head}worker processes: the epoch has ended")
            return
        workers = worker_states(state)
        snapshot = loader.get("_snapshot") or {}
        count = len(workers) or int((snapshot.get("_main_snapshot") or {}).get("_num_workers", 0))
        self.line(depth, f"{head}{count} worker processes")
        since = int(loader.get("_steps_since_snapshot") or 0)
        step = int(snapshot.get("_snapshot_step") or 0)
        self.line(
            depth + 1,
            f"snapshot after item {step} of the epoch; {since} items returned since, "
            "which a resume replays",
        )
        last = snapshot.get("_last_yielded_worker_id")
        if isinstance(last, int) and count:
            self.line(
                depth + 1,
                f"next: item {step + since}, from worker {(last + 1 + since) % count} "
                "(workers take turns while all of them have data)",
            )
        if loader.get("_iterator_finished"):
            self.line(depth + 1, "the DataLoader iterator has finished")
        for worker_id, dataset in workers:
            if not dataset:
                self.line(depth + 1, f"worker {worker_id}: no position yet (starts at the start)")
                continue
            consumer = dataset.get("consumer") or []
            where = "consumer ?"
            if len(consumer) == 4:
                rank, world, wid, num = consumer
                where = f"consumer {rank * num + wid} of {world * num}"
            skipped = dataset.get("skipped") or {}
            skip_text = ", ".join(f"{n} by {s}" for s, n in skipped.items()) or "none"
            self.line(
                depth + 1,
                f"worker {worker_id} ({where}): epoch {dataset.get('epoch')}, skipped: {skip_text}",
            )
            try:
                worker_graph = graph.worker(worker_id, dataset)
            except Exception:  # noqa: BLE001 - labels are a help; the view by keys still works
                worker_graph = RecipeGraph()
            self.position(depth + 2, dataset.get("node"), worker_graph)


def _note(level: Level, graph: RecipeGraph) -> str:
    """What a level's fields mean for a resume, where that is not plain."""
    state = level.state
    if level.kind == "buffer shuffle":
        try:
            replay = int(state["seq"]) - int(state["anchor_seq"])
        except (TypeError, ValueError):
            return ""
        return f"; a resume re-reads {replay} items from the anchor"
    if level.kind == "reader":
        if state.get("file") is None:
            return "; this consumer's files are done"
        url = graph.url(level.node, state["file"])
        if url is not None:
            return f"; file {state['file']} is {url}"
    return ""
