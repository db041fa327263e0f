"""Ranks that list files for themselves compare their listings through a store they share:
a file added between two ranks' starts is a clear error naming it, never a silent overlap."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import datapipes as dp
from datapipes.dispatch.dynamic import private_file_store
from tests.subprocess_helpers import run_forked_ranks


def _write(folder: Path, name: str, ids: range) -> None:
    lines = (json.dumps({"id": i}) for i in ids)
    (folder / name).write_text("".join(f"{line}\n" for line in lines))


def _recipe(folder: Path) -> dp.DataPipe[Any]:
    return dp.files(f"{folder}/*.jsonl").read_jsonl().map(lambda r: r["id"])


def _dynamic_ranks_over_three_files(folder: Path) -> list[dp.Loader]:
    for index in range(3):
        _write(folder, f"part{index}.jsonl", range(100 * index, 100 * index + 50))
    store = private_file_store()
    return [
        dp.Loader(_recipe(folder), rank=r, world_size=2, dispatch="dynamic", store=store)
        for r in range(2)
    ]


def test_dynamic_ranks_refuse_a_file_added_between_their_starts(tmp_path: Path) -> None:
    ranks = _dynamic_ranks_over_three_files(tmp_path)
    first = iter(ranks[0])
    next(first)  # rank 0 listed three files and started
    _write(tmp_path, "part3.jsonl", range(300, 350))
    with pytest.raises(dp.ListingMismatchError, match=r"(?s)rank 1 .*only here: .*part3\.jsonl"):
        next(iter(ranks[1]))


def test_dynamic_ranks_with_one_listing_read_every_record_once(tmp_path: Path) -> None:
    ranks = _dynamic_ranks_over_three_files(tmp_path)
    got = [item for loader in ranks for item in loader]
    assert sorted(got) == [i for k in range(3) for i in range(100 * k, 100 * k + 50)]


def _rank_lists(rank: int, store_file: str, folder: str, answers: Any) -> None:
    store = dist.FileStore(store_file, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        root = Path(folder)
        if rank == 1:  # starts once rank 0 has listed, and a file has been added since
            while not (root / "part3.jsonl").exists():
                time.sleep(0.05)
        loader = dp.Loader(_recipe(root), even_batches=False)
        try:
            count = sum(1 for _ in loader)
            answers.put((rank, "read", count))
        except dp.ListingMismatchError as error:
            answers.put((rank, "refused", str(error)))
        if rank == 0:
            _write(root, "part3.jsonl", range(300, 350))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ranks_of_a_process_group_without_collectives_compare_their_listings(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for index in range(3):
        _write(data, f"part{index}.jsonl", range(100 * index, 100 * index + 50))
    answers = run_forked_ranks(_rank_lists, tmp_path / "store", str(data))
    assert answers[0] == (0, "read", 100)  # two of the three files: its share
    rank, verdict, message = answers[1]
    assert (rank, verdict) == (1, "refused") and "part3.jsonl" in message
