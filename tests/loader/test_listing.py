"""One listing per job: a Loader lists its files once; ranks and workers read that listing.

Listings are counted on a real local filesystem: ``countinglocal://`` is fsspec's
local filesystem that also appends a line (its pid) to a log file for every listing
(``glob``), in whatever process lists. With ``add_after_first`` it also writes a new
data file right after the first listing of the job, so that any later listing sees
one file more: the file added between two ranks' listings of the issue.
"""

from __future__ import annotations

import json
import os
import pickle
import time
import warnings
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem
from helpers import multiset
from subprocess_helpers import run_forked_ranks

import datapipes as dp
from datapipes.loader.listings import file_sets
from nodes import Context
from nodes.base import walk_graph
from nodes.sources.files import FileSet, Listings
from nodes.workers.stream import WorkerStreamNode

PROTOCOL = "countinglocal"


class CountingFileSystem(LocalFileSystem):
    """The local filesystem, logging every listing (and adding a file after the first)."""

    protocol = (PROTOCOL,)

    def __init__(self, log: str, add_after_first: str = "", **options: Any) -> None:
        super().__init__(**options)
        self.log, self.add_after_first = log, add_after_first

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        path = str(path)
        if path.startswith(f"{PROTOCOL}://"):
            path = path[len(PROTOCOL) + 3 :]
        return super()._strip_protocol(path)

    def glob(self, path: str, **kwargs: Any) -> Any:
        found = super().glob(path, **kwargs)
        first = not os.path.exists(self.log)
        with open(self.log, "a") as log:
            log.write(f"{os.getpid()}\n")
        if first and self.add_after_first:  # a file lands right after the first listing
            write_records(Path(self.add_after_first), range(1000, 1100))
        return found


fsspec.register_implementation(PROTOCOL, CountingFileSystem, clobber=True)


def write_records(path: Path, ids: range) -> None:
    path.write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))


def make_files(folder: Path, files: int = 8, per_file: int = 100) -> list[int]:
    """``files`` JSONL files of ``per_file`` records ``{"id": i}``; the ids, in order."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(files):
        first = index * per_file
        write_records(folder / f"part-{index:02d}.jsonl", range(first, first + per_file))
    return list(range(files * per_file))


def counted_files(folder: Path, log: Path, add_after_first: Path | None = None) -> dp.FileList:
    options = {"add_after_first": str(add_after_first)} if add_after_first else {}
    return dp.files(f"{PROTOCOL}://{folder}/*.jsonl", log=str(log), **options)


def listings_made(log: Path) -> list[int]:
    """The pid of the process behind each listing so far."""
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def ids(records: list[dict[str, int]]) -> list[int]:
    return [record["id"] for record in records]


def repeated_and_missing(got: list[int], expected: list[int]) -> tuple[int, int]:
    """How many records were read more than once, and how many never."""
    counts = multiset(got)
    return sum(n - 1 for n in counts.values() if n > 1), len(set(expected) - set(got))


# ----- the listing key and the shared store ---------------------------------------------------


def test_listing_key_names_what_is_listed_and_hides_credentials():
    key = FileSet("data/*.jsonl", {"token": "s3cr3t"}).listing_key
    assert key == FileSet(["data/*.jsonl"], {"token": "s3cr3t"}).listing_key
    assert key != FileSet("data/*.jsonl", {"token": "other"}).listing_key
    assert key != FileSet("data/*.json", {"token": "s3cr3t"}).listing_key
    assert "s3cr3t" not in key and len(key) == 16


def test_a_file_set_with_listings_reads_them_and_does_not_list(tmp_path: Path):
    log = tmp_path / "log"
    make_files(tmp_path / "d", files=2)
    shared = FileSet(f"{PROTOCOL}://{tmp_path}/d/*.jsonl", {"log": str(log)})
    listings = Listings()
    assert listings.urls(shared) == shared.urls  # listed here once, then the file set's own
    assert len(listings_made(log)) == 2
    again = FileSet(shared.patterns, shared.storage_options, listings=listings)
    assert shared in listings and again.urls == shared.urls
    assert again.listing_state() == shared.listing_state()
    assert len(listings_made(log)) == 2  # read from the store: no listing


def test_steps_over_the_same_files_share_one_listing(tmp_path: Path):
    log = tmp_path / "log"
    expected = make_files(tmp_path / "d", files=3)
    files = counted_files(tmp_path / "d", log)
    pipe = dp.zip(files.read_jsonl(), files.shuffle().read_jsonl())
    assert len(file_sets(pipe, Context())) == 1
    pairs = list(dp.Loader(pipe))
    assert sorted(ids([a for a, _ in pairs])) == expected
    assert listings_made(log) == [os.getpid()]


def test_a_loader_lists_once_for_all_its_epochs_and_after_close(tmp_path: Path):
    """Today's semantics, kept: listed once per Loader (the graph was kept across epochs)."""
    log = tmp_path / "log"
    expected = make_files(tmp_path / "d")
    loader = dp.Loader(counted_files(tmp_path / "d", log).read_jsonl(), rank=1, world_size=2)
    shares = [ids(list(loader)) for _ in range(2)]
    loader.close()
    write_records(tmp_path / "d" / "part-99.jsonl", range(1000, 1100))  # seen by new Loaders
    shares.append(ids(list(loader)))
    assert (
        shares[0]
        == shares[1]
        == shares[2]
        == expected[100:200] + expected[300:400] + [*expected[500:600], *expected[700:800]]
    )
    assert listings_made(log) == [os.getpid()]
    assert len(ids(list(dp.Loader(counted_files(tmp_path / "d", log).read_jsonl())))) == 900
    assert len(listings_made(log)) == 2  # a new Loader lists again


def test_without_torch_distributed_a_changed_listing_is_refused_at_resume(tmp_path: Path):
    """Explicit ranks cannot talk, so each lists; the checkpoint's digest catches a change."""
    make_files(tmp_path / "d")
    pipe = dp.files(str(tmp_path / "d" / "*.jsonl")).read_jsonl()
    loader = dp.Loader(pipe, rank=0, world_size=2)
    iterator = iter(loader)
    first = [next(iterator) for _ in range(10)]
    state = loader.state_dict()
    write_records(tmp_path / "d" / "part-99.jsonl", range(1000, 1100))
    resumed = dp.Loader(pipe, rank=0, world_size=2)
    with pytest.raises(ValueError, match=r"the files changed .* 8 files .* lists 9"):
        resumed.load_state_dict(state)  # refused when loaded, or at the latest when resumed
        list(resumed)
    assert ids(first) == list(range(10))


def test_the_worker_part_carries_the_listing_when_pickled_for_spawned_workers(tmp_path: Path):
    log = tmp_path / "log"
    make_files(tmp_path / "d", files=2)
    loader = dp.Loader(counted_files(tmp_path / "d", log).read_jsonl(), num_workers=1)
    root = loader._graph.current()  # the first epoch's build: the Loader lists
    stream = next(n for n in walk_graph(root) if isinstance(n, WorkerStreamNode))
    dataset = stream._dataset_for_epoch(0)  # what the workers of epoch 0 start with
    loader.close()
    copy = pickle.loads(pickle.dumps(dataset))  # what a spawned worker receives
    assert isinstance(copy.job.listings, Listings) and len(copy.job.listings) == 1
    root = copy.pipe.build(copy._context())
    root.reset(None)
    assert sorted(ids(list(root))) == list(range(200))
    assert listings_made(log) == [os.getpid()]  # the copy read the shipped listing


# ----- DataLoader workers -------------------------------------------------------------------


@pytest.mark.slow
def test_dataloader_workers_do_not_list(tmp_path: Path):
    log = tmp_path / "log"
    expected = make_files(tmp_path / "d", files=5)
    pipe = counted_files(tmp_path / "d", log).shuffle().read_jsonl()
    for persistent in (False, True):
        loader = dp.Loader(pipe, num_workers=2, persistent_workers=persistent)
        for _ in range(2):
            assert sorted(ids(list(loader))) == expected
        loader.close()
    assert listings_made(log) == [os.getpid()] * 2  # one per Loader, in this process


@pytest.mark.slow
def test_ranks_and_workers_still_read_every_record_exactly_once(tmp_path: Path):
    """Whole files (9 files) and split files (3 files) for 2 ranks x 2 workers, 2 epochs."""
    for files in (9, 3):
        folder = tmp_path / f"d{files}"
        expected = make_files(folder, files=files, per_file=50)
        pipe = dp.files(str(folder / "*.jsonl")).shuffle().read_jsonl()
        loaders = [dp.Loader(pipe, rank=r, world_size=2, num_workers=2) for r in range(2)]
        for _ in range(2):
            got = [i for loader in loaders for i in ids(list(loader))]
            assert multiset(got) == multiset(expected), files


# ----- ranks under torch.distributed --------------------------------------------------------


def _listing_job(rank: int, store: str, folder: str, log: str, mode: str, answers: Any) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        made: list[Any] = []
        if mode == "nccl":  # as in a job training with NCCL: the listing needs a gloo group
            real_new_group = dist.new_group

            def counting_new_group(*args: Any, **kwargs: Any) -> Any:
                made.append(kwargs.get("backend"))
                return real_new_group(*args, **kwargs)

            dist.new_group = counting_new_group
            dist.get_backend = lambda group=None: "nccl"
        added = str(Path(folder) / "a-added.jsonl")  # sorts first: every later index moves
        pipe = counted_files(Path(folder), Path(log), Path(added)).read_jsonl()
        if rank == 1:
            time.sleep(0.5)  # rank 1 lists after rank 0 (when it lists at all)
        loader = dp.Loader(pipe)  # even_batches, the default here: the ranks talk
        epochs = [ids(list(loader)) for _ in range(2)]
        with warnings.catch_warnings():  # 9 files now: rank 0 reads 500, rank 1 400
            warnings.simplefilter("ignore", dp.UnevenDataWarning)
            later = ids(list(dp.Loader(pipe)))  # a new Loader: a new listing
        answers.put((rank, epochs, later, made))
        dist.destroy_process_group()
    except BaseException as error:
        answers.put((rank, f"{type(error).__name__}: {error}"))
        raise


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_a_file_added_between_two_ranks_listings_is_neither_duplicated_nor_lost(
    tmp_path: Path, backend: str
):
    """800 records in 8 files; a 9th file lands right after the first listing of the job.

    Had each rank listed, rank 1 (listing later) would deal 9 files while rank 0 dealt
    8: some records twice, some never. Rank 0 lists for both, so the epoch is exact.
    """
    folder, log = tmp_path / "d", tmp_path / "log"
    expected = make_files(folder)
    results = run_forked_ranks(
        _listing_job, tmp_path / "store", str(folder), str(log), backend, timeout=90
    )
    assert all(len(result) == 4 for result in results), results
    for epoch in range(2):
        got = [i for _, epochs, _, _ in results for i in epochs[epoch]]
        assert repeated_and_missing(got, expected) == (0, 0), f"epoch {epoch}"
        assert sorted(got) == expected
    later = [i for _, _, ids_later, _ in results for i in ids_later]
    assert repeated_and_missing(later, later) == (0, 0) and len(later) == 800  # 400 + 400
    assert set(later) <= set(expected + list(range(1000, 1100)))
    assert set(range(1000, 1100)) <= set(later)  # the added file, first in rank 0's share
    assert len(listings_made(log)) == 2  # rank 0 once per Loader; rank 1 never
    groups = [made for _, _, _, made in results]
    assert groups == ([[], []] if backend == "gloo" else [["gloo", "gloo"]] * 2)


def _failing_listing_job(rank: int, store: str, folder: str, mode: str, answers: Any) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    pattern = f"{folder}/*.jsonl" if mode == "other recipe" and rank == 1 else f"{folder}/x-*"
    if mode == "other recipe" and rank == 0:
        pattern = f"{folder}/part-0*.jsonl"
    try:
        list(dp.Loader(dp.files(pattern).read_jsonl()))
        answers.put((rank, "no error"))
    except Exception as error:  # noqa: BLE001 - reported to the test
        answers.put((rank, type(error).__name__, str(error)))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_rank_0s_listing_error_reaches_every_rank(tmp_path: Path):
    make_files(tmp_path / "d", files=2)
    results = run_forked_ranks(
        _failing_listing_job, tmp_path / "store", str(tmp_path / "d"), "nothing", timeout=90
    )
    assert [result[:2] for result in results] == [(0, "FileNotFoundError")] * 1 + [
        (1, "FileNotFoundError")
    ]
    assert all("x-*" in result[2] and "matched no files" in result[2] for result in results)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ranks_with_different_file_lists_are_refused(tmp_path: Path):
    make_files(tmp_path / "d", files=2)
    results = run_forked_ranks(
        _failing_listing_job, tmp_path / "store", str(tmp_path / "d"), "other recipe", timeout=90
    )
    # Rank 0's listing serves rank 0; its even epochs then lose their peer (no hang).
    assert results[0][:2] in ((0, "no error"), (0, "RuntimeError"))
    assert results[1][:2] == (1, "RuntimeError")
    assert "rank 1 reads the files" in results[1][2] and "same recipe" in results[1][2]
