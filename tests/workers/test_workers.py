"""Worker processes and ranks: sharding, even epochs and exact resume with real workers.

Every test here runs real DataLoader worker processes (``Loader(num_workers=N)``,
torch's ``DataLoader`` and torchdata's ``StatefulDataLoader`` over
``as_torch_dataset()``). Ranks are simulated: one Loader per rank with explicit
``rank=`` and ``world_size=``. A consumer is one (rank, worker) pair.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_same, canon, multiset
from torch.utils.data import DataLoader, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

import datapipes as dp
from nodes.testing import same

pytestmark = pytest.mark.slow  # every test starts DataLoader worker processes

# ----- data -----------------------------------------------------------------------------------

RANGE_N = 37
# Very different line counts, one empty file and one with a single line: with up to 7
# consumers files are dealt whole (unevenly), with more they are split inside files.
FILE_SIZES = [40, 0, 1, 13, 6, 27, 3]


def dict_records(n: int = 23) -> list[dict[str, Any]]:
    return [{"id": i, "name": f"item-{i}", "tags": f"{i % 3},{i % 5}"} for i in range(n)]


def string_records(n: int = 29) -> list[str]:
    return [f"line {i} " + "ü" * (i % 4) for i in range(n)]


def jsonl_records(index: int, n: int) -> list[dict[str, Any]]:
    return [{"f": index, "j": j, "pad": "x" * ((7 * index + 3 * j) % 11)} for j in range(n)]


@pytest.fixture(scope="module")
def jsonl_files(tmp_path_factory) -> tuple[list[str], list[dict[str, Any]]]:
    """7 JSONL files of uneven sizes; the URLs and every record in file order."""
    folder: Path = tmp_path_factory.mktemp("jsonl")
    urls, records = [], []
    for index, n in enumerate(FILE_SIZES):
        rows = jsonl_records(index, n)
        path = folder / f"part-{index:02d}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        urls.append(str(path))
        records += rows
    assert len(records) == sum(FILE_SIZES)
    return urls, records


def source(name: str, files: tuple[list[str], list[dict[str, Any]]]) -> tuple[Any, list[Any]]:
    """``(pipe, dataset)`` for a source name."""
    if name == "range":
        return dp.range(RANGE_N), list(range(RANGE_N))
    if name == "dicts":
        data = dict_records()
        return dp.from_sequence(data), data
    if name == "strings":
        data = string_records()
        return dp.from_sequence(data), data
    if name == "files":
        urls, records = files
        return dp.files(urls).read_jsonl(), records
    if name == "iterable":  # cannot shard itself: shard() splits the stream
        return dp.from_iterable(iterable_items).shard(), list(iterable_items())
    raise AssertionError(name)


def iterable_items() -> Iterator[str]:
    return (f"s{i}" for i in range(31))


# ----- comparing records ----------------------------------------------------------------------


def plain(value: Any) -> Any:
    """Tensors as lists, so records compare and hash the same however they were produced."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def rows(batch: Any) -> list[Any]:
    """The records a collated batch was made of (tensor, list, or dict of those)."""
    if isinstance(batch, torch.Tensor):
        return batch.tolist()
    if isinstance(batch, dict):
        columns = {k: rows(v) for k, v in batch.items()}
        sizes = {len(c) for c in columns.values()}
        assert len(sizes) == 1, sizes
        return [dict(zip(columns, values)) for values in zip(*columns.values())]
    if isinstance(batch, list):
        return [plain(v) for v in batch]
    raise AssertionError(f"not a batch: {batch!r}")


def assert_exactly_once(got: list[Any], dataset: list[Any], what: str) -> None:
    expected, found = multiset(dataset), multiset(got)
    missing, extra = expected - found, found - expected
    assert not missing and not extra, (
        f"{what}: {sum(missing.values())} records missing, {sum(extra.values())} extra or "
        f"repeated (of {len(dataset)})"
    )


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` through json, then through torch.save / torch.load(weights_only=True)."""
    state = json.loads(json.dumps(state))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def worker_tag(record: dict[str, Any]) -> dict[str, Any]:
    """The record with the id of the DataLoader worker that produced it (-1: main process)."""
    info = get_worker_info()
    return {**record, "worker": -1 if info is None else info.id}


def first_items(iterable: Any, count: int) -> tuple[Iterator[Any], list[Any]]:
    it = iter(iterable)
    return it, [next(it) for _ in range(count)]


# ----- 1. sharding over ranks x workers -------------------------------------------------------

ALL_TOPOLOGIES = [(w, r) for w in range(5) for r in (1, 2, 3)]  # (num_workers, world_size)


def _matrix(sources_and_topologies: list[tuple[list[str], list[tuple[int, int]]]]) -> list[Any]:
    return [
        pytest.param(name, nw, ws, id=f"{name}-w{nw}-r{ws}")
        for names, topologies in sources_and_topologies
        for name in names
        for nw, ws in topologies
    ]


# The full matrix for dp.range; for the others ranks only, workers only, both, and (files)
# 12 consumers, more than the 7 files, so files are split inside.
SHARDING_MATRIX = _matrix(
    [
        (["range"], ALL_TOPOLOGIES),
        (["dicts"], [(1, 2), (3, 3)]),
        (["strings"], [(2, 1), (4, 2)]),
        (["files"], [(0, 3), (2, 2), (4, 3)]),
        (["iterable"], [(2, 2)]),
    ]
)


@pytest.mark.parametrize(("name", "num_workers", "world_size"), SHARDING_MATRIX)
def test_ranks_and_workers_read_every_item_exactly_once(
    jsonl_files, name: str, num_workers: int, world_size: int
):
    pipe, dataset = source(name, jsonl_files)
    got: list[Any] = []
    for rank in range(world_size):
        loader = dp.Loader(pipe, rank=rank, world_size=world_size, num_workers=num_workers)
        share = list(loader)
        if name != "files":  # every consumer has items (files: some may get only empty ones)
            assert share, f"rank {rank} got nothing"
        got += share
    assert_exactly_once(got, dataset, f"{world_size} ranks x {num_workers} workers")


UNEVEN_MESSAGE = re.compile(
    r"rank (\d+) dropped its last (\d+) item\(s\) of epoch (\d+) so that every rank yields (\d+)"
)

EVEN_MATRIX = _matrix(
    [
        (["range"], [(0, 3), (1, 2), (2, 2), (3, 3), (4, 2)]),
        (["files"], [(0, 2), (2, 3), (3, 2)]),
        (["dicts"], [(1, 3)]),
        (["strings"], [(2, 2)]),
    ]
)


@pytest.mark.parametrize(("name", "num_workers", "world_size"), EVEN_MATRIX)
def test_even_batches_gives_every_rank_as_many_batches(
    jsonl_files, name: str, num_workers: int, world_size: int
):
    """Each rank's even epoch is the start of its uneven one; the warning counts the rest."""
    base, dataset = source(name, jsonl_files)
    pipe = base.batch(4)
    uneven, even, dropped_by_warning = [], [], []
    for rank in range(world_size):
        kwargs = dict(rank=rank, world_size=world_size, num_workers=num_workers)
        uneven.append(list(dp.Loader(pipe, even_batches=False, **kwargs)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            even.append(list(dp.Loader(pipe, even_batches=True, **kwargs)))
        messages = [str(w.message) for w in caught if issubclass(w.category, dp.UnevenDataWarning)]
        assert len(messages) <= 1, messages
        dropped_by_warning.append(messages[0] if messages else None)

    assert_exactly_once(
        [r for share in uneven for b in share for r in rows(b)], dataset, "without even_batches"
    )
    fewest = min(len(share) for share in uneven)
    assert [len(share) for share in even] == [fewest] * world_size
    missing_records = multiset(dataset) - multiset([r for s in even for b in s for r in rows(b)])
    dropped_records: list[Any] = []
    for rank in range(world_size):
        assert_same(uneven[rank][:fewest], even[rank], f"rank {rank} even epoch")
        extra = len(uneven[rank]) - fewest
        message = dropped_by_warning[rank]
        if extra == 0:
            assert message is None, f"rank {rank} dropped nothing but warned: {message}"
            continue
        assert message is not None, f"rank {rank} dropped {extra} batches without a warning"
        match = UNEVEN_MESSAGE.search(message)
        assert match, message
        assert [int(g) for g in match.groups()] == [rank, extra, 0, fewest], message
        dropped_records += [r for b in uneven[rank][fewest:] for r in rows(b)]
    assert sum(missing_records.values()) == len(dropped_records)
    assert missing_records == multiset(dropped_records)
    if world_size * max(num_workers, 1) > 1 and len({len(s) for s in uneven}) > 1:
        assert missing_records, "uneven ranks but nothing dropped"


# ----- 2. exact resume through Loader(num_workers=N) ------------------------------------------


def resume_recipe(name: str, files: tuple[list[str], list[dict[str, Any]]]) -> Any:
    urls, _ = files
    if name == "files":
        return dp.files(urls).read_jsonl().map(worker_tag).batch(3)
    if name == "files_shuffled":
        return dp.files(urls).shuffle().read_jsonl().map(worker_tag).shuffle(buffer_size=7).batch(3)
    if name == "range_shuffled":
        return dp.range(61).shuffle().map(_tag_int).batch(4)
    raise AssertionError(name)


def _tag_int(x: int) -> dict[str, int]:
    return worker_tag({"x": x})


def untag(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "worker"}


def batch_workers(batches: list[dict[str, Any]]) -> list[int]:
    """The worker that produced each batch (a batch never mixes workers)."""
    out = []
    for b in batches:
        ids = set(b["worker"].tolist())
        assert len(ids) == 1, ids
        out.append(ids.pop())
    return out


def position_after_a_worker_ran_out(epoch: list[Any], num_workers: int) -> int | None:
    """A position one full round of workers after the last batch of the first worker to end.

    By then the main process has asked the exhausted worker again and found it empty.
    ``None`` when no worker runs out well before the end of the epoch.
    """
    workers = batch_workers(epoch)
    counts = Counter(workers)
    assert len(counts) == num_workers, counts
    first_out = min(counts, key=lambda w: (counts[w], w))
    last = max(i for i, w in enumerate(workers) if w == first_out)
    position = last + num_workers
    return position if position < len(epoch) - 1 else None


@pytest.mark.parametrize(
    ("recipe", "num_workers"),
    [
        ("files_shuffled", 1),
        ("files_shuffled", 2),
        ("files", 3),  # unshuffled: the same uneven deal of files every epoch
        ("range_shuffled", 3),
    ],
)
def test_loader_resumes_exactly_with_workers(jsonl_files, recipe: str, num_workers: int):
    """Resume at 0, two random batches, after a worker ran out (files), and at the end."""
    pipe = resume_recipe(recipe, jsonl_files)
    seed = 11
    if recipe == "files_shuffled" and num_workers > 1:
        # The file order depends on the files' paths (under tmp_path): pick a seed whose
        # order has a worker run out well before the end.
        while seed < 40:
            epoch = list(dp.Loader(pipe, seed=seed, num_workers=num_workers))
            if position_after_a_worker_ran_out(epoch, num_workers) is not None:
                break
            seed += 1
    reference = dp.Loader(pipe, seed=seed, num_workers=num_workers)
    epoch0, epoch1 = list(reference), list(reference)
    untagged = [untag(r) for b in epoch0 for r in rows(b)]
    if recipe == "range_shuffled":
        assert sorted(r["x"] for r in untagged) == list(range(61))
    else:
        assert_exactly_once(untagged, jsonl_files[1], "reference epoch")
    if recipe != "files":
        assert not all(same(a, b) for a, b in zip(epoch0, epoch1)), "shuffle did not reshuffle"
    n = len(epoch0)
    mid, other = random.Random(num_workers).sample(range(1, n), 2)
    positions = {0, mid, other, n}
    if recipe.startswith("files") and num_workers > 1:
        ran_out = position_after_a_worker_ran_out(epoch0, num_workers)
        assert ran_out is not None, "test data: no worker runs out well before the end"
        positions.add(ran_out)
    for position in sorted(positions):
        with dp.Loader(pipe, seed=seed, num_workers=num_workers) as loader:
            _, first = first_items(loader, position)
            state = roundtrip(loader.state_dict())
        assert state["topology"] == {
            "world_size": 1,
            "num_workers": num_workers,
            "even_batches": False,
            **({"items_per_transfer": "auto"} if num_workers else {}),
        }
        assert list(state["ranks"]) == ["0"]
        resumed = dp.Loader(pipe, seed=seed, num_workers=num_workers)
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert_same(epoch0, first + rest, f"resumed at batch {position} of {n}")
        if position in (mid, n):  # the epoch after a resumed one
            assert_same(epoch1, list(resumed), f"epoch 1 after resume at {position}")


def test_a_resumed_loader_can_be_checkpointed_and_resumed_again(jsonl_files):
    num_workers = 2
    pipe = resume_recipe("files_shuffled", jsonl_files)
    epoch0 = list(dp.Loader(pipe, seed=3, num_workers=num_workers))
    first_stop, second_stop = len(epoch0) // 4, len(epoch0) // 2
    with dp.Loader(pipe, seed=3, num_workers=num_workers) as loader:
        _, first = first_items(loader, first_stop)
        state = roundtrip(loader.state_dict())
    with dp.Loader(pipe, seed=3, num_workers=num_workers) as loader:
        loader.load_state_dict(state)
        assert roundtrip(loader.state_dict()) == state  # loaded, not iterated: same position
        _, middle = first_items(loader, second_stop - first_stop)
        state = roundtrip(loader.state_dict())
    last = dp.Loader(pipe, seed=3, num_workers=num_workers)
    last.load_state_dict(state)
    assert_same(epoch0, first + middle + list(last), "resumed twice")


def test_loader_resumes_in_a_later_epoch_with_workers(jsonl_files):
    """A checkpoint in epoch 1 resumes epoch 1 (not 0) and continues with epoch 2."""
    pipe = resume_recipe("files_shuffled", jsonl_files)
    reference = dp.Loader(pipe, seed=5, num_workers=2)
    epochs = [list(reference) for _ in range(3)]
    loader = dp.Loader(pipe, seed=5, num_workers=2)
    list(loader)
    between = roundtrip(loader.state_dict())  # epoch 0 done, epoch 1 not started
    assert between["ranks"]["0"]["epoch"] == 1
    resumed = dp.Loader(pipe, seed=5, num_workers=2)
    resumed.load_state_dict(between)
    assert_same(epochs[1], list(resumed), "epoch 1 from a checkpoint between epochs")
    _, first = first_items(loader, 7)
    state = roundtrip(loader.state_dict())
    loader.close()
    assert state["ranks"]["0"]["epoch"] == 1
    resumed = dp.Loader(pipe, seed=5, num_workers=2)
    resumed.load_state_dict(state)
    assert_same(epochs[1], first + list(resumed), "epoch 1 resumed")
    assert_same(epochs[2], list(resumed), "epoch 2 after the resumed epoch")


def test_loader_with_workers_and_even_batches_resumes_exactly(jsonl_files):
    urls, _ = jsonl_files
    pipe = dp.files(urls).shuffle().read_jsonl().batch(2)
    kwargs = dict(seed=2, rank=1, world_size=2, num_workers=2, even_batches=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dp.UnevenDataWarning)
        epoch0 = list(dp.Loader(pipe, **kwargs))
        for position in (1, len(epoch0) - 1):
            with dp.Loader(pipe, **kwargs) as loader:
                _, first = first_items(loader, position)
                state = roundtrip(loader.state_dict())
            resumed = dp.Loader(pipe, **kwargs)
            resumed.load_state_dict(state)
            assert_same(epoch0, first + list(resumed), f"even, resumed at {position}")


# ----- 3. exact resume through torchdata's StatefulDataLoader over as_torch_dataset() ---------


def stateful_loader(pipe: Any, num_workers: int, epoch: int = 0) -> tuple[Any, Any]:
    dataset = pipe.as_torch_dataset(seed=4)
    dataset.set_epoch(epoch)
    return dataset, StatefulDataLoader(dataset, batch_size=None, num_workers=num_workers)


@pytest.mark.parametrize(
    ("recipe", "num_workers"),
    [("files_shuffled", 1), ("range_shuffled", 2), ("files_shuffled", 3)],
)
def test_stateful_dataloader_resumes_exactly(jsonl_files, recipe: str, num_workers: int):
    pipe = resume_recipe(recipe, jsonl_files)
    dataset, loader = stateful_loader(pipe, num_workers)
    epoch0 = list(loader)
    dataset.set_epoch(1)
    epoch1 = list(loader)
    assert multiset([untag(r) for b in epoch0 for r in rows(b)]) == multiset(
        [untag(r) for b in epoch1 for r in rows(b)]
    )
    assert not all(same(a, b) for a, b in zip(epoch0, epoch1))
    n = len(epoch0)
    mid = random.Random(100 + num_workers).randrange(1, n)
    for position in sorted({0, mid, n}):
        _, loader = stateful_loader(pipe, num_workers)
        it, first = first_items(loader, position)
        state = roundtrip(loader.state_dict())
        del it
        dataset, resumed = stateful_loader(pipe, num_workers)
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert_same(epoch0, first + rest, f"resumed at batch {position} of {n}")
        if position == mid:
            dataset.set_epoch(1)
            assert_same(epoch1, list(resumed), "epoch 1 after the resumed epoch")


def test_stateful_dataloader_resumes_in_a_later_epoch(jsonl_files):
    """A state from epoch 1 resumes epoch 1 in a new dataset, with or without set_epoch(1)."""
    pipe = resume_recipe("files_shuffled", jsonl_files)
    dataset, loader = stateful_loader(pipe, 2)
    epochs = []
    for epoch in (0, 1, 2):
        dataset.set_epoch(epoch)
        epochs.append(list(loader))
    _, loader = stateful_loader(pipe, 2, epoch=1)
    _, first = first_items(loader, 5)
    state = roundtrip(loader.state_dict())
    for set_epoch_again in (False, True):  # a training loop calls set_epoch(1) after loading
        dataset, resumed = stateful_loader(pipe, 2)
        resumed.load_state_dict(state)
        if set_epoch_again:
            dataset.set_epoch(1)
        assert_same(epochs[1], first + list(resumed), f"set_epoch: {set_epoch_again}")
        if not set_epoch_again:
            dataset.set_epoch(2)
            assert_same(epochs[2], list(resumed), "epoch 2 after the resumed epoch")


# ----- 4. as_torch_dataset under torch's plain DataLoader -------------------------------------


def plain_loader(dataset: Any, num_workers: int) -> list[Any]:
    return list(DataLoader(dataset, batch_size=None, num_workers=num_workers))


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.parametrize("name", ["range", "files"])
def test_torch_dataloader_reads_every_item_once(jsonl_files, name: str, num_workers: int):
    pipe, dataset = source(name, jsonl_files)
    got = plain_loader(pipe.as_torch_dataset(), num_workers)
    assert_exactly_once(got, dataset, f"DataLoader with {num_workers} workers")


@pytest.mark.parametrize(("num_workers", "world_size"), [(0, 2), (1, 3), (2, 2), (3, 3)])
@pytest.mark.parametrize("name", ["range", "files"])
def test_torch_dataloader_ranks_get_disjoint_shares_that_cover_the_data(
    jsonl_files, name: str, num_workers: int, world_size: int
):
    pipe, dataset = source(name, jsonl_files)
    shares = [
        plain_loader(pipe.as_torch_dataset(rank=rank, world_size=world_size), num_workers)
        for rank in range(world_size)
    ]
    for a in range(world_size):
        for b in range(a + 1, world_size):
            common = multiset(shares[a]) & multiset(shares[b])
            assert not common, f"ranks {a} and {b} share {sum(common.values())} items"
    assert_exactly_once([r for s in shares for r in s], dataset, f"{world_size} ranks")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_dataloader_set_epoch_picks_the_shuffle(jsonl_files, num_workers: int):
    urls, records = jsonl_files
    pipes = [dp.range(50).shuffle(), dp.files(urls).shuffle().read_jsonl().shuffle(buffer_size=9)]
    for pipe, dataset in zip(pipes, [list(range(50)), records]):
        ds = pipe.as_torch_dataset(seed=1)
        runs = {}
        for epoch in (0, 1, 0, 1):
            ds.set_epoch(epoch)
            got = plain_loader(ds, num_workers)
            assert_exactly_once(got, dataset, f"epoch {epoch}")
            if epoch in runs:
                assert [canon(r) for r in got] == runs[epoch], f"epoch {epoch} rerun differs"
            runs[epoch] = [canon(r) for r in got]
        assert runs[0] != runs[1], "set_epoch did not change the shuffle"
        other = pipe.as_torch_dataset(seed=1)
        other.set_epoch(1)
        assert [canon(r) for r in plain_loader(other, num_workers)] == runs[1]


@pytest.mark.parametrize("name", ["range", "files"])
def test_torch_dataloader_persistent_workers_advance_the_epoch(jsonl_files, name: str):
    """Without set_epoch, each pass over persistent workers is the next epoch."""
    base, dataset = source(name, jsonl_files)
    pipe = base.shuffle() if name == "range" else base.shuffle(buffer_size=9)
    ds = pipe.as_torch_dataset(seed=2)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    records = [list(loader) for _ in range(2)]
    passes = [[canon(r) for r in got] for got in records]
    expected = []
    for epoch in (0, 1):
        fresh = pipe.as_torch_dataset(seed=2)
        fresh.set_epoch(epoch)
        expected.append([canon(r) for r in plain_loader(fresh, 2)])
    for epoch in (0, 1):
        assert_exactly_once(records[epoch], dataset, f"pass {epoch}")
    assert passes == expected
    assert passes[0] != passes[1]


# ----- 5. a checkpoint from another topology --------------------------------------------------


@pytest.mark.parametrize(
    ("num_workers", "world_size"),
    [(1, 1), (3, 1), (0, 1), (2, 2)],
    ids=["1-worker", "3-workers", "no-workers", "2-ranks"],
)
def test_a_one_rank_checkpoint_resumes_on_another_topology(num_workers, world_size):
    # A one-rank job's state covers the whole job: it is re-dealt (elastic resume), every
    # remaining item once, including the items the two workers had computed ahead.
    pipe = dp.range(40).shuffle().batch(4)
    with dp.Loader(pipe, seed=0, num_workers=2) as loader:
        _, before = first_items(loader, 3)
        state = roundtrip(loader.state_dict())
    after = []
    for rank in range(world_size):
        target = dp.Loader(pipe, seed=0, rank=rank, world_size=world_size, num_workers=num_workers)
        target.load_state_dict(state)
        after.extend(list(target))
    items = [x for batch in before + after for x in batch.tolist()]
    assert sorted(items) == list(range(40))


def test_checkpoint_of_another_rank_is_refused_with_workers():
    pipe = dp.range(40).batch(4)
    with dp.Loader(pipe, rank=0, world_size=3, num_workers=1) as loader:
        first_items(loader, 2)
        state = roundtrip(loader.state_dict())
    for rank, world_size in [(1, 3), (0, 2)]:
        target = dp.Loader(pipe, rank=rank, world_size=world_size, num_workers=1)
        with pytest.raises(dp.StateMismatchError, match="topology"):
            target.load_state_dict(state)
    same_rank = dp.Loader(pipe, rank=0, world_size=3, num_workers=1)
    same_rank.load_state_dict(state)  # the same topology is accepted


# ----- 6. epochs with workers -----------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [1, 2])
def test_successive_epochs_reshuffle_the_same_items(jsonl_files, num_workers: int):
    urls, records = jsonl_files
    for pipe, dataset in [
        (dp.range(50).shuffle(), list(range(50))),
        (dp.files(urls).shuffle().read_jsonl().shuffle(buffer_size=9), records),
    ]:
        loader = dp.Loader(pipe, seed=8, num_workers=num_workers)
        first, second = list(loader), list(loader)
        assert_exactly_once(first, dataset, "epoch 0")
        assert_exactly_once(second, dataset, "epoch 1")
        assert [canon(r) for r in first] != [canon(r) for r in second]


def test_same_seed_and_workers_give_identical_streams(jsonl_files):
    urls, _ = jsonl_files
    pipe = dp.files(urls).shuffle().read_jsonl().map(worker_tag).shuffle(buffer_size=5).batch(3)

    def two_epochs(seed: int) -> list[list[Any]]:
        loader = dp.Loader(pipe, seed=seed, num_workers=2)
        return [list(loader), list(loader)]

    a, b = two_epochs(6), two_epochs(6)
    for epoch in (0, 1):
        assert_same(a[epoch], b[epoch], f"epoch {epoch}")
    other = two_epochs(7)
    assert not all(same(x, y) for x, y in zip(a[0], other[0])), "the seed changes nothing"


def test_worker_output_interleaves_round_robin(jsonl_files):
    """One item a transfer: batch k comes from worker k mod N while all workers have batches
    (the documented order; with several items a transfer: tests/workers/test_worker_bundles.py)."""
    pipe = resume_recipe("files", jsonl_files)
    workers = batch_workers(list(dp.Loader(pipe, num_workers=3, items_per_transfer=1)))
    counts = Counter(workers)
    rounds = min(counts.values())
    assert workers[: 3 * rounds] == [0, 1, 2] * rounds
    assert len(set(workers[3 * rounds :])) < 3


def item_and_pid(x: int) -> tuple[int, int]:
    return x, os.getpid()


def test_persistent_workers_carry_on_to_the_next_epoch():
    """The same worker processes serve consecutive epochs, in the same orders as fresh ones."""
    pipe = dp.range(40).shuffle().map(item_and_pid).batch(4)
    fresh = dp.Loader(pipe, seed=1, num_workers=2)
    expected = [[b[0].tolist() for b in fresh] for _ in range(4)]
    loader = dp.Loader(pipe, seed=1, num_workers=2, persistent_workers=True)
    epochs, pids = [], []
    for _ in range(3):
        batches = list(loader)
        epochs.append([b[0].tolist() for b in batches])
        pids.append({pid for b in batches for pid in b[1].tolist()})
    assert epochs == expected[:3]
    assert pids[0] == pids[1] == pids[2] and len(pids[0]) == 2
    loader.set_epoch(1)  # not the next epoch: fresh workers, epoch 1 again
    assert [b[0].tolist() for b in loader] == expected[1]
    it = iter(loader)  # epoch 2
    first = [next(it)[0].tolist() for _ in range(3)]
    state = roundtrip(loader.state_dict())
    loader.close()
    resumed = dp.Loader(pipe, seed=1, num_workers=2, persistent_workers=True)
    resumed.load_state_dict(state)
    assert first + [b[0].tolist() for b in resumed] == expected[2]
    assert [b[0].tolist() for b in resumed] == expected[3]
    resumed.close()


def item_and_worker_seed(x: int) -> tuple[int, int]:
    return x, torch.initial_seed()  # torch seeds each worker with base seed + worker id


def test_workers_leave_the_global_rng_alone_and_are_seeded_by_seed_and_epoch():
    pipe = dp.range(8).map(item_and_worker_seed)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    loader = dp.Loader(pipe, seed=5, num_workers=2)
    epochs = [{seed for _, seed in loader} for _ in range(2)]
    assert torch.equal(torch.get_rng_state(), before)  # the DataLoader drew from its own
    assert [len(seeds) for seeds in epochs] == [2, 2]  # one per worker
    assert epochs[0] != epochs[1]  # augmentations in workers differ per epoch
    again = dp.Loader(pipe, seed=5, num_workers=2)
    assert [{seed for _, seed in again} for _ in range(2)] == epochs  # and repeat exactly
    assert {seed for _, seed in dp.Loader(pipe, seed=6, num_workers=2)} != epochs[0]


def test_checkpoints_with_workers_are_the_same_in_every_run():
    def checkpoint() -> dict[str, Any]:
        loader = dp.Loader(dp.range(100).shuffle().batch(4), seed=2, num_workers=2)
        it = iter(loader)
        for _ in range(7):
            next(it)
        state = loader.state_dict()
        loader.close()
        return state

    assert checkpoint() == checkpoint()


def test_workers_of_different_ranks_draw_different_seeds():
    """DESIGN: random streams differ per consumer; ranks' workers must not repeat augmentations."""
    pipe = dp.range(8).map(item_and_worker_seed)
    seeds = [
        {s for _, s in dp.Loader(pipe, seed=5, num_workers=1, rank=r, world_size=2)}
        for r in range(2)
    ]
    assert seeds[0].isdisjoint(seeds[1]), seeds


def test_persistent_workers_leave_the_global_rng_alone_across_epochs():
    """Checked, holds: with persistent workers, two epochs draw nothing from torch's RNG."""
    torch.manual_seed(7)
    before = torch.get_rng_state()
    loader = dp.Loader(
        dp.range(6).map(item_and_worker_seed), seed=1, num_workers=2, persistent_workers=True
    )
    epochs = [[x for x, _ in loader] for _ in range(2)]
    loader.close()
    assert torch.equal(torch.get_rng_state(), before)
    assert [sorted(e) for e in epochs] == [list(range(6))] * 2
