"""Hostile Loader states: every mutation gives a clear error or an exact resume, never wrong data.

A zoo of recipes covers every built-in node kind. For each, a real state is
taken mid-epoch and mutated systematically (wrong types, negative and
out-of-range positions, missing and extra keys, duplicated slots, ``None``,
huge ints, floats, bools, strings, NaN, deep nesting, states of other
recipes, topologies and seeds). Each mutated state must either be refused
with ``dp.StateMismatchError`` (``dp.InvalidStateError`` naming the path
inside the state), or resume to a valid continuation: the uninterrupted
run of the state's epoch from some position. Never a raw exception, never
wrong data. An edit that makes another consistent position (a counter moved
within its range: ``take``'s count, a shuffle slot, a mix's draw counter)
cannot be told from a real one without replaying the epoch from its start;
it must resume as edited: the same stream at every resume, no ``None`` item.
The same states go through ``inspect``'s recipe check, which must refuse
exactly the states the Loader refuses.

The number of cases per category is printed (``-s``) and kept in ``TALLY``.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import datapipes as dp
from datapipes.inspect import check_recipe, describe_checkpoint
from datapipes.resume.schema import node_digest
from nodes import UPSTREAM, Node
from tests.file_fixtures import (
    csv_table,
    jsonl_records,
    random_array,
    tar_samples,
    write_csv,
    write_jsonl,
    write_npy,
    write_tar,
)
from tests.helpers import canon

#: Cases tried, by mutation category and outcome, over the whole module.
TALLY: Counter[tuple[str, str]] = Counter()


# ----- the zoo ----------------------------------------------------------------------------


def _twice(x: int) -> list[int]:
    return [x, x + 1000]


def _is_even(x: int) -> bool:
    return x % 2 == 0


def _not_a_multiple_of_3(x: int) -> bool:
    return x % 3 != 0


def _plus_one(x: int) -> int:
    return x + 1


class RunningSum(Node):
    """A user node without validate_state: its own field ("total") is opaque to validation
    (not mutated here), its input's state under ``UPSTREAM`` is checked by the default."""

    def __init__(self, upstream: Node) -> None:
        super().__init__(upstream)
        self.upstream = upstream

    def reset(self, state: Any = None) -> None:
        self.upstream.reset(None if state is None else state[UPSTREAM])
        self.total = 0 if state is None else state["total"]

    def __next__(self) -> Any:
        self.total += next(self.upstream)
        return self.total

    def state_dict(self) -> dict[str, Any]:
        return {UPSTREAM: self.upstream.state_dict(), "total": self.total}


#: Fields of custom nodes that no validation can know: not mutated.
OPAQUE = {"total"}


def _files(root: Path) -> dict[str, str]:
    """Data files of every reader, written once per module."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        write_jsonl(root, f"j{i}.jsonl", jsonl_records(12, seed=i, start=100 * i))
    header, rows = csv_table(30, seed=1)
    write_csv(root, "t0.csv", header, rows)
    write_npy(root, "a0.npy", random_array((9, 3), np.int32, 1))
    write_npy(root, "a1.npy", random_array((7, 3), np.int32, 2))
    write_tar(root, "s0.tar", tar_samples(70, 0))
    write_tar(root, "s1.tar", tar_samples(6, 1, start=70))
    table = pa.table({"i": list(range(23)), "s": [str(i) for i in range(23)]})
    pq.write_table(table.slice(0, 15), f"{root}/p0.parquet", row_group_size=4)
    pq.write_table(table.slice(15), f"{root}/p1.parquet", row_group_size=4)
    return {"root": str(root)}


Recipe = tuple[dp.DataPipe[Any], dict[str, Any], int]


def zoo(root: str) -> dict[str, Recipe]:
    """name -> (recipe, Loader arguments, items to read before taking the state)."""
    jsonl = dp.files(f"{root}/j*.jsonl")
    return {
        "range": (dp.range(40), {}, 17),
        "from_sequence": (dp.from_sequence([f"s{i}" for i in range(30)]), {}, 11),
        "global_shuffle": (dp.range(50).shuffle(), {"seed": 3}, 20),
        "buffer_shuffle": (dp.range(60).filter(_is_even).shuffle(6), {"seed": 1}, 12),
        "read_jsonl": (jsonl.read_jsonl(block_size=300), {}, 15),
        "read_jsonl_shuffled_files": (jsonl.shuffle().read_jsonl(block_size=300), {}, 9),
        "file_list": (jsonl, {}, 1),
        "read_csv": (dp.files(f"{root}/t0.csv").read_csv(block_size=200), {}, 13),
        "read_npy": (dp.files(f"{root}/a*.npy").read_npy(), {}, 10),
        "read_parquet": (dp.files(f"{root}/p*.parquet").read_parquet(batch_size=3), {}, 13),
        "read_tar_decode": (dp.files(f"{root}/s*.tar").read_tar().decode(), {}, 66),
        "map_filter": (dp.range(40).map(_plus_one).filter(_is_even), {}, 6),
        "flat_map": (dp.range(20).filter(_is_even).flat_map(_twice), {}, 7),
        "batch_unbatch": (dp.range(30).batch(4).unbatch(), {}, 9),
        "batch": (dp.range(30).batch(4, drop_last=True), {}, 3),
        "take": (dp.range(40).take(25), {}, 10),
        "repeat": (dp.range(7).shuffle().repeat(3), {}, 10),
        "concat": (dp.concat(dp.range(5), dp.range(100, 108), dp.range(200, 204)), {}, 7),
        "zip": (dp.zip(dp.range(12), dp.range(100, 120).shuffle(4)), {}, 5),
        "mix": (dp.mix([dp.range(10), dp.range(100, 115)], [1, 2]), {"seed": 2}, 9),
        "mix_first": (
            dp.mix([dp.range(10), dp.range(100, 115)], [1, 1], stop="first_exhausted"),
            {},
            6,
        ),
        "shard": (dp.from_iterable(list(range(30))).shard(), {"rank": 1, "world_size": 2}, 5),
        "from_iterable": (dp.from_iterable(list(range(15))), {}, 4),
        "prefetch": (dp.range(30).map(_plus_one).prefetch(3), {}, 8),
        "parallel_map": (dp.range(40).filter(_is_even).map(_plus_one, num_workers=2), {}, 9),
        "apply_node": (dp.range(20).apply_node(RunningSum), {}, 6),
        "even_batches": (
            dp.range(23).filter(_not_a_multiple_of_3),  # 8 items on rank 0, 7 on rank 1
            {"rank": 0, "world_size": 2, "even_batches": True},
            2,
        ),
    }


def worker_zoo(root: str) -> dict[str, Recipe]:
    """Recipes run in DataLoader workers (slow: each case starts processes)."""
    return {
        "workers_range": (dp.range(40).map(_plus_one), {"num_workers": 2}, 13),
        "workers_jsonl_shuffle": (
            dp.files(f"{root}/j*.jsonl").read_jsonl(block_size=300).shuffle(5),
            {"num_workers": 2, "snapshot_every_n_steps": 4},
            11,
        ),
    }


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _files(tmp_path_factory.mktemp("hostile"))["root"]


# ----- running and judging ----------------------------------------------------------------


def _epoch(recipe: Recipe, epoch: int, cache: dict[int, list[Any]]) -> list[Any]:
    """The uninterrupted run of ``epoch``."""
    if epoch not in cache:
        pipe, kwargs, _ = recipe
        loader = dp.Loader(pipe, **kwargs)
        loader.set_epoch(epoch)
        cache[epoch] = [canon(x) for x in loader]
        loader.close()
    return cache[epoch]


def _state_mid_epoch(recipe: Recipe) -> tuple[dict[str, Any], list[Any]]:
    """A state after ``k`` items of epoch 0, and the items that follow it."""
    pipe, kwargs, k = recipe
    loader = dp.Loader(pipe, **kwargs)
    items = iter(loader)
    for _ in range(k):
        next(items)
    state = loader.state_dict()
    rest = [canon(x) for x in items]
    loader.close()
    return state, rest


def _suffix_of(got: list[Any], full: list[Any]) -> bool:
    return len(got) <= len(full) and full[len(full) - len(got) :] == got


#: Mutations that can make another consistent position: a counter moved within its range
#: (``take``'s count, a shuffle slot, a mix's draw counter), an input's state repeated for
#: another input. No check can tell such an edit from a real position without replaying the
#: epoch from its start, so it resumes as edited: deterministically, with no foreign item.
EDITS = frozenset({"in-range move", "duplicated item", "out of range", "huge int"})


def _resume(recipe: Recipe, state: Any) -> list[Any]:
    pipe, kwargs, _ = recipe
    loader = dp.Loader(pipe, **kwargs)
    try:
        loader.load_state_dict(state)
        return [canon(x) for x in loader]
    finally:
        loader.close()


def judge(
    recipe: Recipe, state: Any, full: dict[int, list[Any]], category: str = ""
) -> tuple[str, str]:
    """``("refused", message)``, ``("resumed", "")`` (exactly: a suffix of the epoch's
    uninterrupted run) or, for an edit in ``EDITS``, ``("resumed as edited", "")``
    (the same stream at every resume, items of the recipe only); else the test fails."""
    try:
        got = _resume(recipe, state)
    except dp.StateMismatchError as error:
        if isinstance(error, dp.InvalidStateError):
            assert error.path in str(error)
        return "refused", str(error)
    epoch = state["ranks"][next(iter(state["ranks"]))]["epoch"]
    expected = _epoch(recipe, epoch, full)
    if _suffix_of(got, expected):
        return "resumed", ""
    assert category in EDITS, (
        f"accepted, but not a continuation of epoch {epoch}: got {got[:8]}... "
        f"({len(got)} items), the epoch is {expected[:8]}... ({len(expected)} items)"
    )
    assert ("NoneType", None) not in got and None not in got, "a None item"
    assert _resume(recipe, state) == got, "an edited state resumed differently twice"
    return "resumed as edited", ""


# ----- mutations --------------------------------------------------------------------------

#: A JSON text nested far deeper than any parser's stack.
DEEP_TEXT = '{"a":' * 100_000 + "1" + "}" * 100_000


def _deep_value(depth: int = 200) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"upstream": value}
    return value


def _value_mutations(value: Any) -> Iterator[tuple[str, Any]]:
    """(category, replacement) for one value of a node state."""
    if type(value) is int:
        yield "negative", -1
        yield "out of range", 10**9
        yield "huge int", 2**80
        yield "in-range move", value + 1
        if value > 0:
            yield "in-range move", value - 1
        yield "float", value + 0.5
        yield "float", float(value)
        yield "NaN", math.nan
        yield "string", str(value)
        yield "bool", True
        yield "None", None
    elif type(value) is bool:
        yield "bool flip", not value
        yield "wrong type", int(value)
        yield "string", "true"
        yield "None", None
    elif isinstance(value, str):
        yield "string", value + "x"
        yield "wrong type", 0
        yield "None", None
    elif isinstance(value, list):
        yield "wrong type", {"0": value}
        yield "None", None
        if value:
            yield "missing item", value[:-1]
            yield "duplicated item", [*value[:-1], value[0]] if len(value) > 1 else value * 2
            yield "extra item", [*value, value[-1]]
        else:
            yield "extra item", [0]
    elif isinstance(value, dict):
        yield "wrong type", list(value.values())
        yield "None", None
        yield "deep nesting", _deep_value()
        yield "extra key", {**value, "unknown": 1}
        for key in value:
            yield "missing key", {k: v for k, v in value.items() if k != key}
    elif value is None:
        yield "wrong type", 0
        yield "wrong type", {}
        yield "string", "x"


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*path, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _paths(child, (*path, i))


def _replace(tree: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    tree = copy.copy(tree)
    tree[path[0]] = _replace(tree[path[0]], path[1:], new)
    return tree


def node_mutations(state: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(category, where, mutated state) for every value of the rank's node state."""
    rank = next(iter(state["ranks"]))
    node = json.loads(state["ranks"][rank]["node"])
    for path, value in _paths(node):
        if not path or path[-1] in OPAQUE:
            continue
        for category, new in _value_mutations(value):
            text = json.dumps(_replace(node, path, new))
            yield (
                category,
                "node" + "".join(f"[{p!r}]" for p in path),
                _with_node(state, rank, text),
            )


def _with_node(state: dict[str, Any], rank: str, text: Any) -> dict[str, Any]:
    """``state`` with other node text, its digest recomputed (as a hostile writer would), so
    that the node states' own checks are what is tested; ``test_node_digest`` covers the
    digest itself."""
    mutated = copy.deepcopy(state)
    mutated["ranks"][rank]["node"] = text
    mutated["ranks"][rank]["digest"] = node_digest(text) if isinstance(text, str) else None
    return mutated


def envelope_mutations(state: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(category, where, mutated state) for the Loader envelope."""
    rank = next(iter(state["ranks"]))

    def changed(**fields: Any) -> dict[str, Any]:
        return {**copy.deepcopy(state), **fields}

    for key in state:
        yield "missing key", key, {k: v for k, v in state.items() if k != key}
    yield "extra key", "unknown", changed(unknown=1)
    yield "wrong type", "state", [state]
    yield "None", "state", None
    for seed in ("0", True, 1.5, None, math.nan):
        yield "seed type", "seed", changed(seed=seed)
    yield "other seed", "seed", changed(seed=state["seed"] + 7)
    yield "other version", "version", changed(version=3)
    yield "other version", "version", changed(version="4")
    yield "other recipe", "fingerprint", changed(fingerprint="0" * 16)
    yield "wrong type", "fingerprint", changed(fingerprint=None)
    yield "wrong type", "steps", changed(steps="range")
    topology = state["topology"]
    for key, bad in [
        ("world_size", topology["world_size"] + 1),
        ("world_size", 0),
        ("world_size", "1"),
        ("num_workers", topology["num_workers"] + 1),
        ("num_workers", -1),
        ("even_batches", not topology["even_batches"]),
        ("even_batches", "yes"),
    ]:
        category = "other topology" if type(bad) is type(topology[key]) else "topology type"
        yield category, f"topology.{key}", changed(topology={**topology, key: bad})
    yield (
        "missing key",
        "topology.num_workers",
        changed(topology={k: v for k, v in topology.items() if k != "num_workers"}),
    )
    yield "wrong type", "ranks", changed(ranks=[])
    yield "missing item", "ranks", changed(ranks={})
    yield "other rank", "ranks", changed(ranks={"7": state["ranks"][rank]})
    yield "wrong type", "ranks key", changed(ranks={int(rank): state["ranks"][rank]})
    mine = state["ranks"][rank]
    for category, epoch in [
        ("negative", -1),
        ("string", "0"),
        ("bool", True),
        ("float", 0.5),
        ("None", None),
        ("in-range move", mine["epoch"] + 1),
    ]:
        yield category, "epoch", changed(ranks={rank: {**mine, "epoch": epoch}})
    yield (
        "missing key",
        "epoch",
        changed(ranks={rank: {k: v for k, v in mine.items() if k != "epoch"}}),
    )
    for category, text in [
        ("string", "not json"),
        ("wrong type", "[1, 2]"),
        ("wrong type", '"x"'),
        ("wrong type", {"position": 1}),
        ("deep nesting", DEEP_TEXT),
        ("NaN", "NaN"),
    ]:
        yield category, "node", _with_node(state, rank, text)
    yield "wrong type", "graph", changed(ranks={rank: {**mine, "graph": 5}})


# ----- the tests --------------------------------------------------------------------------


def _run_cases(recipe: Recipe, cases: Iterator[tuple[str, str, Any]], name: str) -> None:
    full: dict[int, list[Any]] = {}
    failures = []
    for category, where, mutated in cases:
        try:
            outcome, _ = judge(recipe, mutated, full, category)
        except AssertionError as error:
            failures.append(f"{name} {category} at {where}: {error}")
            outcome = "FAILED"
        except Exception as error:  # noqa: BLE001 - a raw exception is the failure
            failures.append(f"{name} {category} at {where}: raw {type(error).__name__}: {error}")
            outcome = "FAILED"
        TALLY[(category, outcome)] += 1
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:25])


@pytest.mark.parametrize("name", list(zoo("ROOT")))
def test_mutated_node_states_are_refused_or_resume_exactly(root: str, name: str) -> None:
    recipe = zoo(root)[name]
    state, rest = _state_mid_epoch(recipe)
    assert judge(recipe, state, {})[0] == "resumed"  # the state itself resumes
    _run_cases(recipe, node_mutations(state), name)


@pytest.mark.parametrize("name", ["range", "buffer_shuffle", "read_jsonl", "even_batches"])
def test_mutated_envelopes_are_refused_or_resume_exactly(root: str, name: str) -> None:
    recipe = zoo(root)[name]
    state, _ = _state_mid_epoch(recipe)
    _run_cases(recipe, envelope_mutations(state), name)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(worker_zoo("ROOT")))
def test_mutated_worker_states_are_refused_or_resume_exactly(root: str, name: str) -> None:
    recipe = worker_zoo(root)[name]
    state, _ = _state_mid_epoch(recipe)
    cases = list(node_mutations(state))
    # Every snapshot value is mutated; keep the run short by sampling the dataset states.
    picked = [c for i, c in enumerate(cases) if "dataset_state" not in c[1] or i % 5 == 0]
    _run_cases(recipe, iter(picked), name)


def test_a_missing_or_none_worker_snapshot_is_refused_naming_it(root: str) -> None:
    recipe: Recipe = (dp.range(40), {"num_workers": 2}, 9)
    state, _ = _state_mid_epoch(recipe)
    node = json.loads(state["ranks"]["0"]["node"])
    workers = node["dataloader"]["_snapshot"]["_worker_snapshots"]
    for mutated in ({"worker_0": workers["worker_0"]}, {**workers, "worker_1": None}):
        node["dataloader"]["_snapshot"]["_worker_snapshots"] = mutated
        with pytest.raises(dp.InvalidStateError, match="worker_1"):
            dp.Loader(dp.range(40), num_workers=2).load_state_dict(
                _with_node(state, "0", json.dumps(node))
            )


def test_a_refused_state_leaves_the_loader_where_it_was() -> None:
    loader = dp.Loader(dp.range(20))
    items = iter(loader)
    first = [next(items) for _ in range(5)]
    good = loader.state_dict()
    bad = _with_node(good, "0", json.dumps({"position": 99}))
    with pytest.raises(dp.InvalidStateError, match=r'ranks\["0"\]\.node\.position'):
        loader.load_state_dict(bad)
    assert loader.state_dict() == good
    assert [*first, *items] == list(range(20))


def test_a_refused_state_leaves_a_running_epoch_alone() -> None:
    pipe = dp.range(200).shuffle().prefetch(4)  # a thread reads ahead while the state is checked
    full = list(dp.Loader(pipe, seed=1))
    loader = dp.Loader(pipe, seed=1)
    items = iter(loader)
    head = [next(items) for _ in range(10)]
    state = loader.state_dict()
    text = json.dumps({"position": 999})
    mine = {**state["ranks"]["0"], "epoch": 5, "node": text, "digest": node_digest(text)}
    with pytest.raises(dp.InvalidStateError, match="position"):
        loader.load_state_dict({**state, "ranks": {"0": mine}})
    assert head + list(items) == full
    loader.close()


def test_the_examples_of_the_issue() -> None:
    """Each example of finding 1 is refused with the path and what was expected."""
    loader = dp.Loader(dp.range(1000))
    items = iter(loader)
    for _ in range(10):
        next(items)
    state = loader.state_dict()
    for position in (1001, 10**9, 40.5, True):
        with pytest.raises(dp.InvalidStateError, match=r"node\.position.*int in \[0, 1000\]"):
            dp.Loader(dp.range(1000)).load_state_dict(
                _with_node(state, "0", json.dumps({"position": position}))
            )
    with pytest.raises(dp.InvalidStateError, match="epoch"):
        dp.Loader(dp.range(1000)).load_state_dict(
            {**state, "ranks": {"0": {**state["ranks"]["0"], "epoch": -1}}}
        )
    with pytest.raises(dp.InvalidStateError, match="seed: expected an int"):
        dp.Loader(dp.range(1000)).load_state_dict({**state, "seed": "0"})
    for key in ("fingerprint", "seed", "topology", "ranks"):
        with pytest.raises(dp.InvalidStateError, match=key):
            dp.Loader(dp.range(1000)).load_state_dict({k: v for k, v in state.items() if k != key})
    with pytest.raises(dp.InvalidStateError, match="does not parse"):
        dp.Loader(dp.range(1000)).load_state_dict(_with_node(state, "0", "{"))


def _state_after(pipe: dp.DataPipe, count: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Loader state after ``count`` items of one rank, and its node state parsed."""
    loader = dp.Loader(pipe)
    items = iter(loader)
    for _ in range(count):
        next(items)
    state = loader.state_dict()
    return state, json.loads(state["ranks"]["0"]["node"])


def test_a_byte_cursor_past_the_end_or_moved_names_the_url_offset_and_size(root: str) -> None:
    pipe = dp.files(f"{root}/j0.jsonl").read_jsonl(block_size=300, on_error="skip")
    state, node = _state_after(pipe, 5)
    assert node["cursor"] is not None
    size = Path(root, "j0.jsonl").stat().st_size
    for offset, message in [(size + 2600, f"size {size} bytes"), (node["cursor"][0] + 3, "moved")]:
        moved = {**node, "cursor": [offset, node["cursor"][1], node["cursor"][2]]}
        with pytest.raises(dp.InvalidStateError, match="j0.jsonl") as error:
            dp.Loader(pipe).load_state_dict(_with_node(state, "0", json.dumps(moved)))
        assert message in str(error.value) and str(offset) in str(error.value)


def test_a_cursor_at_the_first_record_after_a_byte_order_mark_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    lines = b"".join(b'{"a": %d}\n' % i for i in range(9))
    path.write_bytes(b"\xef\xbb\xbf" + b'{"a": 1\n' + lines)
    pipe = dp.files(str(path)).read_jsonl(block_size=64)
    loader = dp.Loader(pipe)
    with pytest.raises(dp.BadRecordError, match="line 1"):
        next(iter(loader))
    state = loader.state_dict()  # the cursor of the bad record: byte 3, after the mark
    assert json.loads(state["ranks"]["0"]["node"])["cursor"][0] == 3
    resumed = dp.Loader(pipe)
    resumed.load_state_dict(state)  # valid: the same bad record is met again
    with pytest.raises(dp.BadRecordError, match="line 1"):
        next(iter(resumed))


@pytest.mark.parametrize("name", ["range", "buffer_shuffle", "read_jsonl", "workers"])
def test_inspect_refuses_exactly_what_the_loader_refuses(root: str, name: str) -> None:
    recipe = (dp.range(40), {"num_workers": 2}, 9) if name == "workers" else zoo(root)[name]
    state, _ = _state_mid_epoch(recipe)
    cases = [*node_mutations(state), *envelope_mutations(state)]
    step = max(1, len(cases) // 40) if name == "workers" else 1
    for category, where, mutated in cases[::step]:
        if category in ("other seed", "other topology"):
            continue  # inspect loads a state with the seed and topology it was saved with
        if name == "workers":
            outcome, _ = _loads(recipe, mutated)
        else:
            outcome, _ = judge(recipe, mutated, {}, category)
        if not isinstance(mutated, dict) or not {"version", "fingerprint", "ranks"} <= set(mutated):
            continue  # not recognisable as a Loader state: inspect says it found none
        problems = check_recipe(mutated, recipe[0])
        assert bool(problems) == (outcome == "refused"), (category, where, problems)
        describe_checkpoint({"data": mutated})  # never a crash, whatever the state
        TALLY[(f"inspect {category}", outcome)] += 1


def _loads(recipe: Recipe, state: Any) -> tuple[str, str]:
    try:
        dp.Loader(recipe[0], **recipe[1]).load_state_dict(state)
    except dp.StateMismatchError as error:
        return "refused", str(error)
    return "resumed", ""


def test_inspect_without_a_recipe_checks_the_envelope(tmp_path: Path) -> None:
    from datapipes.inspect import main

    loader = dp.Loader(dp.range(10))
    next(iter(loader))
    state = loader.state_dict()
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(state))
    bad.write_text(json.dumps({**state, "seed": "0"}))
    assert main([str(good)]) == 0
    assert main([str(bad)]) == 1


@pytest.mark.slow
def test_inspect_command_exits_non_zero_on_an_invalid_state(tmp_path: Path) -> None:
    loader = dp.Loader(dp.range(10))
    next(iter(loader))
    state = loader.state_dict()
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_with_node(state, "0", json.dumps({"position": 11}))))
    recipe = tmp_path / "recipe.py"
    recipe.write_text("import datapipes as dp\npipe = dp.range(10)\n")
    run = subprocess.run(
        [sys.executable, "-m", "datapipes", "inspect", str(path), "--recipe", f"{recipe}:pipe"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert 'ranks["0"].node.position' in run.stdout + run.stderr


def test_zz_print_cases_per_category() -> None:
    """The closing note's numbers: cases tried per category (run with -s to see them)."""
    categories = sorted({category for category, _ in TALLY})
    lines = [
        f"{category:28} refused {TALLY[(category, 'refused')]:5}  "
        f"resumed exactly {TALLY[(category, 'resumed')]:5}  "
        f"resumed as edited {TALLY[(category, 'resumed as edited')]:4}  "
        f"failed {TALLY[(category, 'FAILED')]}"
        for category in categories
    ]
    print("\nhostile states, cases per category:\n" + "\n".join(lines))
    assert not any(TALLY[(category, "FAILED")] for category in categories)


# ----- the node states' digest ----------------------------------------------------------------


def _not_third(x: int) -> bool:
    return x % 3 != 0


def _digest_loader() -> dp.Loader:
    return dp.Loader(dp.range(100).shuffle().filter(_not_third).batch(4), seed=1)


def _mid_epoch_state() -> dict[str, Any]:
    loader = _digest_loader()
    it = iter(loader)
    for _ in range(5):
        next(it)
    return loader.state_dict()


def _damaged(state: dict[str, Any], text: Any) -> dict[str, Any]:
    """``state`` with other node text and the digest saved with the original (damage)."""
    damaged = copy.deepcopy(state)
    damaged["ranks"]["0"]["node"] = text
    return damaged


def test_node_digest_refuses_any_change_to_the_saved_node_states():
    state = _mid_epoch_state()
    text = state["ranks"]["0"]["node"]
    moved = text.replace('"position":', '"position":1', 1)  # another valid-looking number
    flipped = text[:-3] + chr(ord(text[-3]) ^ 1) + text[-2:]
    for damaged in [moved, flipped, text[: len(text) // 2], text + " ", text.replace(":", ": ")]:
        assert damaged != text
        with pytest.raises(dp.InvalidStateError, match=r'ranks\["0"\]\.digest') as caught:
            _digest_loader().load_state_dict(_damaged(state, damaged))
        assert "changed or damaged after the save" in str(caught.value)


@pytest.mark.parametrize("digest", [None, "", 0, "0" * 16, ["x"]])
def test_a_missing_or_wrong_digest_is_refused(digest):
    bad = copy.deepcopy(_mid_epoch_state())
    bad["ranks"]["0"]["digest"] = digest
    with pytest.raises(dp.InvalidStateError, match="digest"):
        _digest_loader().load_state_dict(bad)
    del bad["ranks"]["0"]["digest"]
    with pytest.raises(dp.InvalidStateError, match="digest"):
        _digest_loader().load_state_dict(bad)


def test_a_state_at_an_epoch_start_has_no_digest_and_refuses_one():
    state = dp.Loader(dp.range(10), seed=0).state_dict()
    assert state["ranks"]["0"]["node"] is None and state["ranks"]["0"]["digest"] is None
    bad = copy.deepcopy(state)
    bad["ranks"]["0"]["digest"] = "0" * 16
    with pytest.raises(dp.InvalidStateError, match="digest"):
        dp.Loader(dp.range(10), seed=0).load_state_dict(bad)


# ----- a TorchDataset in the user's own DataLoader ----------------------------------------------


def _dataset_state() -> tuple[Any, dict[str, Any]]:
    """A pass of a TorchDataset 5 items in (its iterator), and its state there."""
    dataset = dp.range(30).filter(_not_third).shuffle(buffer_size=4).as_torch_dataset(seed=2)
    items = iter(dataset)
    for _ in range(5):
        next(items)
    return items, dataset.state_dict()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s.pop("node"), id="no node"),
        pytest.param(lambda s: s.pop("consumer"), id="no consumer"),
        pytest.param(lambda s: s.update(epoch="0"), id="epoch a string"),
        pytest.param(lambda s: s.update(epoch=-1), id="negative epoch"),
        pytest.param(lambda s: s.update(extra=1), id="extra key"),
        pytest.param(lambda s: s.update(skipped=None), id="skipped None"),
        pytest.param(lambda s: s["node"].update(slots=[-1, 0, 0, 0]), id="bad slots"),
    ],
)
def test_a_torch_dataset_refuses_a_hostile_state_by_path(change):
    _, state = _dataset_state()
    bad = copy.deepcopy(state)
    change(bad)
    fresh = dp.range(30).filter(_not_third).shuffle(buffer_size=4).as_torch_dataset(seed=2)
    fresh.load_state_dict(bad)
    with pytest.raises(dp.InvalidStateError, match=r"state"):
        next(iter(fresh))


def test_a_torch_dataset_still_resumes_exactly_from_a_good_state():
    items, state = _dataset_state()
    rest = list(items)  # the uninterrupted rest of the pass
    fresh = dp.range(30).filter(_not_third).shuffle(buffer_size=4).as_torch_dataset(seed=2)
    fresh.load_state_dict(state)
    assert list(fresh) == rest


@pytest.mark.parametrize("cursor", [-1, "5", 2.5, True, [5]])
def test_an_npy_row_cursor_that_is_no_row_number_is_refused(tmp_path: Path, cursor: Any) -> None:
    # Past the first block (4 MiB: 262,144 rows of 16 bytes), so the state holds a row.
    write_npy(str(tmp_path), "big.npy", np.arange(300_000 * 4, dtype=np.int32).reshape(-1, 4))
    pipe = dp.files(f"{tmp_path}/big.npy").read_npy()
    state, node = _state_after(pipe, 270_000)
    assert isinstance(node["cursor"], int) and node["cursor"] > 0
    resumed = dp.Loader(pipe)
    resumed.load_state_dict(state)
    assert [int(row[0]) for row in resumed] == list(range(270_000 * 4, 300_000 * 4, 4))
    bad = json.dumps({**node, "cursor": cursor})
    with pytest.raises(dp.InvalidStateError, match="cursor"):
        dp.Loader(pipe).load_state_dict(_with_node(state, "0", bad))
