"""Elastic resume: pieces, dealing, merging, refusals and exact resumes on other topologies.

The property test over random recipes and topologies is tests/resume/test_elastic_properties.py;
real torchrun jobs are tests/resume/test_elastic_distributed.py. Here: the parts, one at a time.
"""

from __future__ import annotations

import io
import json
import warnings
from collections import Counter
from itertools import islice
from typing import Any

import pytest
import torch
from file_fixtures import write_id_files
from helpers import multiset

import datapipes as dp
import nodes
from datapipes.resume import parse_state, remaining_work
from nodes import elastic as el


def flat(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if hasattr(item, "tolist"):
            item = item.tolist()
        if isinstance(item, list):
            out.extend(flat(item))
        else:
            out.append(item)
    return out


def loaders(pipe, world_size: int, num_workers: int = 0, **kwargs) -> list[dp.Loader]:
    return [
        dp.Loader(pipe, seed=5, rank=r, world_size=world_size, num_workers=num_workers, **kwargs)
        for r in range(world_size)
    ]


def stop_at(group: list[dp.Loader], counts: list[int]) -> tuple[list[Any], dict[str, Any]]:
    """Each rank takes its count of items; the merged state of all of them."""
    taken: list[Any] = []
    for loader, count in zip(group, counts):
        it = iter(loader)
        for _ in range(count):
            taken.append(next(it))
    merged = dp.merge_states([loader.state_dict() for loader in group])
    for loader in group:
        loader.close()
    return taken, merged


def finish(group: list[dp.Loader], state: dict[str, Any], epoch: int = 0) -> list[Any]:
    out: list[Any] = []
    for loader in group:
        loader.load_state_dict(state)
        if loader.epoch == epoch:  # a rank that had finished the epoch resumes at the next
            out.extend(loader)
        loader.close()
    return out


# ----- pieces and dealing ---------------------------------------------------------------------


def test_round_robin_shares_coalesce_into_a_tail_and_the_lags():
    # 4 consumers of range(100) dealt round-robin, at local positions 5, 7, 7, 9.
    shares = [el.positions(c + 4 * k, 100, 4) for c, k in enumerate([5, 7, 7, 9])]
    pieces = el.coalesce(shares)
    assert pieces == [
        {"range": [20, 40, 4]},  # consumer 0 lags behind the furthest, at 39
        {"range": [29, 41, 4]},
        {"range": [30, 42, 4]},
        {"range": [39, 100, 1]},  # from there on every position remains
    ]
    assert el.expand({"s": {"kind": "positions", "pieces": pieces}}) == el.expand(
        {"s": {"kind": "positions", "pieces": shares}}
    )
    # A consumer that finished adds nothing (its positions are not remaining).
    finished = [*shares[:3], el.positions(3 + 4 * 25, 100, 4)]
    assert len(el.coalesce(finished)) == 3


def test_a_cut_share_comes_back_as_the_range_it_was_cut_from():
    work = {"s": {"kind": "positions", "pieces": [{"range": [18, 75, 3]}, {"range": [80, 90, 1]}]}}
    for consumers in (1, 2, 3, 7):
        plans = el.deal(work, consumers)
        back = el.merge_work({"s": {"kind": "positions", "pieces": plan["s"]}} for plan in plans)
        assert back == el.normalize(work), consumers


def test_positions_are_dealt_in_equal_runs_and_streams_round_robin():
    work = {
        "a": {"kind": "positions", "pieces": [{"range": [0, 10, 1]}, {"range": [20, 23, 1]}]},
        "b": {"kind": "stream", "pieces": [{"range": [7, None, 1]}]},
    }
    plans = el.deal(work, 3)
    sizes = [sum(el.piece_length(p) or 0 for p in plan["a"]) for plan in plans]
    assert sizes == [4, 4, 5]
    assert [plan["b"] for plan in plans] == [
        [{"range": [7, None, 3]}],
        [{"range": [8, None, 3]}],
        [{"range": [9, None, 3]}],
    ]
    assert el.deal(work, 3) == plans  # a pure function: every new rank computes the same


def test_records_deal_single_records_in_runs_and_file_rests_round_robin():
    singles = [{"file": 0, "part": [0, 1], "cursor": 64, "index": i, "one": True} for i in range(5)]
    rests = [
        {"file": f, "part": [0, 1], "cursor": None, "index": 0, "one": False} for f in range(4)
    ]
    plans = el.deal({"r": {"kind": "records", "pieces": singles + rests}}, 2)
    assert [len([p for p in plan["r"] if p["one"]]) for plan in plans] == [2, 3]
    assert [[p["file"] for p in plan["r"] if not p["one"]] for plan in plans] == [[0, 2], [1, 3]]


def test_a_selection_of_a_flat_map_item_is_kept_through_dealing():
    piece = el.select(el.single(41), [2, 3, 4])
    assert piece == {"range": [41, 42, 1], "from": 2, "upto": 5}
    assert el.selected(piece, 6) == [2, 3, 4]
    assert el.selected(el.select(el.single(1), [0, 5]), 6) == [0, 5]
    [plan] = el.deal({"s": {"kind": "positions", "pieces": [piece]}}, 1)
    assert plan["s"] == [piece]


# ----- merging ---------------------------------------------------------------------------------


def test_merge_states_refuses_a_missing_rank_and_a_mixed_job():
    pipe = dp.range(40).shuffle()
    _, merged = stop_at(loaders(pipe, 3), [2, 2, 2])
    states = [{**merged, "ranks": {r: merged["ranks"][r]}} for r in ("0", "1", "2")]
    with pytest.raises(dp.StateMismatchError, match=r"rank\(s\) \[1\] are missing"):
        dp.merge_states([states[0], states[2]])
    other = dp.Loader(dp.range(40), seed=5, rank=1, world_size=3).state_dict()
    with pytest.raises(dp.StateMismatchError, match="different recipes"):
        dp.merge_states([states[0], other, states[2]])
    reseeded = dp.Loader(pipe, seed=6, rank=1, world_size=3).state_dict()
    with pytest.raises(dp.StateMismatchError, match="different seeds"):
        dp.merge_states([states[0], reseeded, states[2]])
    later = dp.Loader(pipe, seed=5, rank=1, world_size=3)
    it = iter(later)
    next(it)
    with pytest.raises(dp.StateMismatchError, match="two different states of rank 1"):
        dp.merge_states([*states, later.state_dict()])
    assert dp.merge_states(reversed(states)) == merged  # any order


def test_a_merged_state_is_plain_and_keeps_one_graph_record():
    _, merged = stop_at(loaders(dp.range(60).shuffle().batch(4), 3), [1, 2, 3])
    assert json.loads(json.dumps(merged)) == merged
    buffer = io.BytesIO()
    torch.save(merged, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == merged
    graphs = [entry.get("graph") for entry in merged["ranks"].values()]
    assert sum(graph is not None for graph in graphs) == 1


# ----- resuming ---------------------------------------------------------------------------------


def test_a_merged_state_on_the_saved_topology_resumes_each_rank_bit_identically():
    pipe = dp.range(80).shuffle().map(lambda x: x * 3).shuffle(buffer_size=5).batch(3)
    reference = [flat(list(loader)) for loader in loaders(pipe, 2)]
    taken, merged = stop_at(loaders(pipe, 2), [4, 6])
    for rank, group_rank in enumerate(loaders(pipe, 2)):
        group_rank.load_state_dict(merged)
        rest = flat(list(group_rank))
        assert rest == reference[rank][(4, 6)[rank] * 3 :]


@pytest.mark.parametrize(
    ("before", "counts", "after"),
    [(2, [3, 9], 3), (3, [0, 5, 11], 2), (1, [7], 4), (4, [1, 0, 2, 3], 1)],
)
def test_remaining_items_are_dealt_exactly_once(before, counts, after):
    pipe = dp.range(97).filter(lambda x: x % 7).shuffle(buffer_size=6).batch(2)
    every = flat(list(dp.Loader(pipe, seed=5)))
    taken, merged = stop_at(loaders(pipe, before), counts)
    rest = finish(loaders(pipe, after), merged)
    assert multiset(flat(taken) + flat(rest)) == multiset(every)


def test_the_epoch_after_an_elastic_resume_is_a_fresh_epoch_of_the_new_topology():
    pipe = dp.range(30).shuffle()
    _, merged = stop_at(loaders(pipe, 2), [3, 4])
    resumed = loaders(pipe, 3)
    finish(resumed, merged)
    fresh = loaders(pipe, 3)
    for loader in fresh:
        loader.set_epoch(1)
    assert [list(loader) for loader in resumed] == [list(loader) for loader in fresh]


def test_a_one_rank_state_resumes_on_several_ranks_without_merging():
    pipe = dp.range(50).shuffle().shuffle(buffer_size=4)
    single = dp.Loader(pipe, seed=5)
    it = iter(single)
    taken = [next(it) for _ in range(13)]
    state = single.state_dict()
    rest = finish(loaders(pipe, 3), state)
    assert sorted(taken + rest) == list(range(50))


def test_a_partial_state_loads_only_on_its_own_topology():
    pipe = dp.range(20)
    state = dp.Loader(pipe, seed=5, rank=0, world_size=2).state_dict()
    with pytest.raises(dp.StateMismatchError, match="merge every rank's state first"):
        dp.Loader(pipe, seed=5, rank=0, world_size=3).load_state_dict(state)
    dp.Loader(pipe, seed=5, rank=0, world_size=2).load_state_dict(state)  # its own: fine


def test_another_seed_is_refused_on_another_topology():
    _, merged = stop_at(loaders(dp.range(20), 2), [1, 1])
    with pytest.raises(dp.StateMismatchError, match="seed=5"):
        dp.Loader(dp.range(20), seed=6, rank=0, world_size=3).load_state_dict(merged)


def test_save_load_save_on_a_new_topology_is_a_fixed_point():
    pipe = dp.range(64).shuffle().shuffle(buffer_size=5)
    _, merged = stop_at(loaders(pipe, 3), [2, 5, 8])
    _, work = remaining_work(pipe, parse_state(merged))
    first = loaders(pipe, 2)
    for loader in first:
        loader.load_state_dict(merged)
    saved = [loader.state_dict() for loader in first]
    again = loaders(pipe, 2)
    for loader, state in zip(again, saved):
        loader.load_state_dict(state)
    assert [loader.state_dict() for loader in again] == saved
    # ... and the state on the new topology describes the same remaining work.
    _, moved = remaining_work(pipe, parse_state(dp.merge_states(saved)))
    assert el.expand(moved) == el.expand(work)


# ----- drops, even batches, workers --------------------------------------------------------


def test_drop_last_drops_of_the_new_consumers_are_counted():
    pipe = dp.range(50).batch(4, drop_last=True)
    taken, merged = stop_at(loaders(pipe, 2), [2, 3])
    rest, dropped = [], 0
    for loader in loaders(pipe, 3):
        loader.load_state_dict(merged)
        rest.extend(loader)
        dropped += sum(loader.dropped().values())
    delivered = flat(taken) + flat(rest)
    assert len(set(delivered)) == len(delivered)
    assert len(delivered) + dropped == 50
    assert 0 < dropped < 3 * 4  # at most a short batch per new consumer


def test_even_batches_counts_the_new_shares_and_reports_what_it_drops():
    pipe = dp.range(41).shuffle()
    taken, merged = stop_at(loaders(pipe, 2, even_batches=True), [3, 7])
    resumed = loaders(pipe, 3, even_batches=True)
    outputs, dropped = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dp.UnevenDataWarning)
        for loader in resumed:
            loader.load_state_dict(merged)
            outputs.append(list(loader))
            dropped += sum(loader.dropped().values())
    assert len({len(items) for items in outputs}) == 1  # every rank the same number of steps
    delivered = taken + [x for items in outputs for x in items]
    assert len(set(delivered)) == len(delivered)
    assert len(delivered) + dropped == 41


@pytest.mark.slow
def test_items_the_workers_computed_ahead_are_dealt_once():
    pipe = dp.range(120).shuffle().map(lambda x: x + 1000).shuffle(buffer_size=7)
    every = flat(list(dp.Loader(pipe, seed=5)))
    taken, merged = stop_at(loaders(pipe, 2, num_workers=2), [37, 5])  # past a snapshot
    rest = finish(loaders(pipe, 3, num_workers=1), merged)
    assert Counter(flat(taken) + flat(rest)) == Counter(every)


# ----- refusals ------------------------------------------------------------------------------


class PassThrough(nodes.Node):
    """A custom node with no elastic hook."""

    def __init__(self, upstream: nodes.Node) -> None:
        super().__init__(upstream)
        self.upstream = upstream

    def reset(self, state=None):
        self.upstream.reset(state)

    def __next__(self):
        return next(self.upstream)

    def state_dict(self):
        return self.upstream.state_dict()


class DeclaredPassThrough(PassThrough):
    """The same node, declaring that it holds no item between two calls."""

    elastic = "transparent"


@pytest.mark.parametrize(
    ("pipe", "reason"),
    [
        (dp.range(40).take(10), "'take'"),
        (dp.zip(dp.range(20), dp.range(20)), "'zip'.*dp.mix or dp.concat"),
        (dp.range(20).repeat(2).repeat(2), "another repeat below it"),
        (dp.mix([dp.range(9), dp.range(9)], [1, 1], stop="first_exhausted"), "all_exhausted"),
        (dp.range(20).apply_node(PassThrough), 'PassThrough.*elastic = "transparent"'),
    ],
    ids=["take", "zip", "repeat", "mix-first-exhausted", "custom-node"],
)
def test_steps_without_an_exact_answer_are_refused_on_another_topology(pipe, reason):
    taken, merged = stop_at(loaders(pipe, 2), [1, 1])
    with pytest.raises(dp.ElasticResumeError, match=reason):
        dp.Loader(pipe, seed=5, rank=0, world_size=3).load_state_dict(merged)
    assert issubclass(dp.ElasticResumeError, dp.StateMismatchError)
    same = dp.Loader(pipe, seed=5, rank=1, world_size=2)
    same.load_state_dict(merged)  # the saved topology still resumes exactly
    assert next(iter(same)) is not None


def test_a_custom_node_with_the_hook_resumes_elsewhere():
    pipe = dp.range(30).apply_node(DeclaredPassThrough).shuffle(buffer_size=4)
    taken, merged = stop_at(loaders(pipe, 2), [5, 2])
    rest = finish(loaders(pipe, 3), merged)
    assert sorted(taken + rest) == list(range(30))


def test_a_damaged_merged_state_is_an_invalid_state_error():
    pipe = dp.range(40).shuffle(buffer_size=4)
    _, merged = stop_at(loaders(pipe, 2), [3, 3])
    entry = merged["ranks"]["1"]
    node = json.loads(entry["node"])
    node["slots"][0] = node["slots"][1]  # two slots hold one item
    text = json.dumps(node, separators=(",", ":"))
    from datapipes.resume.schema import node_digest

    damaged = {
        **merged,
        "ranks": {**merged["ranks"], "1": {**entry, "node": text, "digest": node_digest(text)}},
    }
    with pytest.raises(dp.InvalidStateError, match=r'ranks\["1"\].node.slots'):
        dp.Loader(pipe, seed=5, rank=0, world_size=3).load_state_dict(damaged)


def test_fewer_remaining_files_than_consumers_are_split_into_parts(tmp_path):
    # 2 files of 100 records, 1 rank read 10: on 4 ranks the untouched file is split in 3
    # parts (what a fresh 3-consumer epoch reads of it), so no rank is left without data.
    write_id_files(tmp_path, 2, 100, step=1000)
    pipe = dp.files(str(tmp_path / "*.jsonl")).read_jsonl(block_size=256)
    single = dp.Loader(pipe, seed=5)
    it = iter(single)
    taken = [next(it)["id"] for _ in range(10)]
    state = single.state_dict()
    shares = []
    for loader in loaders(pipe, 4):
        loader.load_state_dict(state)
        shares.append([record["id"] for record in loader])
    assert sorted(len(share) for share in shares) == [33, 33, 34, 90]
    assert sorted(taken + sum(shares, [])) == list(range(100)) + list(range(1000, 1100))


# ----- repeat: rounds -------------------------------------------------------------------------


@pytest.mark.parametrize(("counts", "after"), [([17, 9], 3), ([3, 26], 1), ([0, 12], 4)])
def test_an_endless_repeat_leaves_each_started_round_whole(counts, after):
    """Consumers stand in different rounds of an endless repeat: the remaining work of every
    round up to the furthest is what no consumer delivered of it, and the new consumers
    deliver exactly that before any fresh round."""
    corpora = {0: range(10), 1: range(100, 106)}  # branch -> items (positions 0..n-1)
    pipe = dp.mix([dp.range(10).repeat(), dp.range(100, 106).repeat()], [1, 2])
    taken, merged = stop_at(loaders(pipe, 2), counts)
    ranks = [taken[: counts[0]], taken[counts[0] :]]
    _, work = remaining_work(pipe, parse_state(merged))
    got: dict[tuple[int, int], list[int]] = {}
    for place, entry in work.items():
        base, round_ = el.split_round(place)
        assert round_ is not None, place
        branch = int(base.split("/")[0])
        positions = [p for p, _ in el.expand({place: entry})[place]]
        got[(branch, round_)] = sorted(corpora[branch][p] for p in positions)
    expected: dict[tuple[int, int], list[int]] = {}
    for branch, items in corpora.items():
        shares = [list(items)[c::2] for c in range(2)]  # each rank's share of a round
        delivered = [[x for x in ranks[c] if x in items] for c in range(2)]
        rounds = [len(delivered[c]) // len(shares[c]) for c in range(2)]
        for round_ in range(min(rounds), max(rounds) + 1):
            left = []
            for c in range(2):
                if rounds[c] < round_:
                    left += shares[c]
                elif rounds[c] == round_:
                    left += shares[c][len(delivered[c]) % len(shares[c]) :]
            expected[(branch, round_)] = sorted(left)
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in expected.items() if v}

    # the new consumers read the rounds left first: their first items of each corpus are
    # exactly what was left, then every item once per fresh round
    new = loaders(pipe, after)
    for loader in new:
        loader.load_state_dict(merged)
    streams = [list(islice(iter(loader), 60)) for loader in new]
    for loader in new:
        loader.close()
    for branch, items in corpora.items():
        left = Counter(x for (b, _), xs in expected.items() if b == branch for x in xs)
        per_consumer = [[x for x in stream if x in items] for stream in streams]
        plans = [loader_plan_length(merged, pipe, after, j, branch) for j in range(after)]
        firsts = Counter(x for j, xs in enumerate(per_consumer) for x in xs[: plans[j]])
        assert firsts == left
        for j, xs in enumerate(per_consumer):  # a fresh round: no item twice within it
            fresh = xs[plans[j] :][: len(list(items)[j::after])]
            assert len(set(fresh)) == len(fresh)


def loader_plan_length(state: dict[str, Any], pipe, world: int, rank: int, branch: int) -> int:
    """How many items of ``branch`` the dealt plan of ``rank`` of ``world`` holds."""
    _, work = remaining_work(pipe, parse_state(state))
    plans = el.deal(work, world)[rank]
    return sum(
        len(el.expand({place: {"kind": "positions", "pieces": pieces}})[place])
        for place, pieces in plans.items()
        if el.split_round(place)[0].startswith(f"{branch}/")
    )


def test_a_repeat_resumes_elsewhere_with_every_round_once(tmp_path):
    """Files under a repeat, a buffer above it holding items of two rounds: 3 ranks, then 2,
    then 4; every item once per round."""
    files = write_id_files(tmp_path, 5, 6)
    pipe = dp.files(files).read_jsonl().map(get_id).repeat(3).shuffle(buffer_size=4)
    taken, merged = stop_at(loaders(pipe, 3), [13, 2, 10])
    again = loaders(pipe, 2)
    for loader in again:
        loader.load_state_dict(merged)
    taken2, merged2 = stop_at(again, [5, 9])
    rest = finish(loaders(pipe, 4), merged2)
    assert Counter(taken + taken2 + rest) == Counter({i: 3 for i in range(30)})


def rewritten_plans(state: dict[str, Any], change: Any) -> dict[str, Any]:
    """``state`` (taken after an elastic resume) with rank 0's plans changed by ``change``
    (a function of the consumers' plans), its digest made again: a hostile edit."""
    from datapipes.resume.schema import node_digest

    entry = state["ranks"]["0"]
    plans = json.loads(entry["plans"]["text"])
    plans["consumers"] = [change(plan) for plan in plans["consumers"]]
    text = json.dumps(plans, separators=(",", ":"))
    entry["plans"] = {"text": text, "digest": node_digest(text)}
    return state


def state_after_an_elastic_resume(pipe: Any, read: int = 1) -> dict[str, Any]:
    """Rank 0's state of 3 ranks, ``read`` items after a resume from 2 ranks' checkpoint."""
    taken, merged = stop_at(loaders(pipe, 2), [3, 5])
    elsewhere = dp.Loader(pipe, seed=5, rank=0, world_size=3)
    elsewhere.load_state_dict(merged)
    it = iter(elsewhere)
    for _ in range(read):
        next(it)
    state = elsewhere.state_dict()
    elsewhere.close()
    return state


def moved(plan: dict[str, Any], to: str) -> dict[str, Any]:
    """Every round of the plan's places renamed to round ``to`` (or to no round: ``""``)."""
    return {el.split_round(place)[0] + to: pieces for place, pieces in plan.items()}


@pytest.mark.parametrize(
    ("times", "to", "says"),
    [(3, "@3", "a round below 3"), (3, "", "sources"), (3, "@x", "sources")],
    ids=["round past times", "no round for a repeated source", "not a round"],
)
def test_a_hostile_round_in_saved_plans_is_refused(times, to, says):
    pipe = dp.range(40).shuffle().repeat(times)
    state = rewritten_plans(state_after_an_elastic_resume(pipe), lambda p: moved(p, to))
    with pytest.raises(dp.InvalidStateError, match=says):
        dp.Loader(pipe, seed=5, rank=0, world_size=3).load_state_dict(state)


def test_a_far_round_of_an_endless_repeat_is_reached_at_once():
    """A plan naming round 10**12 of an endless repeat: read from there (no spin through
    the rounds between)."""
    pipe = dp.range(12).repeat()
    state = rewritten_plans(
        state_after_an_elastic_resume(pipe, read=0), lambda p: moved(p, "@1000000000000")
    )
    loader = dp.Loader(pipe, seed=5, rank=0, world_size=3)
    loader.load_state_dict(state)
    got = list(islice(iter(loader), 20))  # spinning through the rounds would time out here
    assert len(got) == 20 and all(0 <= x < 12 for x in got)


def get_id(record: dict[str, Any]) -> int:
    return record["id"]


def test_a_repeat_under_dynamic_dispatch_is_refused_clearly():
    with pytest.raises(dp.ElasticResumeError, match="repeat.*dispatch='static'"):
        list(dp.Loader(dp.range(10).repeat(2), dispatch="dynamic"))


def test_states_taken_under_other_worker_counts_describe_the_same_remaining_work():
    # One checkpoint, loaded on 1 rank x 1, 2 or 3 workers (or 2 ranks), saved again before
    # reading: each describes exactly the work the checkpoint described.
    pipe = dp.range(90).shuffle().map(lambda x: x * 2).shuffle(buffer_size=6).batch(4)
    _, merged = stop_at(loaders(pipe, 3), [2, 4, 1])
    _, work = remaining_work(pipe, parse_state(merged))
    for world_size, num_workers in [(1, 1), (1, 2), (1, 3), (2, 2)]:
        group = loaders(pipe, world_size, num_workers=num_workers)
        for loader in group:
            loader.load_state_dict(merged)
        again = dp.merge_states([loader.state_dict() for loader in group])
        assert again["topology"]["num_workers"] == num_workers
        _, described = remaining_work(pipe, parse_state(again))
        assert el.expand(described) == el.expand(work), (world_size, num_workers)


@pytest.mark.parametrize(
    ("field", "bad", "where"),
    [
        ("idle", [{"epoch": 1, "ranks": [[0, 9]]}], "idle"),  # past the job's ranks
        ("idle", [{"epoch": -1, "ranks": [[2, 2]]}], "idle"),
        ("dropped", {"epoch": 0, "counts": {"batch(4, drop_last=True)": -3}}, "dropped"),
        ("plans", {"text": '{"epoch": 0, "consumers": []}', "digest": "0" * 16}, "plans"),
    ],
)
def test_damaged_elastic_fields_are_invalid_state_errors(field, bad, where):
    # A merged state's idle ranks, a rank's drop counts and plans are checked like the rest.
    pipe = dp.range(40).batch(4, drop_last=True)
    _, merged = stop_at(loaders(pipe, 3), [1, 2, 0])
    damaged = json.loads(json.dumps(merged))
    if field == "idle":
        damaged["idle"] = bad
    else:
        damaged["ranks"]["0"][field] = bad
    with pytest.raises(dp.InvalidStateError, match=where):
        dp.Loader(pipe, seed=5, rank=0, world_size=2).load_state_dict(damaged)
    with pytest.raises(dp.InvalidStateError, match=where):
        dp.merge_states([damaged])


def test_merging_with_the_recipe_works_out_the_remaining_work_once():
    # merge_states(states, pipe) keeps the remaining work in the merged state: the new ranks
    # deal exactly what they would have worked out themselves, and nothing twice.
    pipe = dp.range(70).shuffle().shuffle(buffer_size=5).batch(3)
    every = flat(list(dp.Loader(pipe, seed=5)))
    taken, merged = stop_at(loaders(pipe, 3), [2, 5, 1])
    _, work = remaining_work(pipe, parse_state(merged))
    precomputed = dp.merge_states([merged], pipe=pipe)
    assert json.loads(precomputed["remaining"]["text"])["work"] == work
    plain_deal = [loader for loader in loaders(pipe, 2)]
    quick_deal = [loader for loader in loaders(pipe, 2)]
    for slow, quick in zip(plain_deal, quick_deal):
        slow.load_state_dict(merged)
        quick.load_state_dict(precomputed)
        assert quick.state_dict() == slow.state_dict()  # the same plans
    rest = [x for loader in quick_deal for x in flat(list(loader))]
    assert Counter(flat(taken) + rest) == Counter(every)
    with pytest.raises(dp.StateMismatchError, match="different recipe"):
        dp.merge_states([merged], pipe=dp.range(70).batch(3))
    damaged = json.loads(json.dumps(precomputed))
    damaged["remaining"]["text"] = damaged["remaining"]["text"].replace('"epoch":0', '"epoch":1')
    with pytest.raises(dp.InvalidStateError, match="remaining.digest"):
        dp.Loader(pipe, seed=5, rank=0, world_size=2).load_state_dict(damaged)
