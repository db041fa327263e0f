"""Iterable datasets that split themselves: Hugging Face streaming datasets and torch
``IterableDataset``s that read ``get_worker_info()``, across ranks and workers.

Real ``datasets`` streaming over local JSONL files; real DataLoader worker processes in
the tests marked slow. Every record reaches exactly one consumer, resumes are exact.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch
from file_fixtures import write_id_files

import datapipes as dp
from datapipes.resume.schema import node_digest
from nodes import Context

datasets = pytest.importorskip("datasets")
from datasets.distributed import split_dataset_by_node  # noqa: E402


def jsonl_files(tmp_path, shards: int, per_shard: int) -> list[str]:
    return write_id_files(tmp_path, shards, per_shard, step=1000)


def streaming(files: list[str]):
    return datasets.load_dataset("json", data_files=files, split="train", streaming=True)


def every_id(files: list[str]) -> list[int]:
    return sorted(json.loads(line)["id"] for f in files for line in open(f))


def ids_of(loader) -> list[int]:
    return [record["id"] for record in loader]


def per_rank(pipe, world_size: int, num_workers: int = 0, **options) -> list[list[int]]:
    return [
        ids_of(dp.Loader(pipe, rank=r, world_size=world_size, num_workers=num_workers, **options))
        for r in range(world_size)
    ]


def per_consumer(pipe, world_size: int, num_workers: int, epoch: int = 0) -> list[list[int]]:
    """Each consumer's items, its graph built in this process (no worker processes)."""
    out = []
    for rank in range(world_size):
        for worker in range(num_workers):
            ctx = Context(rank=rank, world_size=world_size, worker_id=worker, epoch=epoch,
                          num_workers=num_workers)  # fmt: skip
            node = pipe.build(ctx)
            node.reset()
            out.append([record["id"] for record in node])
    return out


# ----- Hugging Face streaming datasets ---------------------------------------------------
@pytest.mark.parametrize("shards", [1, 2, 3, 6])
@pytest.mark.parametrize("world_size,num_workers", [(1, 2), (2, 1), (2, 3), (3, 2), (1, 3)])
def test_each_hf_record_reaches_one_consumer(tmp_path, shards, world_size, num_workers):
    # At least as many shards as consumers: whole shards; fewer: every C-th example (HF's way).
    files = jsonl_files(tmp_path, shards, 13)
    parts = per_consumer(dp.from_iterable(streaming(files)), world_size, num_workers)
    assert sorted(i for part in parts for i in part) == every_id(files)
    consumers = world_size * num_workers
    if shards >= consumers:  # dealt by shards: a consumer's records come from its own shards
        for c, part in enumerate(parts):
            assert {i // 1000 for i in part} == set(range(c, shards, consumers))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_hf_records_reach_one_rank_through_the_loader(tmp_path, world_size):
    files = jsonl_files(tmp_path, 4, 25)
    ranks = per_rank(dp.from_iterable(streaming(files)).batch(4).unbatch(), world_size)
    assert sorted(i for rank in ranks for i in rank) == every_id(files)


def test_an_hf_dataset_iterated_before_still_starts_from_its_first_record(tmp_path):
    files = jsonl_files(tmp_path, 2, 10)
    ds = streaming(files)
    assert len(list(ds)) == 20  # its own state now says "at the end"
    assert sorted(ids_of(dp.Loader(dp.from_iterable(ds)))) == every_id(files)


def test_hf_before_a_shard_is_read_whole_and_split_by_the_shard(tmp_path):
    files = jsonl_files(tmp_path, 3, 10)
    parts = per_consumer(dp.from_iterable(streaming(files)).shard(), 2, 2)
    stream = [i for part in zip(*parts) for i in part]  # shard keeps items c, c + C, ...
    assert sorted(i for part in parts for i in part) == every_id(files)
    assert stream == ids_of(dp.Loader(dp.from_iterable(streaming(files))))[: len(stream)]


def test_hf_resume_is_exact_at_random_points(tmp_path):
    files = jsonl_files(tmp_path, 3, 20)
    rng = random.Random(0)
    for world_size in (1, 2):
        pipe = dp.from_iterable(streaming(files))
        for rank in range(world_size):
            whole = ids_of(dp.Loader(pipe, rank=rank, world_size=world_size))
            for stop in sorted(rng.sample(range(len(whole) + 1), 4)):
                loader = dp.Loader(pipe, rank=rank, world_size=world_size)
                it = iter(loader)
                before = [next(it)["id"] for _ in range(stop)]
                state = json.loads(json.dumps(loader.state_dict()))  # plain data
                resumed = dp.Loader(pipe, rank=rank, world_size=world_size)
                resumed.load_state_dict(state)
                assert before + ids_of(resumed) == whole, (world_size, rank, stop)


def test_hf_example_level_split_resumes_exactly(tmp_path):
    files = jsonl_files(tmp_path, 1, 30)  # one shard, three ranks: every third example
    pipe = dp.from_iterable(streaming(files))
    whole = ids_of(dp.Loader(pipe, rank=1, world_size=3))
    assert whole == every_id(files)[1::3]
    loader = dp.Loader(pipe, rank=1, world_size=3)
    it = iter(loader)
    before = [next(it)["id"] for _ in range(4)]
    resumed = dp.Loader(pipe, rank=1, world_size=3)
    resumed.load_state_dict(loader.state_dict())
    assert before + ids_of(resumed) == whole


def test_set_epoch_reaches_an_hf_shuffle(tmp_path):
    # HF deals its shards after shuffling their order by the epoch, as split_dataset_by_node
    # does: a rank reads other shards each epoch, and the ranks still cover every record once.
    files = jsonl_files(tmp_path, 4, 10)
    shuffled = streaming(files).shuffle(seed=3, buffer_size=8)
    with pytest.warns(dp.InexactResumeWarning):
        loaders = [dp.Loader(dp.from_iterable(shuffled), rank=r, world_size=2) for r in (0, 1)]
    epochs = [[ids_of(loader) for loader in loaders] for _ in range(3)]
    for ranks in epochs:
        assert sorted(ranks[0] + ranks[1]) == every_id(files)
    assert len({tuple(ranks[0]) for ranks in epochs}) == 3  # a new order every epoch
    with pytest.warns(dp.InexactResumeWarning):
        again = dp.Loader(dp.from_iterable(shuffled), rank=0, world_size=2)
    again.set_epoch(1)
    assert ids_of(again) == epochs[1][0]  # the epoch decides the order, not the run


def test_a_dataset_split_by_node_is_taken_as_this_ranks_data(tmp_path):
    files = jsonl_files(tmp_path, 4, 10)
    ranks = [
        ids_of(
            dp.Loader(
                dp.from_iterable(split_dataset_by_node(streaming(files), r, 2)),
                rank=r,
                world_size=2,
            )
        )
        for r in range(2)
    ]
    assert sorted(ranks[0] + ranks[1]) == every_id(files)
    # Without ranks in the Loader, it is all this process has: split across its workers
    # only (HF composes the two splits into one of 4, so the ranks still cover it all once).
    parts = [
        part
        for r in range(2)
        for part in per_consumer(
            dp.from_iterable(split_dataset_by_node(streaming(files), r, 2)), 1, 2
        )
    ]
    assert sorted(i for part in parts for i in part) == every_id(files)


def test_a_dataset_split_for_another_rank_or_before_a_shard_is_refused(tmp_path):
    files = jsonl_files(tmp_path, 4, 10)
    other = split_dataset_by_node(streaming(files), 0, 2)
    with pytest.raises(ValueError, match=r"rank=0, world_size=2.*as rank 1 of 2.*without"):
        list(dp.Loader(dp.from_iterable(other), rank=1, world_size=2))
    # The case: split by node, then .shard() on two ranks read half of the data.
    with pytest.raises(ValueError, match=r"before a .shard\(\) on rank 0 of 2"):
        list(dp.Loader(dp.from_iterable(other).shard(), rank=0, world_size=2))


@pytest.mark.slow
@pytest.mark.parametrize("world_size,num_workers", [(1, 1), (1, 2), (2, 2), (3, 3), (2, 3)])
def test_hf_records_reach_one_worker_process(tmp_path, world_size, num_workers):
    files = jsonl_files(tmp_path, 4, 25)
    ranks = per_rank(dp.from_iterable(streaming(files)), world_size, num_workers)
    assert sorted(i for rank in ranks for i in rank) == every_id(files)


@pytest.mark.slow
def test_hf_then_shard_in_worker_processes_loses_nothing(tmp_path):
    # The silent half (and then none): HF split itself by torch's worker info.
    files = jsonl_files(tmp_path, 4, 50)
    ranks = per_rank(dp.from_iterable(streaming(files)).shard(), 2, 2)
    assert sorted(i for rank in ranks for i in rank) == every_id(files)


@pytest.mark.slow
@pytest.mark.parametrize("world_size,num_workers", [(1, 3), (2, 2), (3, 1)])
def test_hf_resume_in_worker_processes_is_exact(tmp_path, world_size, num_workers):
    files = jsonl_files(tmp_path, 5, 30)
    pipe = dp.from_iterable(streaming(files)).batch(4)
    rng = random.Random(world_size)

    def run(rank: int, state=None, stop=None):
        loader = dp.Loader(pipe, rank=rank, world_size=world_size, num_workers=num_workers)
        if state is not None:
            loader.load_state_dict(state)
        got = []
        for batch in loader:
            got += batch["id"].tolist()
            if stop is not None and len(got) >= stop:
                return got, loader.state_dict()
        return got, None

    everything = []
    for rank in range(world_size):
        whole, _ = run(rank)
        everything += whole
        stop = rng.randrange(1, len(whole) - 4)
        before, state = run(rank, stop=stop)
        after, _ = run(rank, state=state)
        assert before + after == whole
    assert sorted(everything) == every_id(files)


# ----- torch IterableDatasets that split themselves by get_worker_info() ------------------
class WorkerSplit(torch.utils.data.IterableDataset):
    """The torch docs' pattern: each worker reads every num_workers-th item from its id."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


class ReadsEverything(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


@pytest.mark.parametrize("world_size,num_workers", [(1, 1), (1, 3), (2, 2), (3, 1)])
def test_a_worker_aware_dataset_is_shown_its_consumer(world_size, num_workers):
    parts = per_consumer_items(dp.from_iterable(WorkerSplit(50)), world_size, num_workers)
    assert sorted(i for part in parts for i in part) == list(range(50))
    assert all(parts), "every consumer got a share"


def per_consumer_items(pipe, world_size: int, num_workers: int) -> list[list[int]]:
    out = []
    for rank in range(world_size):
        for worker in range(num_workers):
            ctx = Context(rank=rank, world_size=world_size, worker_id=worker,
                          num_workers=num_workers)  # fmt: skip
            node = pipe.build(ctx)
            node.reset()
            out.append(list(node))
    return out


def test_a_worker_aware_dataset_before_a_shard_is_read_whole():
    parts = per_consumer_items(dp.from_iterable(WorkerSplit(20)).shard(), 2, 2)
    assert sorted(i for part in parts for i in part) == list(range(20))
    assert parts[1] == list(range(1, 20, 4))  # the shard split the whole stream


def test_a_dataset_that_ignores_the_worker_info_is_refused_across_consumers():
    with pytest.raises(ValueError, match=r"ReadsEverything.*did not ask.*get_worker_info"):
        list(dp.Loader(dp.from_iterable(ReadsEverything()), rank=0, world_size=2))
    assert list(dp.Loader(dp.from_iterable(ReadsEverything()))) == list(range(10))


def test_a_worker_aware_dataset_resumes_exactly():
    pipe = dp.from_iterable(WorkerSplit(40))
    whole = list(dp.Loader(pipe, rank=1, world_size=2))
    loader = dp.Loader(pipe, rank=1, world_size=2)
    it = iter(loader)
    before = [next(it) for _ in range(7)]
    resumed = dp.Loader(pipe, rank=1, world_size=2)
    resumed.load_state_dict(loader.state_dict())
    assert before + list(resumed) == whole == list(range(1, 40, 2))


def test_the_worker_info_is_restored_after_the_dataset_started():
    loader = dp.Loader(dp.from_iterable(WorkerSplit(6)), rank=0, world_size=2)
    it = iter(loader)
    next(it)
    assert torch.utils.data.get_worker_info() is None  # the presented one was only lent
    assert list(it) == [2, 4]


@pytest.mark.slow
@pytest.mark.parametrize("world_size,num_workers", [(1, 2), (2, 3)])
def test_a_worker_aware_dataset_in_worker_processes(world_size, num_workers):
    ranks = per_rank_items(dp.from_iterable(WorkerSplit(60)), world_size, num_workers)
    assert Counter(i for rank in ranks for i in rank) == Counter(range(60))
    sharded = per_rank_items(dp.from_iterable(WorkerSplit(60)).shard(), world_size, num_workers)
    assert Counter(i for rank in sharded for i in rank) == Counter(range(60))


def per_rank_items(pipe, world_size: int, num_workers: int) -> list[list[int]]:
    return [
        list(dp.Loader(pipe, rank=r, world_size=world_size, num_workers=num_workers))
        for r in range(world_size)
    ]


@pytest.mark.slow
def test_set_epoch_reaches_an_hf_shuffle_in_worker_processes(tmp_path):
    files = jsonl_files(tmp_path, 4, 10)
    shuffled = dp.from_iterable(streaming(files).shuffle(seed=3, buffer_size=8))
    with pytest.warns(dp.InexactResumeWarning):
        loader = dp.Loader(shuffled, num_workers=2, persistent_workers=True)
    epochs = [ids_of(loader) for _ in range(3)]
    assert all(sorted(epoch) == every_id(files) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) == 3


def test_a_damaged_hf_state_is_an_invalid_state_not_a_raw_error(tmp_path):
    # The dataset's own state is opaque to us; HF applies it at the first item, where a
    # damaged one raised a bare KeyError.
    files = jsonl_files(tmp_path, 2, 10)
    loader = dp.Loader(dp.from_iterable(streaming(files)))
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    node = json.loads(state["ranks"]["0"]["node"])
    node["inner"]["examples_iterable"] = "garbage"
    text = json.dumps(node, separators=(",", ":"))
    state["ranks"]["0"].update(node=text, digest=node_digest(text))
    resumed = dp.Loader(dp.from_iterable(streaming(files)))
    resumed.load_state_dict(state)
    with pytest.raises(dp.InvalidStateError, match=r"inner.*IterableDataset.load_state_dict"):
        next(iter(resumed))
