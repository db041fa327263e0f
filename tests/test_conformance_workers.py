"""The conformance kit over the nodes added for workers and ranks: shard, even epochs and
the worker stream (real DataLoader worker processes)."""

from __future__ import annotations

import pytest

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
from nodes.even import CountedAgreement
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


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_worker_stream_node_with_two_worker_processes():
    pipe = dp.range(23).shuffle().batch(3)

    def make(ctx):
        dataset = dp.TorchDataset(pipe, Topology(0, 1, "arguments"), seed=ctx.seed)
        return WorkerStreamNode(dataset, 2, lambda: ctx.epoch)

    # Every resume starts worker processes, so resume at a few telling positions only.
    report = check_node(make, positions=[0, 1, 4, 8])
    assert report.items_per_epoch == [8, 8]  # 12 and 11 items: 4 batches in each worker
