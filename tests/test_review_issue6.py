"""Review of the commits since cf89953~6 (HTTP without ranges, apply_node, lazy even_batches,
uniform small shuffles, seeded DataLoader workers): one failing test per confirmed bug, plus
tests of tricky behaviour that was checked and holds."""

from __future__ import annotations

import itertools
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from file_fixtures import jsonl_records, write_jsonl, write_npz
from http_server import _Handler, serve
from subprocess_helpers import run_forked_ranks

import datapipes as dp
from nodes import Context, Node
from nodes.files import FileSet
from nodes.readers import FileReaderNode, NpyFormat
from nodes.rng import EXPLICIT_PERMUTATION_LIMIT, IndexPermutation
from nodes.storage import SourceFile
from nodes.testing import check_node

warnings.filterwarnings("ignore", message="This DataLoader will create")


# ----- servers --------------------------------------------------------------------------------


class _NoSizeHandler(_Handler):
    """Sends no Content-Length (HTTP/1.0: the body ends when the connection closes)."""

    def send_header(self, keyword: str, value: str) -> None:
        if keyword.lower() != "content-length":
            super().send_header(keyword, value)


class _CountingHandler(_Handler):
    """Counts the GETs (each one a download of the file from its start on this server)."""

    def do_GET(self) -> None:  # noqa: N802
        with self.server_state._lock:
            self.server_state.gets = getattr(self.server_state, "gets", 0) + 1
        super().do_GET()


class _TricklingHandler(_Handler):
    """Sends the body in small pieces with pauses, so a client's reads find part of it."""

    def copyfile(self, source, outputfile) -> None:  # noqa: ANN001
        while piece := source.read(512):
            outputfile.write(piece)
            outputfile.flush()
            time.sleep(0.001)


# ----- HTTP servers without Range support ------------------------------------------------------


def test_a_file_split_across_ranks_on_a_server_without_size_reads_every_record_once(tmp_path):
    """README: a server that gives no size is read as a stream and the records are the same."""
    records = jsonl_records(400, seed=1)
    write_jsonl(tmp_path, "a.jsonl", records)
    with serve(tmp_path, handler=_NoSizeHandler, ranges=False) as server:
        pipe = dp.files(f"{server.url}/a.jsonl").read_jsonl()
        assert list(dp.Loader(pipe)) == records  # one consumer: fine
        # one file, two consumers: split by byte ranges, which asks for the size
        parts = [list(dp.Loader(pipe, rank=r, world_size=2)) for r in range(2)]
    got = sorted(json.dumps(r, sort_keys=True) for part in parts for r in part)
    assert got == sorted(json.dumps(r, sort_keys=True) for r in records)


def test_an_npz_on_a_server_without_size_is_read_not_called_a_bad_archive(tmp_path):
    """A valid .npz on a server that sends no Content-Length reads (not 'not a .npz archive')."""
    rows = write_npz(tmp_path, "a.npz", {"x": np.arange(20).reshape(10, 2), "y": np.arange(10)})
    with serve(tmp_path, handler=_NoSizeHandler, ranges=False) as server:
        got = list(dp.Loader(dp.files(f"{server.url}/a.npz").read_npy()))
    assert len(got) == len(rows)
    assert all(np.array_equal(g["x"], w["x"]) and g["y"] == w["y"] for g, w in zip(got, rows))


def test_an_npz_read_by_rows_from_a_stream_is_downloaded_about_once_per_member(tmp_path):
    """ForwardOnlyFile's doc: an .npz is downloaded about once per member, not once per block."""
    n = 20_000
    write_npz(tmp_path, "a.npz", {"x": np.zeros((n, 8), np.float32), "y": np.arange(n)})
    with serve(tmp_path, handler=_CountingHandler, announce_no_ranges=True) as server:
        files = FileSet(f"{server.url}/a.npz", {})
        node = FileReaderNode(files, NpyFormat(block_bytes=1 << 14), Context())  # ~50 blocks
        node.reset(None)
        try:
            assert sum(1 for _ in node) == n
        finally:
            node.close()
        downloads = server.gets
    assert downloads <= 8, f"{downloads} downloads of a 2-member .npz"


def test_a_read_is_retried_when_reopening_the_file_fails_too(tmp_path):
    """retries=3 survives 3 failed requests even when one of them is the reopen itself."""
    records = jsonl_records(300, seed=2)
    write_jsonl(tmp_path, "a.jsonl", records)
    data = (tmp_path / "a.jsonl").read_bytes()
    with serve(tmp_path) as server:
        source = SourceFile(f"{server.url}/a.jsonl", {}, retries=3, block_size=4096)
        with source.open(0) as f:
            # the read's GET, then the reopen's HEAD and GET, answer 503
            server.fail_next(3)
            assert f.read(len(data) + 1) == data


def test_a_stream_is_positioned_after_a_cut_mid_seek(tmp_path):
    """Checked, holds: a resume deep into a no-range file, cut while skipping, is exact."""
    records = jsonl_records(600, seed=3)
    write_jsonl(tmp_path, "a.jsonl", records)
    data = (tmp_path / "a.jsonl").read_bytes()
    with serve(tmp_path, announce_no_ranges=True) as server:
        source = SourceFile(f"{server.url}/a.jsonl", {}, retries=3, block_size=4096)
        server.cut_next(1, after=5000)
        with source.open(len(data) // 2) as f:
            assert f.read(len(data)) == data[len(data) // 2 :]


def test_a_read_of_a_stream_returns_what_was_asked_for_not_what_has_arrived(tmp_path):
    """Bug: a read of a no-range file returned the bytes that had arrived so far, and a
    caller that takes a short read for the end of the file (zipfile) saw it truncated."""
    records = jsonl_records(300, seed=4)
    write_jsonl(tmp_path, "a.jsonl", records)
    data = (tmp_path / "a.jsonl").read_bytes()
    arrays = {"x": np.arange(4000, dtype=np.int64).reshape(1000, 4), "y": np.arange(1000)}
    write_npz(tmp_path, "b.npz", arrays)
    with serve(tmp_path, handler=_TricklingHandler, announce_no_ranges=True) as server:
        source = SourceFile(f"{server.url}/a.jsonl", {}, retries=0, block_size=4096)
        with source.open(100) as f:
            assert f.read(len(data)) == data[100:]
        rows = list(dp.Loader(dp.files(f"{server.url}/b.npz").read_npy()))
    assert [int(r["y"]) for r in rows] == list(range(1000))
    assert np.array_equal(np.stack([r["x"] for r in rows]), arrays["x"])


# ----- apply_node ------------------------------------------------------------------------------


class Scaled(Node):
    """Multiplies items by ``args``; takes a ``factory`` too (ordinary parameter names)."""

    def __init__(self, upstream: Node, args: int = 1, factory: Any = None) -> None:
        super().__init__(upstream)
        self.upstream = upstream
        self.k = args

    def reset(self, state=None):
        self.upstream.reset(state)

    def __next__(self):
        return next(self.upstream) * self.k

    def state_dict(self):
        return self.upstream.state_dict()


class Tagged(Node):
    """Tags items with draws from an RNG seeded by the step's context at reset."""

    def __init__(self, upstream: Node, ctx: Context) -> None:
        super().__init__(upstream)
        self.upstream, self.ctx = upstream, ctx

    def reset(self, state=None):
        self.upstream.reset(None if state is None else state["up"])
        self.drawn = 0 if state is None else state["drawn"]
        self.rng = np.random.default_rng(self.ctx.random_key(self.ctx.consumer_index))
        self.rng.random(self.drawn)

    def __next__(self):
        item = next(self.upstream)
        self.drawn += 1
        return item, float(self.rng.random())

    def state_dict(self):
        return {"up": self.upstream.state_dict(), "drawn": self.drawn}


def test_a_users_node_may_take_keyword_arguments_named_args_or_factory():
    """apply_node(MyNode, args=2): user kwargs must not collide with the recipe's own names."""
    assert list(dp.Loader(dp.range(3).apply_node(Scaled, args=2))) == [0, 2, 4]
    assert list(dp.Loader(dp.range(3).apply_node(Scaled, 3, factory=len))) == [0, 3, 6]


def test_a_users_node_in_branches_repeats_and_after_shard_resumes_exactly():
    """Checked, holds: apply_node inside zip/mix/concat, under repeat, before shard."""
    tagged = dp.range(12).apply_node(Tagged)
    pipes = [
        dp.zip(tagged, dp.range(12).apply_node(Tagged)),
        dp.mix([tagged, dp.range(50, 60).apply_node(Tagged)], [1, 2]),
        dp.concat(dp.range(5).apply_node(Scaled, 2), tagged),
        dp.range(6).shuffle().apply_node(Tagged).repeat(3),
        dp.from_iterable(lambda: range(20)).apply_node(Tagged).shard(),
    ]
    for pipe in pipes:
        check_node(lambda ctx, pipe=pipe: pipe.build(ctx), max_positions=8)
    a, b = zip(*dp.Loader(pipes[0]))
    assert [t for _, t in a] != [t for _, t in b]  # zip branches draw their own streams
    rounds = [t for _, t in dp.Loader(pipes[3])]
    assert rounds[:6] != rounds[6:12]  # so do repeat rounds


# ----- shuffles -------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, EXPLICIT_PERMUTATION_LIMIT, EXPLICIT_PERMUTATION_LIMIT + 1])
def test_permutations_at_the_edges_are_permutations(n: int):
    """Checked, holds: n = 0 and 1 (explicit draw), and both sides of the limit."""
    values = IndexPermutation(n, key=[3, 4]).apply(np.arange(n, dtype=np.int64))
    assert values.dtype == np.int64 and np.array_equal(np.sort(values), np.arange(n))
    small = min(n, 3)
    orders = [list(p) for p in itertools.permutations(range(small))]
    assert list(dp.Loader(dp.range(small).shuffle())) in orders


# ----- DataLoader workers' seeds ---------------------------------------------------------------


def item_and_worker_seed(x: int) -> tuple[int, int]:
    return x, torch.initial_seed()


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


# ----- even_batches decided lazily --------------------------------------------------------------


def _rank_job(rank: int, store: str, mode: str, answers) -> None:
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE="2")  # what torchrun sets
    try:
        pipe = dp.range(13).batch(2)  # rank 0 has 4 batches, rank 1 has 3
        loader = dp.Loader(pipe)  # before init_process_group
        if mode == "state_dict_before_init":
            loader.state_dict()  # e.g. logged or saved during setup
        elif mode == "load_before_init":
            saved = dp.Loader(pipe, rank=rank, world_size=2, even_batches=True)
            loader.load_state_dict(saved.state_dict())
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        try:
            if mode == "state_dict_on_rank_0_only" and rank == 0:
                loader.state_dict()  # after init, before the first epoch: no collective
            answers.put((rank, loader.even_batches, len(list(loader))))
        finally:
            dist.destroy_process_group()
    except Exception as error:  # noqa: BLE001 - reported to the test
        answers.put((rank, "error", f"{type(error).__name__}: {error}"[:400]))


def _run_ranks(tmp_path: Path, mode: str) -> list[tuple[Any, ...]]:
    return run_forked_ranks(_rank_job, tmp_path / "store", mode)


@pytest.mark.timeout(120)
def test_a_state_dict_taken_before_init_process_group_does_not_fix_uneven_epochs(tmp_path):
    """A checkpoint/log before init must not decide even_batches=False (DDP would hang)."""
    assert _run_ranks(tmp_path, "state_dict_before_init") == [(0, True, 3), (1, True, 3)]


@pytest.mark.timeout(120)
def test_an_even_checkpoint_loads_into_a_loader_made_before_init_process_group(tmp_path):
    """load_state_dict of an even_batches=True checkpoint before init is accepted, and evens."""
    assert _run_ranks(tmp_path, "load_before_init") == [(0, True, 3), (1, True, 3)]


@pytest.mark.timeout(120)
def test_a_state_dict_on_one_rank_before_the_first_epoch_runs_no_collective(tmp_path):
    """Checked, holds: only rank 0 asks for a state before the first epoch; nothing hangs."""
    assert _run_ranks(tmp_path, "state_dict_on_rank_0_only") == [(0, True, 3), (1, True, 3)]


def _close_each_epoch_job(rank: int, store: str, answers) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        made = []
        real_new_group = dist.new_group

        def counting_new_group(*args: Any, **kwargs: Any) -> Any:
            made.append(kwargs.get("backend"))
            return real_new_group(*args, **kwargs)

        dist.new_group = counting_new_group
        dist.get_backend = lambda group=None: "nccl"  # as in a job training with NCCL
        loader = dp.Loader(dp.range(12).batch(2))
        for _ in range(3):
            with loader:  # closes the Loader after each epoch (frees workers, files)
                count = len(list(loader))
        answers.put((rank, count, len(made)))
        dist.destroy_process_group()
    except Exception as error:  # noqa: BLE001 - reported to the test
        answers.put((rank, "error", f"{type(error).__name__}: {error}"[:400]))


@pytest.mark.timeout(120)
def test_even_batches_makes_one_gloo_group_per_loader_not_one_per_rebuild(tmp_path):
    """Under NCCL the agreement's gloo group is made once per Loader; close() must not leak one."""
    results = run_forked_ranks(_close_each_epoch_job, tmp_path / "s")
    assert results == [(0, 3, 1), (1, 3, 1)]  # 3 epochs, each rank made 1 gloo group
