"""Dispatch leases on a clock the test moves: when a lease is stale, when a state is due.

The in-process and real-rank tests in ``test_dispatch_leases.py`` run the whole takeover on
the real clock with margins; these pin the rules themselves, independent of machine load.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

import nodes.dispatch.lease as lease_module
from datapipes.dispatch.dynamic import private_file_store
from nodes.dispatch.lease import (
    STATE_EVERY_ITEMS,
    STATE_EVERY_SECONDS,
    Lease,
    LeaseLost,
    LeaseWatch,
)
from nodes.dispatch.store import StoreClient

SECONDS = 10.0


class MovedClock:
    """Stands in for the lease clock: time moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> MovedClock:
    moved = MovedClock()
    monkeypatch.setattr(lease_module, "clock", moved)
    return moved


def held_lease(client: StoreClient, rank: int) -> Lease:
    """Rank ``rank``'s lease, taken, with its heartbeat ended: only the test writes it."""
    lease = Lease(client, "job", rank, SECONDS)
    lease.start('{"at": "start"}')
    lease.close()
    assert lease._thread is not None
    lease._thread.join(10)
    assert not lease._thread.is_alive()
    return lease


def stale_ranks(watch: LeaseWatch, phases: int = 0) -> tuple[list[int], list[int]]:
    waiting, stale = watch.pending(watch.scan(), phases)
    return waiting, [rank for rank, _ in stale]


def test_a_lease_that_stays_the_same_is_stale_after_lease_seconds(clock: MovedClock) -> None:
    client = StoreClient(private_file_store(), 10)
    held_lease(client, 1)
    watch = LeaseWatch(client, "job", 0, 2, SECONDS)
    assert stale_ranks(watch) == ([1], [])  # first seen now
    clock.now += SECONDS - 0.001
    assert stale_ranks(watch) == ([1], [])
    clock.now += 0.001
    assert stale_ranks(watch) == ([1], [1])


def test_a_lease_that_moves_is_never_stale_however_long_between_looks(clock: MovedClock) -> None:
    client = StoreClient(private_file_store(), 10)
    lease = held_lease(client, 1)
    watch = LeaseWatch(client, "job", 0, 2, SECONDS)
    for _ in range(5):
        assert stale_ranks(watch) == ([1], [])
        clock.now += 3 * SECONDS  # a waiter that looks late: what counts is a change
        lease.delivered()
    lease.finish(0)
    clock.now += 3 * SECONDS
    assert stale_ranks(watch) == ([], [])  # done: through, never stale
    assert stale_ranks(watch, phases=1) == ([1], [])  # ... unless a takeover came after


def test_a_rank_that_never_started_is_stale_after_lease_seconds(clock: MovedClock) -> None:
    client = StoreClient(private_file_store(), 10)
    watch = LeaseWatch(client, "job", 0, 3, SECONDS)
    held_lease(client, 2)
    assert stale_ranks(watch) == ([1, 2], [])
    clock.now += SECONDS
    assert stale_ranks(watch) == ([1, 2], [1, 2])


def test_a_stale_lease_taken_fences_its_holder(clock: MovedClock) -> None:
    client = StoreClient(private_file_store(), 10)
    lease = held_lease(client, 1)
    watch = LeaseWatch(client, "job", 0, 2, SECONDS)
    stale_ranks(watch)
    clock.now += SECONDS
    _, stale = watch.pending(watch.scan(), 0)
    [(rank, raw)] = stale
    old = watch.take(rank, raw)
    assert old is not None and old["status"] == "active" and old["state"] == 0
    other = LeaseWatch(client, "job", 2, 3, SECONDS)  # a third rank, as late
    assert other.take(rank, raw) is None  # only one taker
    assert stale_ranks(watch) == ([], [])  # taken: through
    with pytest.raises(LeaseLost, match="taken over by rank 0"):
        lease.delivered()
    assert lease.lost


def test_a_full_state_is_due_every_so_many_seconds_or_items(clock: MovedClock) -> None:
    client = StoreClient(private_file_store(), 10)
    lease = held_lease(client, 0)
    lease.publish_state('{"at": 1}')
    clock.now += STATE_EVERY_SECONDS - 0.001
    assert not lease.due()
    clock.now += 0.001
    assert lease.due()
    lease.publish_state('{"at": 2}')
    for _ in range(STATE_EVERY_ITEMS - 1):
        lease.delivered()
    assert not lease.due()
    lease.delivered()
    assert lease.due()


def test_a_rank_waiting_a_whole_lease_for_its_pipeline_stops_renewing(clock: MovedClock) -> None:
    held = held_lease(StoreClient(private_file_store(), 10), 0)
    gate = threading.Event()

    def slow_items() -> Iterator[int]:
        yield 1
        gate.wait(30)  # the pipeline stalls here (a stopped DataLoader worker)
        yield 2

    pulled = held.pulled_from(slow_items())
    assert next(pulled) == 1 and not held.stuck()  # between items: the loop's own work
    waiter = threading.Thread(target=lambda: next(pulled))
    waiter.start()
    try:
        deadline = time.monotonic() + 30
        while held._pulling_since is None and time.monotonic() < deadline:
            time.sleep(0.01)
        clock.now += SECONDS - 0.1
        assert not held.stuck()  # waiting less than a lease: still progress
        clock.now += 0.2
        assert held.stuck()  # a whole lease without an item: renewals stop
    finally:
        gate.set()
        waiter.join(30)
    assert not waiter.is_alive() and not held.stuck()
