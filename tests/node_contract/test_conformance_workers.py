"""The conformance kit over the nodes added for workers and ranks: shard, even epochs and
the worker stream (real DataLoader worker processes)."""

from __future__ import annotations

import json

import pytest
from helpers import worker_counts

import datapipes as dp
from datapipes.topology import Topology
from nodes import (
    BufferShuffleNode,
    Context,
    EvenBatchesNode,
    IterableNode,
    SequenceNode,
    ShardNode,
    WholeDataContext,
    WorkerStreamNode,
)
from nodes.steps.even import CountedAgreement
from nodes.testing import check_node


def consumer(index: int, count: int):
    """A context factory for consumer ``index`` of ``count`` (as ranks), by epoch."""
    return lambda epoch: Context(rank=index, world_size=count, epoch=epoch)


@pytest.mark.parametrize("index", [0, 2])
def test_shard_node_over_an_iterable(index):
    def make(ctx):
        return ShardNode(IterableNode(lambda: iter(range(40)), WholeDataContext(ctx)), ctx)

    report = check_node(make, context=consumer(index, 3))
    assert report.items_per_epoch == [len(range(index, 40, 3))] * 2


def test_shard_node_over_a_buffer_shuffle():
    def make(ctx):
        whole = WholeDataContext(ctx)
        return ShardNode(BufferShuffleNode(SequenceNode(range(60), whole), 8, whole, 5), ctx)

    report = check_node(make, context=consumer(1, 2))
    assert report.items_per_epoch == [30, 30]


@pytest.mark.filterwarnings("ignore::datapipes.UnevenDataWarning")
def test_even_batches_node_drops_to_the_smallest_count():
    counts = {0: [7, 5, 6], 1: [4, 9, 4]}  # per epoch, per rank: the limit differs by epoch

    def make(ctx):
        agreement = CountedAgreement(lambda epoch: counts[epoch], rank=2)
        return EvenBatchesNode(
            SequenceNode(range(6), ctx), agreement, rank=2, epoch=lambda: ctx.epoch
        )

    with pytest.warns(dp.UnevenDataWarning, match="dropped its last 2 item"):
        report = check_node(make)
    assert report.items_per_epoch == [5, 4]


def test_even_batches_node_refuses_a_short_count():
    agreement = CountedAgreement(lambda epoch: [10, 10], rank=0)
    node = EvenBatchesNode(SequenceNode(range(4), Context()), agreement, rank=0, epoch=lambda: 0)
    node.reset()
    with pytest.raises(RuntimeError, match="counted 10 items .* produced only 4"):
        list(node)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_worker_stream_node_with_two_worker_processes():
    pipe = dp.range(23).shuffle().batch(3)

    def make(ctx):
        dataset = dp.TorchDataset(pipe, Topology(0, 1, "arguments"), seed=ctx.seed)
        return WorkerStreamNode(dataset, 2, lambda: ctx.epoch)

    # Every resume starts worker processes, so resume at a few telling positions only.
    report = check_node(make, positions=[0, 1, 4, 8])
    assert report.items_per_epoch == [8, 8]  # 12 and 11 items: 4 batches in each worker


def keep_unless_multiple_of_7(x: int) -> bool:
    return x % 7 != 0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("snapshot_every", [1, 4])
def test_loader_resumes_between_worker_snapshots(snapshot_every):
    """States are snapshotted every few items; a resume in between replays up to the position."""
    pipe = dp.range(150).shuffle().filter(keep_unless_multiple_of_7).batch(3)
    options = {"num_workers": 3, "snapshot_every_n_steps": snapshot_every}
    full = [batch.tolist() for batch in dp.Loader(pipe, seed=2, **options)]
    for position in (1, 6, 13, len(full) - 1):
        loader = dp.Loader(pipe, seed=2, **options)
        first = [batch.tolist() for _, batch in zip(range(position), loader)]
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        resumed = dp.Loader(pipe, seed=2, **options)
        resumed.load_state_dict(state)
        assert first + [batch.tolist() for batch in resumed] == full, position


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized")
@pytest.mark.parametrize("num_workers", worker_counts(0, 2))
def test_loader_in_a_torch_distributed_checkpoint(tmp_path, num_workers):
    """dcp.save/dcp.load a mid-epoch Loader next to a model; the fresh Loader resumes exactly."""
    import torch
    import torch.distributed.checkpoint as dcp

    pipe = dp.range(60).shuffle().map(keep_unless_multiple_of_7).batch(4)
    full = [batch.tolist() for batch in dp.Loader(pipe, seed=4, num_workers=num_workers)]
    model = torch.nn.Linear(2, 1)
    loader = dp.Loader(pipe, seed=4, num_workers=num_workers)
    first = [batch.tolist() for _, batch in zip(range(5), loader)]
    dcp.save({"model": model.state_dict(), "data": loader}, checkpoint_id=str(tmp_path))
    loader.close()

    resumed = dp.Loader(pipe, seed=4, num_workers=num_workers)
    target = {"model": torch.nn.Linear(2, 1).state_dict(), "data": resumed}
    dcp.load(target, checkpoint_id=str(tmp_path))
    assert torch.equal(target["model"]["weight"], model.state_dict()["weight"])
    assert first + [batch.tolist() for batch in resumed] == full


class CountedWithLookahead(CountedAgreement):
    """Counts, asked for three items at a time, as the collective agreement asks for several."""

    lookahead = 3


@pytest.mark.filterwarnings("ignore::datapipes.UnevenDataWarning")
@pytest.mark.parametrize("counts", [[7, 5, 6], [9, 9, 9], [4, 9, 6]])
def test_even_batches_node_reading_ahead_resumes_exactly(counts):
    def make(ctx):
        agreement = CountedWithLookahead(lambda epoch: counts, rank=2)
        upstream = BufferShuffleNode(SequenceNode(range(9), ctx), 4, ctx, 1)
        return EvenBatchesNode(upstream, agreement, rank=2, epoch=lambda: ctx.epoch)

    report = check_node(make)
    assert report.items_per_epoch == [min(counts)] * 2
