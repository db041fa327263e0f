"""Observability of dynamic dispatch: ``python -m datapipes inspect`` on a dynamic checkpoint,
and ``Loader.stats()`` under ``dispatch="dynamic"``.

A job's ranks are Loaders in this process sharing one TCPStore (as in test_dispatch.py);
each saves its own ``Loader.state_dict()`` with ``dp.save_checkpoint``, and ``inspect`` reads
the files as a user would. Expected numbers come from the recorded claims and from the units
the library cuts (``nodes.dispatch.units_of`` over ``dispatch.dynamic.epoch_work``), and the
remaining work is checked against a real resume.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from file_fixtures import write_id_files
from helpers import dynamic_ranks, file_store

import datapipes as dp
from datapipes.inspect import load_recipe, main
from datapipes.resume.claims import epoch_work
from datapipes.resume.graph_record import decode_state
from nodes import Context
from nodes.dispatch import Dispatcher, DispatchSpec, units_of
from nodes.observe.stats import graph_stats

SEED = 3
UNIT = 64

RECIPE = """
import datapipes as dp

DATA = {data!r}


def ident(record):
    return record["id"]


shuffled = dp.range(1000).shuffle(buffer_size=8).batch(4)
plain = dp.range(1000).map(int).batch(4)
records = dp.files(DATA + "/p*.jsonl").read_jsonl().map(ident).batch(4)
two = dp.concat(dp.range(300), dp.range(1000, 1200)).batch(4)
"""

_SHARED: list[dist.TCPStore] = []


def store() -> dist.TCPStore:
    """One store for the module's jobs (each job has keys of its own in it); made once: a
    TCPStore's shutdown can take seconds."""
    if not _SHARED:
        _SHARED.append(dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False))
    return _SHARED[0]


@pytest.fixture
def recipe(tmp_path) -> Path:
    """A recipe file over 4 JSONL files of 100 records each (ids 0-399)."""
    data = tmp_path / "data"
    write_id_files(data, 4, 100, name="p{}")
    path = tmp_path / "dispatch_recipe.py"
    path.write_text(RECIPE.format(data=str(data)))
    return path


def loaders(pipe, world_size: int = 2, **options: Any) -> list[dp.Loader]:
    """The ranks of one dynamic job, in this process, sharing the module's store (with
    DataLoader workers: a file store, which forked workers reach without a server thread)."""
    shared = file_store() if options.get("num_workers") else store()
    options = {"seed": SEED, "dispatch_unit_items": UNIT, "even_batches": False, **options}
    return dynamic_ranks(pipe, world_size, shared, **options)


def save_job(tmp_path: Path, name: str, pipe, batches: list[int], **options: Any) -> list[str]:
    """Each rank takes its batches, then saves its own state (as a training job would)."""
    ranks = loaders(pipe, len(batches), **options)
    iters = [iter(loader) for loader in ranks]
    for it, count in zip(iters, batches):
        for _ in range(count):
            next(it)
    paths = []
    for rank, loader in enumerate(ranks):
        paths.append(str(tmp_path / f"{name}-rank{rank}.pt"))
        dp.save_checkpoint(loader.state_dict(), paths[-1])
        loader.close()
    return paths


def records_of(paths: list[str]) -> dict[str, dict[str, Any]]:
    """Each rank's dispatch record, as saved."""
    out = {}
    for path in paths:
        state = torch.load(path, weights_only=True)
        out.update({rank: entry["dispatch"] for rank, entry in state["ranks"].items()})
    return out


def unit_count(pipe, place: str, consumers: int, epoch: int = 0) -> int:
    """The units the library cuts from the epoch's work of the source at ``place``."""
    entry = epoch_work(pipe, Context(epoch=epoch, seed=SEED))[place]
    return len(units_of(entry["kind"], entry["pieces"], consumers, UNIT))


def runs(units: list[int]) -> str:
    """``[0-2, 5]``: the form the report writes unit indices in."""
    parts, start = [], None
    ordered = sorted(units)
    for i, unit in enumerate(ordered):
        start = unit if start is None else start
        if i + 1 == len(ordered) or ordered[i + 1] != unit + 1:
            parts.append(str(unit) if start == unit else f"{start}-{unit}")
            start = None
    return "[" + ", ".join(parts) + "]"


def inspect(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out + err


# ----- inspect: the graph built as the Loader built it ------------------------------------


def test_recipe_levels_are_the_dispatched_sources_with_their_units(recipe, tmp_path, capsys):
    pipe = load_recipe(f"{recipe}:plain")[0]
    paths = save_job(tmp_path, "plain", pipe, [20, 5])

    code, out = inspect(capsys, *paths, "--recipe", f"{recipe}:plain", "--world-size", "3")

    assert code == 0, out
    assert "! the recipe has" not in out  # built as the Loader built it: the levels match
    state = dp.merge_states([torch.load(p, weights_only=True) for p in paths])
    for rank in ("0", "1"):
        node = json.loads(state["ranks"][rank]["node"])  # map/batch: the source's own state
        claims = node["claims"]
        assert f"(dispatched source): claims={claims}; " in out
        assert f"inside unit {claims[-1]}" in out
        assert f"inner: sequence source: position={node['inner']['position']}" in out


def test_each_rank_shows_its_record_and_the_job_its_units(recipe, tmp_path, capsys):
    pipe = load_recipe(f"{recipe}:plain")[0]
    paths = save_job(tmp_path, "plain", pipe, [20, 5])
    records = records_of(paths)
    place = next(iter(records["0"]["claims"]["0"]))
    total = unit_count(pipe, place, consumers=2)  # ceil(1000 / 64)

    code, out = inspect(capsys, *paths, "--recipe", f"{recipe}:plain", "--world-size", "3")

    assert code == 0, out
    claimed = set()
    for rank in ("0", "1"):
        units = records[rank]["claims"][rank][place]
        claimed |= set(units)
        noun = "unit" if len(units) == 1 else "units"
        assert (
            f"dynamic dispatch, epoch 0, unit size {UNIT}, {total} units per source: consumer "
            f"{rank} claimed {runs(units)} ({len(units)} {noun})"
        ) in out
    # No buffer holds items: the units reached are the units claimed; the rest is whole.
    assert (
        f"dp.range(1000): {total} units, {len(claimed)} claimed; {total - len(claimed)} no "
        "consumer reached"
    ) in out
    # What remains is what three resumed ranks then deliver, each item once.
    delivered = 4 * (20 + 5)
    assert f"dp.range(1000) (positions): {1000 - delivered} items" in out
    merged = dp.merge_states([torch.load(p, weights_only=True) for p in paths])
    rest = []
    for rank in range(3):
        loader = dp.Loader(pipe, seed=SEED, rank=rank, world_size=3, even_batches=False)
        loader.load_state_dict(merged)
        rest += [int(x) for batch in loader for x in batch.tolist()]
    assert len(rest) == len(set(rest)) == 1000 - delivered


def test_json_carries_the_records_and_the_units(recipe, tmp_path, capsys):
    pipe = load_recipe(f"{recipe}:shuffled")[0]
    paths = save_job(tmp_path, "shuffled", pipe, [20, 5])
    records = records_of(paths)
    place = next(iter(records["0"]["claims"]["0"]))
    total = unit_count(pipe, place, consumers=2)

    code, out = inspect(capsys, *paths, "--recipe", f"{recipe}:shuffled", "--json")

    assert code == 0, out
    job = json.loads(out)["loader_states"][0]["job"]["dispatch"]
    for rank in ("0", "1"):
        mine = job["ranks"][rank]
        assert (mine["epoch"], mine["unit_items"], mine["consumers"]) == (0, UNIT, 2)
        assert mine["units"] == {place: total}
        assert mine["labels"] == {place: "dp.range(1000)"}
        (row,) = mine["claims"]
        assert row["consumer"] == int(rank)
        assert row["sources"][0]["units"] == records[rank]["claims"][rank][place]
        assert row["claimed"] == len(records[rank]["claims"][rank][place])
    (source,) = job["sources"]
    claimed = {u for r in ("0", "1") for u in records[r]["claims"][r][place]}
    assert source["units"] == total and source["claimed"] == len(claimed)
    # A shuffle's anchor is the epoch's start, so the replay reaches every claimed unit again.
    assert source["unreached"] == total - len(claimed)


def test_without_the_recipe_the_claims_are_shown_and_the_units_not_counted(
    recipe, tmp_path, capsys
):
    pipe = load_recipe(f"{recipe}:plain")[0]
    paths = save_job(tmp_path, "plain", pipe, [3, 1])
    records = records_of(paths)

    code, out = inspect(capsys, *paths)

    assert code == 0, out
    for rank in ("0", "1"):
        units = next(iter(records[rank]["claims"][rank].values()))
        noun = "unit" if len(units) == 1 else "units"
        line = f"dynamic dispatch, epoch 0, unit size {UNIT}: consumer {rank} claimed"
        assert f"{line} {runs(units)} ({len(units)} {noun})" in out
    assert "no consumer reached" not in out  # that needs the recipe's data
    assert "(dispatched source): claims=" in out  # the saved graph record labels the level


def test_several_sources_are_counted_apart(recipe, tmp_path, capsys):
    pipe = load_recipe(f"{recipe}:two")[0]
    paths = save_job(tmp_path, "two", pipe, [30, 10])

    code, out = inspect(capsys, *paths, "--recipe", f"{recipe}:two", "--json")

    assert code == 0, out
    job = json.loads(out)["loader_states"][0]["job"]["dispatch"]
    work = epoch_work(pipe, Context(seed=SEED))
    expected = {place: len(units_of(e["kind"], e["pieces"], 2, UNIT)) for place, e in work.items()}
    assert job["ranks"]["0"]["units"] == expected  # 5 + 4: 300 and 200 positions
    assert sorted(s["units"] for s in job["sources"]) == sorted(expected.values())
    code, out = inspect(capsys, *paths, "--recipe", f"{recipe}:two")
    assert "units per source: dp.range(1000, 1200) 4, dp.range(300) 5" in out
    assert "! the recipe has" not in out


def test_a_files_recipe_checks_the_reader_in_its_unit(recipe, tmp_path, capsys):
    pipe = load_recipe(f"{recipe}:records")[0]
    paths = save_job(tmp_path, "records", pipe, [30, 5])

    code, out = inspect(capsys, *paths, "--recipe", f"{recipe}:records", "--world-size", "3")

    assert code == 0, out
    assert "! the recipe has" not in out
    assert "(reader): " in out and "; file " in out and ".jsonl" in out  # the unit's file
    # A reader position in another part than its unit's: the recipe check says so.
    state = torch.load(paths[0], weights_only=True)
    node = json.loads(state["ranks"]["0"]["node"])
    node["inner"]["part"] = [(node["inner"]["part"][0] + 1) % 2, node["inner"]["part"][1]]
    text = json.dumps(node)
    from datapipes.resume.schema import node_digest

    state["ranks"]["0"].update(node=text, digest=node_digest(text))
    dp.save_checkpoint(state, str(tmp_path / "moved.pt"))
    code, out = inspect(capsys, str(tmp_path / "moved.pt"), "--recipe", f"{recipe}:records")
    assert code == 1
    assert "recipe check (" in out and "FAILED" in out


# ----- inspect: damaged records are problems, never tracebacks -------------------------------


def _place(record: dict[str, Any]) -> str:
    return next(iter(next(iter(record["claims"].values()))))


DAMAGE = {
    "claims not a dict": (lambda d: d.update(claims="x"), "dispatch.claims"),
    "keys missing": (lambda d: d.pop("unit_items"), "dispatch.unit_items"),
    "not a dict": (None, "dispatch"),
    "consumers 0": (lambda d: d.update(consumers=0), "dispatch.consumers"),
    "unit twice": (
        lambda d: d["claims"]["0"].update({_place(d): [0, 0]}),
        "unit 0 of epoch 0 was claimed by consumer 0 too",
    ),
    "unit out of range": (
        lambda d: d["claims"]["0"].update({_place(d): [999]}),
        "expected units in [0, 16), found 999",
    ),
    "unknown source": (
        lambda d: d["claims"]["0"].update({"nope": [1]}),
        "expected a source of the epoch's work, found 'nope'",
    ),
    "work garbage": (
        lambda d: d.update(work={_place(d): {"kind": "positions", "pieces": "zz"}}),
        "dispatch.work",
    ),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_record_is_a_problem_line(recipe, tmp_path, capsys, case):
    pipe = load_recipe(f"{recipe}:plain")[0]
    paths = save_job(tmp_path, "plain", pipe, [6, 2])
    state = torch.load(paths[0], weights_only=True)
    damage, said = DAMAGE[case]
    if damage is None:
        state["ranks"]["0"]["dispatch"] = "garbage"
    else:
        damage(state["ranks"]["0"]["dispatch"])
    bad = str(tmp_path / "bad.pt")
    dp.save_checkpoint(state, bad)

    outputs = []
    for extra in ([], ["--recipe", f"{recipe}:plain", "--world-size", "3"], ["--json"]):
        code, out = inspect(capsys, bad, paths[1], *extra)  # main() returns: no traceback
        assert code in (0, 1), out
        outputs.append((code, out))
    text, with_recipe = outputs[0][1], outputs[1][1]
    assert outputs[1][0] == 1  # the recipe cannot resume it
    assert said in with_recipe, with_recipe
    assert "Traceback" not in text + with_recipe
    if case not in ("unit out of range", "unknown source", "work garbage"):
        # what the record alone tells (no data needed): a failed state check
        assert outputs[0][0] == 1 and said in text, text
    json.loads(outputs[2][1])  # the JSON output stays JSON


# ----- Loader.stats() ------------------------------------------------------------------------


def _run_epoch(ranks: list[dp.Loader]) -> list[list[int]]:
    """Every rank's epoch, interleaved (rank 0 takes three batches to the others' one)."""
    iters = [iter(loader) for loader in ranks]
    out: list[list[int]] = [[] for _ in ranks]
    live = set(range(len(ranks)))
    while live:
        for rank in sorted(live):
            for _ in range(3 if rank == 0 else 1):
                try:
                    out[rank] += next(iters[rank]).tolist()
                except StopIteration:
                    live.discard(rank)
                    break
    return out


def _dispatch_rows(loader: dp.Loader) -> list[Any]:
    return [step for step in loader.stats().steps if step.dispatch]


def test_stats_count_each_consumers_units_and_add_up_to_the_epoch():
    pipe = dp.range(1000).map(int).batch(4)
    ranks = loaders(pipe, stats=True)
    got = _run_epoch(ranks)
    assert sorted(x for mine in got for x in mine) == list(range(1000))
    place = next(iter(epoch_work(pipe, Context(seed=SEED))))
    total = unit_count(pipe, place, consumers=2)

    counts = {}
    for rank, loader in enumerate(ranks):
        (row,) = _dispatch_rows(loader)
        assert row.step == "range(1000)"
        assert set(row.dispatch["units"]) == {str(rank)}  # each rank: its own consumer
        counts.update(row.dispatch["units"])
        assert row.dispatch["store_seconds"] >= 0
        line = next(x for x in str(loader.stats()).splitlines() if x.startswith("dynamic"))
        assert line.startswith(
            f"dynamic dispatch (range(1000)): units claimed by consumer {{{rank}: "
            f"{counts[str(rank)]}}}; "
        )
        assert line.endswith(" s claiming them from the store")
        as_dict = loader.stats().as_dict()
        assert [s["dispatch"] for s in as_dict["steps"] if s["dispatch"]] == [row.dispatch]
        json.dumps(as_dict)  # plain data
    assert sum(counts.values()) == total
    assert counts["0"] > counts["1"]  # the faster rank claimed more


def test_stats_of_two_sources_count_each_sources_own_units():
    pipe = dp.concat(dp.range(300), dp.range(1000, 1200)).batch(4)
    ranks = loaders(pipe, stats=True)
    _run_epoch(ranks)
    work = epoch_work(pipe, Context(seed=SEED))
    by_step = {"range(300)": 0, "range(1000, 1200)": 0}
    for loader in ranks:
        for row in _dispatch_rows(loader):
            by_step[row.step] += sum(row.dispatch["units"].values())
    expected = sorted(len(units_of(e["kind"], e["pieces"], 2, UNIT)) for e in work.values())
    assert sorted(by_step.values()) == expected  # not each rank's total on every source
    assert by_step["range(300)"] == 5 and by_step["range(1000, 1200)"] == 4


def test_stats_start_again_each_epoch():
    pipe = dp.range(1000).map(int).batch(4)
    ranks = loaders(pipe, stats=True)
    place = next(iter(epoch_work(pipe, Context(seed=SEED))))
    for epoch in range(2):
        _run_epoch(ranks)
        units = [sum(_dispatch_rows(lo)[0].dispatch["units"].values()) for lo in ranks]
        assert sum(units) == unit_count(pipe, place, 2, epoch)  # this epoch's, not both
    it = iter(ranks[0])  # epoch 2: one batch, from the first unit claimed
    next(it)
    (row,) = _dispatch_rows(ranks[0])
    assert row.dispatch["units"] == {"0": 1}
    first = row.dispatch["store_seconds"]
    assert first >= 0
    for loader in ranks:
        loader.close()


def test_stats_off_means_no_dispatch_rows():
    pipe = dp.range(100).batch(4)
    spec = DispatchSpec(None, "k", 0, 1, UNIT, epoch_work(pipe, Context(seed=SEED)))
    for stats in (False, True):
        ctx = Context(seed=SEED, stats=stats)
        ctx.work = Dispatcher(spec, 0, recorded={})
        rows = graph_stats(pipe.build(ctx))
        assert [("dispatch" in row) for row in rows] == ([] if not stats else [True, False])
    loader = loaders(pipe, world_size=1, stats=False)[0]
    assert len([x for batch in loader for x in batch.tolist()]) == 100
    with pytest.raises(RuntimeError, match="statistics are off"):
        loader.stats()
    state = decode_state(loader.state_dict())
    assert state["ranks"]["0"]["dispatch"]["claims"]  # the record is kept with stats off


@pytest.mark.slow
def test_stats_and_inspect_with_two_workers_list_both_workers(recipe, tmp_path, capsys):
    pipe = load_recipe(f"{recipe}:records")[0]
    ranks = loaders(pipe, stats=True, num_workers=2)
    got = _run_epoch(ranks)
    assert sorted(x for mine in got for x in mine) == list(range(400))
    total = unit_count(pipe, next(iter(epoch_work(pipe, Context(seed=SEED)))), consumers=4)
    counts: dict[str, int] = {}
    for rank, loader in enumerate(ranks):
        (row,) = _dispatch_rows(loader)
        assert row.where == "workers" and row.processes == 2
        assert set(row.dispatch["units"]) == {str(2 * rank), str(2 * rank + 1)}
        assert row.dispatch["store_seconds"] >= 0
        counts.update(row.dispatch["units"])
        loader.close()
    assert sum(counts.values()) == total

    # Snapshots every 4 batches: each worker's position is in the checkpoint. One batch a
    # transfer: the workers claim ahead only what they prefetch one by one, so rank 0's
    # 40 batches leave rank 1 its 30.
    options = {"num_workers": 2, "snapshot_every_n_steps": 4, "items_per_transfer": 1}
    paths = save_job(tmp_path, "workers", pipe, [40, 30], **options)
    records = records_of(paths)
    code, out = inspect(capsys, *paths, "--recipe", f"{recipe}:records", "--world-size", "3")
    assert code == 0, out
    assert "! the recipe has" not in out  # the workers' graphs are built dispatched too
    assert out.count("(dispatched source): claims=") == 4  # one per worker
    for rank in ("0", "1"):
        consumers = sorted(records[rank]["claims"], key=int)
        assert len(consumers) == 2
        parts = [
            f"consumer {c} claimed {runs(next(iter(records[rank]['claims'][c].values())))}"
            for c in consumers
        ]
        assert all(part in out for part in parts), (parts, out)
    no_recipe = inspect(capsys, *paths)[1]
    assert "(dispatched source)" in no_recipe  # the checkpoint's record of the workers' graph
    assert "files are done" not in no_recipe


def test_record_of_a_resumed_epoch_says_so(recipe, tmp_path, capsys):
    pipe = load_recipe(f"{recipe}:plain")[0]
    paths = save_job(tmp_path, "first", pipe, [10, 4])
    merged = dp.merge_states([torch.load(p, weights_only=True) for p in paths])
    resumed = loaders(pipe)
    for loader in resumed:
        loader.load_state_dict(copy.deepcopy(merged))
    iters = [iter(loader) for loader in resumed]
    next(iters[0])
    second = []
    for rank, loader in enumerate(resumed):
        second.append(str(tmp_path / f"second-{rank}.pt"))
        dp.save_checkpoint(loader.state_dict(), second[-1])
        loader.close()

    code, out = inspect(capsys, *second, "--recipe", f"{recipe}:plain")

    assert code == 0, out
    assert "(a resumed epoch's rest)" in out
    assert f"dp.range(1000) (positions): {1000 - 4 * 14 - 4} items" in out
