"""The report on a checkpoint's Loader states: as text, one line per level, or as JSON.

Per state: its version, fingerprint, seed, steps and topology; per rank its
epoch and position, the node states one line per level with their kinds, steps
and scalar fields (long lists summarised, never printed), and for worker
processes the snapshot, the next worker and one tree per worker.
"""

from __future__ import annotations

import reprlib
from typing import Any

from datapipes.checkpoint import STATE_VERSION, decode_state
from datapipes.inspect.tree import Level, RecipeGraph, recipe_graph
from datapipes.pipe import DataPipe
from nodes import torchdata_adapter as torchdata

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
        self.line(depth, f"{head}{count} worker processes")
        self.line(
            depth + 1,
            f"snapshot after item {step} of the epoch; {since} items returned since, "
            "which a resume replays",
        )
        if where["last_worker"] is not None and count:
            following = (where["last_worker"] + 1 + since) % count
            self.line(
                depth + 1,
                f"next: item {step + since}, from worker {following} "
                "(workers take turns while all of them have data)",
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
    if level.kind == "reader":
        if state.get("file") is None:
            return "; this consumer's files are done"
        url = graph.url(level, state["file"])
        if url is not None:
            return f"; file {state['file']} is {url}"
    return ""


def render(
    found: list[tuple[str, dict[str, Any]]],
    pipe: DataPipe[Any] | None,
    checks: list[list[str]] | None,
    recipe_name: str = "recipe",
) -> str:
    """The report on the Loader states ``found`` (and on ``checks``, one per state, if given)."""
    lines: list[str] = []
    # Without the recipe only the shape is checked: the positions point into data it names.
    check = f"recipe check ({recipe_name})" if pipe is not None else "state check (shape only)"
    passed = (
        "OK, same fingerprint and every saved rank loads"
        if pipe is not None
        else "OK; positions not checked against the data: pass --recipe MODULE:NAME for that"
    )
    for index, (path, state) in enumerate(found):
        writer = Writer()
        try:
            _render_state(writer, path, state, pipe)
        except Exception as error:  # noqa: BLE001 - a malformed state is shown as it is
            writer.line(1, f"! cannot be shown level by level ({type(error).__name__}: {error})")
            writer.line(1, f"{reprlib.repr(state)}")
        if checks is not None and checks[index]:
            writer.line(1, f"{check}: FAILED")
            for problem in checks[index]:
                for text in problem.splitlines():
                    writer.line(2, text)
        elif checks is not None:
            writer.line(1, f"{check}: {passed}")
        lines += ([""] if index else []) + writer.lines
    return "\n".join(lines)


def _render_state(
    writer: Writer, path: str, state: dict[str, Any], pipe: DataPipe[Any] | None
) -> None:
    writer.line(0, f"Loader state at {path!r}" if path else "Loader state at the top level")
    version = state.get("version")
    writer.line(1, f"version      {version}")
    if isinstance(version, int) and version < STATE_VERSION:
        writer.line(
            2,
            f"! saved by an older datapipes; a version {STATE_VERSION} Loader refuses it, and "
            "its nested node states are not told apart here",
        )
    elif version != STATE_VERSION:
        writer.line(
            2, f"! this datapipes reads version {STATE_VERSION}; what follows may be incomplete"
        )
    writer.line(1, f"fingerprint  {state.get('fingerprint')}")
    writer.line(1, f"seed         {state.get('seed')}")
    writer.line(1, "steps")
    for step in state.get("steps", []):
        writer.line(2, str(step))
    topology = state.get("topology") or {}
    even = "on" if topology.get("even_batches") else "off"
    writer.line(
        1,
        f"topology     world size {topology.get('world_size')}, "
        f"{topology.get('num_workers')} workers, even_batches {even}",
    )
    same_recipe = pipe is not None and pipe.fingerprint() == state.get("fingerprint")
    ranks = decode_state(state)["ranks"]
    for rank in sorted(ranks, key=lambda r: (len(r), r)):
        mine = ranks[rank]
        if not isinstance(mine, dict):
            writer.line(1, f"rank {rank}: {scalar(mine)}")
            continue
        epoch = mine.get("epoch")
        writer.line(1, f"rank {rank}: epoch {epoch}")
        if mine.get("node") is None:
            writer.line(2, f"no position: the next iteration runs epoch {epoch} from its start")
            continue
        saved = mine.get("graph") if isinstance(mine.get("graph"), dict) else None
        graph = RecipeGraph(saved)
        if same_recipe and rank.isdigit():
            try:
                graph = recipe_graph(pipe, state, int(rank), int(epoch or 0), saved)  # type: ignore[arg-type]
            except Exception:  # noqa: BLE001 - the recipe is a help; the recorded graph still works
                pass
        writer.position(2, mine["node"], graph)


def as_json(
    checkpoint: str, found: list[tuple[str, dict[str, Any]]], checks: list[list[str]] | None
) -> dict[str, Any]:
    """The report as JSON data: each Loader state decoded, and the recipe checks if made."""
    out: dict[str, Any] = {
        "checkpoint": checkpoint,
        "loader_states": [{"path": path, "state": decode_state(state)} for path, state in found],
    }
    if checks is not None:
        out["recipe_check"] = [
            {"path": path, "ok": not problems, "problems": problems}
            for (path, _), problems in zip(found, checks)
        ]
    return out
