"""The Loader's parts on their own: the epoch cursor and the even_batches policy."""

from __future__ import annotations

import dataclasses

import pytest

import datapipes as dp
from datapipes.loader.epochs import EpochCursor
from datapipes.loader.even_batches import EvenBatchesPolicy, items_per_rank
from datapipes.loader.options import LoaderOptions
from datapipes.placement import RecipePlan
from datapipes.topology import Topology
from nodes import Context
from nodes.steps.even import CountedAgreement, EvenBatchesNode

# ----- the epoch cursor -------------------------------------------------------------------


def test_a_run_counts_only_once_it_begins():
    cursor = EpochCursor()
    cursor.restore(4, {"at": 7})
    run = cursor.next_run()
    assert (run.epoch, run.resume_from) == (4, {"at": 7})
    # The graph refused the position (reset raised): nothing moved, the position is still there.
    assert cursor.epoch == 4 and cursor.position(None) == (4, {"at": 7})
    cursor.begin(run)
    assert cursor.epoch == 4 and cursor.last == 4
    assert cursor.position(lambda: {"at": 9}) == (4, {"at": 9})
    cursor.finish(run)
    assert cursor.epoch == 5 and cursor.position(lambda: {"at": 9}) == (5, None)
    assert cursor.last == 4  # statistics still describe epoch 4


def test_an_earlier_run_neither_ends_nor_owns_the_current_epoch():
    cursor = EpochCursor()
    first = cursor.next_run()
    cursor.begin(first)
    second = cursor.next_run()
    cursor.begin(second)
    assert not cursor.is_current(first) and cursor.is_current(second)
    cursor.finish(first)  # the abandoned iterator of epoch 0 runs out late
    assert cursor.epoch == 1 and cursor.position(lambda: {"at": 2}) == (1, {"at": 2})


def test_suspend_keeps_the_running_position_and_ends_the_live_iterator():
    cursor = EpochCursor()
    run = cursor.next_run()
    cursor.begin(run)
    ended = []

    def items():
        try:
            yield 1
            yield 2
        finally:
            ended.append(True)

    live = cursor.watch(items())
    next(live)
    cursor.suspend(lambda: {"at": 1})
    assert ended == [True]
    assert cursor.epoch == 0 and cursor.position(lambda: {"at": 99}) == (0, {"at": 1})
    assert cursor.next_run().resume_from == {"at": 1}


def test_suspend_between_epochs_keeps_what_is_pending():
    cursor = EpochCursor()
    cursor.restore(2, {"at": 3})
    cursor.suspend(lambda: pytest.fail("no epoch runs: the graph's state is not asked for"))
    assert cursor.position(None) == (2, {"at": 3})


def test_set_epoch_starts_afresh_and_refuses_a_negative_epoch():
    cursor = EpochCursor()
    cursor.restore(1, {"at": 3})
    cursor.set_epoch(6)
    assert cursor.position(None) == (6, None)
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        cursor.set_epoch(-1)


# ----- the even_batches policy ------------------------------------------------------------


def policy(requested: bool | None, origin: str, world_size: int = 2) -> EvenBatchesPolicy:
    pipe = dp.range(5).batch(2)
    options = LoaderOptions.check(pipe, rank=0, world_size=world_size, even_batches=requested)
    options = dataclasses.replace(options, topology=Topology(0, world_size, origin))
    return EvenBatchesPolicy(options, RecipePlan.of(pipe, 0))


def test_the_torchrun_default_is_open_until_adopted_from_a_checkpoint():
    even = policy(None, "RANK/WORLD_SIZE")  # torchrun, before init_process_group
    assert even.value is False  # off for now, not pinned
    even.adopt("not a bool")
    assert even.value is False
    even.adopt(True)
    assert even.value is True
    even.adopt(False)  # decided now: a second checkpoint does not move it
    assert even.value is True


def test_the_first_epoch_pins_an_open_default():
    even = policy(None, "RANK/WORLD_SIZE")
    root = dp.range(5).build(Context())
    assert even.wrap(root, lambda: 0) is root  # decided off for good
    even.adopt(True)
    assert even.value is False


@pytest.mark.parametrize(
    ("requested", "origin", "world_size"),
    [(True, "arguments", 1), (None, "arguments", 2), (False, "RANK/WORLD_SIZE", 2)],
)
def test_a_decided_value_ignores_checkpoints(requested, origin, world_size):
    even = policy(requested, origin, world_size)
    even.adopt(True)
    assert even.value is False


def test_the_agreement_is_made_once_per_policy():
    even = policy(True, "arguments")
    ctx = Context(rank=0, world_size=2)
    first = even.wrap(dp.range(5).batch(2).build(ctx), lambda: 0)
    second = even.wrap(dp.range(5).batch(2).build(ctx), lambda: 0)
    assert isinstance(first, EvenBatchesNode) and isinstance(second, EvenBatchesNode)
    assert isinstance(first._agreement, CountedAgreement)
    assert first._agreement is second._agreement


def test_items_per_rank_counts_without_communication():
    pipe = dp.range(7).batch(2)
    assert items_per_rank(pipe, 2, 0, 0, 0) == [2, 2]  # ranks read 4 and 3 items
    unknown = dp.range(7).filter(lambda x: x not in (3, 5)).batch(2)
    assert items_per_rank(unknown, 2, 0, 0, 0) == [2, 1]  # counted by running: 4 and 1 items


def test_epochs_loop_continues_from_a_checkpoint_without_an_extra_epoch():
    pipe = dp.range(10).shuffle().batch(3)
    reference = dp.Loader(pipe, seed=5)
    expected = [[b.tolist() for b in reference] for _ in reference.epochs(3)]

    first = dp.Loader(pipe, seed=5)
    seen: list[list[list[int]]] = []
    for epoch in first.epochs(3):
        seen.append([])
        for batch in first:
            seen[-1].append(batch.tolist())
            if epoch == 1 and len(seen[-1]) == 2:
                break
        if epoch == 1:
            break
    state = first.state_dict()

    resumed = dp.Loader(pipe, seed=5)
    resumed.load_state_dict(state)
    epochs_run = []
    for epoch in resumed.epochs(3):
        epochs_run.append(epoch)
        batches = [b.tolist() for b in resumed]
        if epoch == 1:
            seen[1].extend(batches)
        else:
            seen.append(batches)
    assert epochs_run == [1, 2]
    assert seen == expected


def test_epochs_loop_whose_body_never_iterates_is_an_error():
    loader = dp.Loader(dp.range(3))
    offered = []
    with pytest.raises(RuntimeError, match="must iterate the Loader"):
        for epoch in loader.epochs(2):
            offered.append(epoch)  # a body that never iterates the Loader
    assert offered == [0]  # refused before a second epoch is offered: no endless loop
    with pytest.raises(ValueError, match="total number of epochs"):
        next(loader.epochs(-1))
