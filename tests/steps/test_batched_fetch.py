"""Batched fetch: ``from_sequence`` over an object with ``__getitems__`` reads it in chunks (one
call per batch when a batch follows) and still yields what ``seq[i]`` one by one would give,
in the same order, sharded the same way, resuming exactly."""

from __future__ import annotations

import copy
import random
from typing import Any

import numpy as np
import pytest
import torch
from helpers import assert_same, multiset
from torch.utils.data import Dataset

import datapipes as dp
from nodes import Context, default_collate, no_collate
from nodes.sources.batched_fetch import FetchBatchNode
from nodes.sources.getitems import FETCH_CHUNK
from nodes.testing import check_node

# ----- datasets ---------------------------------------------------------------------------


class Rows(Dataset):
    """A torch map-style dataset whose ``__getitems__`` gathers rows of arrays in one call and
    records the indices of every call. Rows are dicts of an int, a float vector and a str."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.ids = rng.permutation(10 * n)[:n]
        self.vectors = rng.random((n, 3), dtype=np.float32)
        self.calls: list[list[int]] = []

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"id": int(self.ids[i]), "vec": torch.from_numpy(self.vectors[i]), "tag": f"r{i}"}

    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        self.calls.append(list(indices))
        ids, vectors = self.ids[indices].tolist(), torch.from_numpy(self.vectors[indices])
        return [{"id": i, "vec": v, "tag": f"r{k}"} for i, v, k in zip(ids, vectors, indices)]


class Ints(Dataset):
    """Items ``10 * i``; ``__getitems__`` answers like ``__getitem__``, many at a time."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return 10 * i

    def __getitems__(self, indices: list[int]) -> list[int]:
        return [10 * i for i in indices]


class ShortChanging(Ints):
    """A broken ``__getitems__``: it leaves out the last index."""

    def __getitems__(self, indices: list[int]) -> list[int]:
        return [10 * i for i in indices[:-1]]


class ColumnReturning(Ints):
    """A broken ``__getitems__``: it returns a collated batch, not the list of samples."""

    def __getitems__(self, indices: list[int]) -> Any:
        return torch.tensor([10 * i for i in indices])


def one_by_one(ds: Any) -> Any:
    """The same dataset with ``__getitems__`` hidden (as DataLoader sees a falsy one): same type
    and length, so the same shuffle, but every item is read with ``ds[i]``."""
    hidden = copy.copy(ds)
    hidden.__getitems__ = None
    return hidden


def read(pipe: dp.DataPipe[Any], **kwargs: Any) -> list[Any]:
    return list(dp.Loader(pipe, seed=3, **kwargs))


def ids(items: list[Any]) -> list[int]:
    """The ``10 * i`` items of batches or single items, flattened."""
    out: list[int] = []
    for item in items:
        out.extend(item.tolist() if isinstance(item, torch.Tensor) else [item])
    return out


def plus_one(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "id": row["id"] + 1}


RECIPES = {  # the ones with a batch after the source (and maps) fetch with __getitems__
    "items": lambda s: s,
    "shuffle": lambda s: s.shuffle(),
    "batch": lambda s: s.batch(7),
    "shuffle-batch": lambda s: s.shuffle().batch(7),
    "shuffle-map-batch": lambda s: s.shuffle().map(plus_one).batch(5),
    "fused-map-batch": lambda s: s.map(plus_one).shuffle().batch(5),
    "no-collate": lambda s: s.shuffle().batch(6, collate_fn=no_collate),
    "drop-last": lambda s: s.shuffle().batch(8, drop_last=True),
    "filter-batch": lambda s: s.shuffle().filter(lambda r: r["id"] % 3).batch(4),
    "long-batch": lambda s: s.shuffle().batch(300),
}


# ----- same items, same order ---------------------------------------------------------------


@pytest.mark.parametrize("recipe", RECIPES.values(), ids=RECIPES.keys())
def test_the_items_and_their_order_are_those_of_one_by_one_reads(recipe):
    ds = Rows(203)
    for rank in range(2):
        for world_size in (1, 2) if rank == 0 else (2,):
            kwargs = {"rank": rank, "world_size": world_size}
            expected = read(recipe(dp.from_sequence(one_by_one(ds))), **kwargs)
            got = read(recipe(dp.from_sequence(ds)), **kwargs)
            assert_same(expected, got, f"rank {rank} of {world_size}")
    batched = "batch" in repr(recipe(dp.range(1))) and "filter" not in repr(recipe(dp.range(1)))
    assert bool(ds.calls) == batched, ds.calls[:2]


def test_a_batch_right_after_the_source_is_one_call_with_exactly_its_indices():
    ds = Rows(100)
    batches = read(dp.from_sequence(ds).shuffle().batch(32))
    assert [len(call) for call in ds.calls] == [32, 32, 32, 4]
    for batch, call in zip(batches, ds.calls):
        assert batch["id"].tolist() == ds.ids[call].tolist()
        assert batch["tag"] == [f"r{i}" for i in call]


def test_a_batch_after_plain_maps_sets_the_chunk_to_the_batch():
    ds = Rows(100)
    read(dp.from_sequence(ds).shuffle().map(plus_one).map(plus_one).batch(30))
    assert [len(call) for call in ds.calls] == [30, 30, 30, 10]


def test_without_a_batch_a_torch_dataset_is_read_one_item_at_a_time():
    # As DataLoader does without batches: __getitems__'s samples may be views of its
    # gather that only a batch's collation copies (sent unbatched from a worker, a view
    # crosses through shared memory, and keeps the whole gather alive).
    ds = Rows(100)
    assert_same(
        read(dp.from_sequence(one_by_one(ds)).shuffle()), read(dp.from_sequence(ds).shuffle())
    )
    read(dp.from_sequence(ds).shuffle().filter(lambda r: r["id"] % 2).batch(4))
    assert ds.calls == []


def test_without_a_batch_a_hugging_face_dataset_is_read_in_chunks():
    ds, calls = recorded_hf_dataset(3 * FETCH_CHUNK + 5)
    items = read(dp.from_sequence(ds).shuffle())
    assert [len(call) for call in calls] == [FETCH_CHUNK] * 3 + [5]
    assert [item["idx"] for item in items] == [i for call in calls for i in call]


def test_the_fetching_nodes_keep_the_node_contract():
    for pipe in (
        dp.from_sequence(recorded_hf_dataset(150)[0]).shuffle(),
        dp.from_sequence(Ints(150)).shuffle().batch(9),
        dp.from_sequence(Ints(70)).batch(8, drop_last=True),
    ):
        report = check_node(lambda ctx, pipe=pipe: pipe.build(ctx), max_positions=25)
        assert report.positions_checked > 0


def test_two_ranks_get_every_item_once_and_each_its_own_share():
    pipe = dp.from_sequence(Ints(101)).shuffle().batch(8)
    shares = [ids(read(pipe, rank=r, world_size=2)) for r in range(2)]
    assert sorted(shares[0] + shares[1]) == [10 * i for i in range(101)]
    reference = dp.from_sequence(one_by_one(Ints(101))).shuffle().batch(8)
    assert shares == [ids(read(reference, rank=r, world_size=2)) for r in range(2)]


# ----- resume -------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "batch"), [("hf", None), ("hf", 6), ("torch", 6)])
def test_a_checkpoint_mid_chunk_resumes_at_the_next_item(kind, batch):
    rng = random.Random(7)
    ds, calls = recorded_hf_dataset(250) if kind == "hf" else (Rows(250), None)
    calls = ds.calls if calls is None else calls
    pipe = dp.from_sequence(ds).shuffle()
    pipe = pipe if batch is None else pipe.batch(batch)
    reference = read(dp.from_sequence(one_by_one(ds)).shuffle().batch(batch or 1))
    count = len(reference) if batch else 250
    for k in sorted(rng.sample(range(1, count), 6)) + [count]:
        loader = dp.Loader(pipe, seed=3)
        it = iter(loader)
        taken = [next(it) for _ in range(k)]
        state = loader.state_dict()
        loader.close()
        resumed = dp.Loader(pipe, seed=3)
        resumed.load_state_dict(state)
        calls.clear()
        rest = list(resumed)
        got = taken + rest
        if batch is None:
            got = default_collate_each(got)
        assert_same(reference, got, f"resumed after {k}")
        if rest:  # the first fetch after the resume starts at the next item, not the chunk's
            first = rest[0] if batch is None else default_collate(rest[0:1])
            if kind == "hf":
                assert calls[0][0] == int(torch.as_tensor(first["idx"]).reshape(-1)[0])
            else:
                assert int(ds.ids[calls[0][0]]) == int(first["id"].reshape(-1)[0])


def default_collate_each(items: list[Any]) -> list[Any]:
    return [default_collate([item]) for item in items]


def test_a_batch_starts_where_the_reset_puts_the_source():
    # A state taken item by item (mid-batch for the batch above) puts the batch's first
    # fetch right there: it fetches from the position on.
    ds = Rows(90)
    pipe = dp.from_sequence(ds).shuffle()
    batched = pipe.batch(10)
    expected_order = [row["id"] for row in read(dp.from_sequence(one_by_one(ds)).shuffle())]
    for position in (0, 3, 17, 89, 90):
        node = batched.build(Context(seed=3))
        assert isinstance(node, FetchBatchNode)
        node.reset({"position": position})
        got = [i for batch in node for i in batch["id"].tolist()]
        assert got == expected_order[position:]
        assert node.state_dict() == {"position": 90}


def test_resumes_across_the_blocks_of_a_large_permutation():
    # Over 65,536 items the permutation is computed in blocks; resumes land around their
    # edges (16,384 indices at a time when fetching, 4,096 one by one).
    n = 70_001
    pipe = dp.from_sequence(Ints(n)).shuffle().batch(1000)
    reference = dp.from_sequence(one_by_one(Ints(n))).shuffle()
    for rank in range(2):
        one = reference.build(Context(rank=rank, world_size=2, seed=3))
        one.reset()
        expected = list(one)
        for position in (0, 4095, 16383, 16384, 16385, 32769, len(expected) - 1):
            node = pipe.build(Context(rank=rank, world_size=2, seed=3))
            node.reset({"position": position})
            assert ids(list(node)) == expected[position:], (rank, position)
    whole = pipe.build(Context(seed=3))
    whole.reset()
    assert sorted(ids(list(whole))) == [10 * i for i in range(n)]


@pytest.mark.parametrize(("before", "counts", "after"), [(2, [3, 5], 3), (3, [4, 0, 7], 2)])
def test_an_elastic_resume_on_another_world_size_reads_every_item_once(before, counts, after):
    pipe = dp.from_sequence(Ints(157)).shuffle().batch(4)
    group = [dp.Loader(pipe, seed=5, rank=r, world_size=before) for r in range(before)]
    taken: list[Any] = []
    for loader, count in zip(group, counts):
        it = iter(loader)
        taken.extend(next(it) for _ in range(count))
    merged = dp.merge_states([loader.state_dict() for loader in group])
    rest: list[Any] = []
    for rank in range(after):
        loader = dp.Loader(pipe, seed=5, rank=rank, world_size=after)
        loader.load_state_dict(merged)
        rest.extend(loader)
    assert multiset(ids(taken) + ids(rest)) == multiset([10 * i for i in range(157)])


# ----- broken __getitems__ ------------------------------------------------------------------


def test_a_getitems_returning_too_few_items_is_a_clear_error():
    with pytest.raises(ValueError, match=r"ShortChanging.__getitems__ returned 4 items for 5"):
        read(dp.from_sequence(ShortChanging(20)).batch(5))
    with pytest.raises(ValueError, match=r"exactly one sample per index"):
        read(dp.from_sequence(ShortChanging(20)).shuffle().map(abs).batch(5))


def test_a_getitems_returning_a_collated_batch_is_a_clear_error():
    with pytest.raises(TypeError, match=r"returned a Tensor.*must return a list"):
        read(dp.from_sequence(ColumnReturning(20)).shuffle().batch(5))


# ----- Hugging Face datasets ------------------------------------------------------------------


def hf_dataset(n: int, fmt: str | None) -> Any:
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(1)
    ds = datasets.Dataset.from_dict(
        {
            "label": rng.integers(0, 100, n),
            "vec": rng.random((n, 4), dtype=np.float32),
            "text": [f"t{i}" for i in range(n)],
        }
    )
    return ds if fmt is None else ds.with_format(fmt)


class Recorder:
    """An HF transform that notes the ``idx`` column of every batch it formats."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, Any]:
        self.calls.append(list(batch["idx"]))
        return {"idx": batch["idx"], "vec": torch.tensor(batch["vec"])}


def recorded_hf_dataset(n: int) -> tuple[Any, list[list[int]]]:
    """An HF dataset of rows ``{"idx": i, "vec": tensor}`` and the indices of every read."""
    datasets = pytest.importorskip("datasets")
    vectors = np.random.default_rng(2).random((n, 3), dtype=np.float32)
    recorder = Recorder()
    ds = datasets.Dataset.from_dict({"idx": list(range(n)), "vec": vectors})
    return ds.with_transform(recorder), recorder.calls


HF_RECIPES = {
    "shuffle": lambda s: s.shuffle(),
    "shuffle-batch": lambda s: s.shuffle().batch(16),
    "batch-ragged-end": lambda s: s.batch(25),
    "fused-map-batch": lambda s: s.map(lambda r: {**r, "label": r["label"] * 2}).shuffle().batch(8),
    "drop-last": lambda s: s.shuffle().batch(32, drop_last=True),
}


@pytest.mark.parametrize("fmt", [None, "torch", "numpy"])
@pytest.mark.parametrize("recipe", HF_RECIPES.values(), ids=HF_RECIPES.keys())
def test_a_hugging_face_dataset_gives_what_it_gives_one_row_at_a_time(fmt, recipe):
    ds = hf_dataset(110, fmt)
    for rank, world_size in ((0, 1), (1, 2)):
        kwargs = {"rank": rank, "world_size": world_size}
        expected = read(recipe(dp.from_sequence(one_by_one(ds))), **kwargs)
        got = read(recipe(dp.from_sequence(ds)), **kwargs)
        assert_same(expected, got, f"format {fmt}, rank {rank} of {world_size}")


def test_a_torch_format_batch_holds_stacked_tensors_and_the_strings():
    ds = hf_dataset(40, "torch")
    batch = read(dp.from_sequence(ds).batch(40))[0]
    assert batch["vec"].shape == (40, 4) and batch["vec"].dtype == torch.float32
    assert batch["label"].dtype == torch.int64 and batch["text"][:2] == ["t0", "t1"]
    batch["vec"].zero_()  # a batch is the caller's: writing it leaves the dataset alone
    assert float(ds[0]["vec"].abs().sum()) > 0


@pytest.mark.parametrize(
    "recipe", [lambda s: s.shuffle(), lambda s: s.batch(8, collate_fn=no_collate)]
)
def test_hugging_face_rows_own_their_tensors(recipe):
    # As ds[i] gives them: a view of the chunk would keep it all alive, and would cross from
    # a worker through shared memory instead of inside the pickle.
    out = read(recipe(dp.from_sequence(hf_dataset(50, "torch"))))
    rows = [row for item in out for row in (item if isinstance(item, list) else [item])]
    assert len(rows) == 50
    for row in rows:
        for value in (row["vec"], row["label"]):
            assert value.untyped_storage().nbytes() == value.nbytes, value


def test_a_format_without_dict_columns_falls_back_to_getitems():
    # A pandas-format batch is a DataFrame: each batch is collated from __getitems__'s rows,
    # and rows are read one by one (a row is a DataFrame of one row).
    ds = hf_dataset(30, "pandas")
    rows = read(dp.from_sequence(ds).shuffle())
    assert_same(
        [row.to_dict("list") for row in read(dp.from_sequence(one_by_one(ds)).shuffle())],
        [row.to_dict("list") for row in rows],
    )
    got = read(dp.from_sequence(ds).batch(10))
    expected = [default_collate(ds.__getitems__(list(range(k, k + 10)))) for k in (0, 10, 20)]
    assert_same(expected, got)


def test_ragged_hugging_face_rows_fail_as_they_do_one_by_one():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"seq": [[1, 2], [3], [4, 5, 6]]}).with_format("torch")
    with pytest.raises(ValueError, match="shape") as one:
        read(dp.from_sequence(one_by_one(ds)).batch(3))
    with pytest.raises(ValueError, match="shape") as batched:
        read(dp.from_sequence(ds).batch(3))
    assert str(batched.value) == str(one.value)


# ----- DataLoader workers ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [None, "torch"])
def test_workers_fetch_in_batches_and_resume_exactly(fmt):
    ds = hf_dataset(300, fmt)
    pipe = dp.from_sequence(ds).shuffle().batch(16)
    expected = read(dp.from_sequence(one_by_one(ds)).shuffle().batch(16), num_workers=2)
    got = read(pipe, num_workers=2)
    assert_same(expected, got)
    loader = dp.Loader(pipe, seed=3, num_workers=2)
    it = iter(loader)
    taken = [next(it) for _ in range(7)]
    state = loader.state_dict()
    loader.close()
    resumed = dp.Loader(pipe, seed=3, num_workers=2)
    resumed.load_state_dict(state)
    assert_same(expected, taken + list(resumed))


@pytest.mark.slow
def test_an_elastic_resume_from_workers_reads_every_row_once():
    ds = hf_dataset(400, "torch")
    pipe = dp.from_sequence(ds).shuffle().batch(8)
    group = [dp.Loader(pipe, seed=5, rank=r, world_size=2, num_workers=2) for r in range(2)]
    taken: list[Any] = []
    for loader, count in zip(group, (9, 4)):  # past the workers' first snapshot
        it = iter(loader)
        taken.extend(next(it) for _ in range(count))
    merged = dp.merge_states([loader.state_dict() for loader in group])
    for loader in group:
        loader.close()
    rest: list[Any] = []
    for rank in range(3):
        loader = dp.Loader(pipe, seed=5, rank=rank, world_size=3, num_workers=1)
        loader.load_state_dict(merged)
        rest.extend(loader)
    texts = [text for batch in taken + rest for text in batch["text"]]
    assert sorted(texts) == sorted(f"t{i}" for i in range(400))
