"""Leases: a rank's hold on the units it claimed, which the others take over if it stalls.

Under dynamic dispatch with ``dispatch_lease_seconds`` every rank holds a lease
on its epoch's claims: one key in the store, ``{epoch key}/lease/{rank}``,
whose value says where the rank's delivery stands. The holder rewrites it with
``compare_set`` *before* it hands each item to the training loop (write-ahead),
and a thread renews it (a heartbeat) while the rank makes progress: while the
training loop works between items, and while the rank waits less than a lease
for its pipeline's next item (a stalled DataLoader worker or a hung read stops
the renewals, so the rank is taken over like a stopped one). Because
every write names the value it replaces, the lease is also its own fence: once
another rank took it over (a ``compare_set`` of its own), the holder's next
write fails, and the item it was about to deliver is dropped, never delivered
twice.

A value is a small JSON object:

- ``status``: ``"active"`` (the rank is delivering), ``"done"`` (it delivered
  everything it claimed, ``phases`` takeovers seen), ``"taken"`` (``by`` rank; ``was``:
  the value it took, so that another rank can take it again if the taker stops before
  it published the work);
- ``beat``: the generation, +1 on every write, so a rank that stopped can be
  told from one that kept the same position;
- ``state``, ``since``: the rank's full position is published under
  ``{lease}/state/{state % 2}`` (two slots, each text led by its number, so a
  rank's keys stay bounded; a taker reads the slot the value names, which the
  holder cannot overwrite without first writing the lease again) every so many
  items (a Loader state, which costs
  ~0.1-0.4 ms), and ``since`` counts the items delivered after it (a write of a
  few bytes per item): a taker restores that state and replays ``since`` items,
  as a resume replays the items after a DataLoader snapshot.

A rank that finished its claims waits for the other ranks' leases: a lease that
stays the same for ``lease_seconds`` (by the waiter's clock) is stale, and the
waiter takes it over (see :mod:`datapipes.dispatch.takeover`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from nodes.dispatch.store import StoreClient
from nodes.errors import InvalidStateError

#: Statuses of a lease value.
ACTIVE, DONE, TAKEN = "active", "done", "taken"
#: The position of a rank that never took its lease (taken before it started its epoch).
NEVER_STARTED: dict[str, Any] = {"status": ACTIVE, "beat": -1, "state": -1, "since": 0, "phase": -1}
#: A full state is published at least every this many items delivered...
STATE_EVERY_ITEMS = 64
#: ... and at least every this many seconds (bounds the items a taker replays).
STATE_EVERY_SECONDS = 1.0

#: The clock that ages leases and published states: a test replaces it (``monkeypatch``)
#: with one it moves itself, so that staleness does not depend on how loaded the machine
#: is. Read at each use, never bound at import.
clock: Callable[[], float] = time.monotonic


class LeaseLost(RuntimeError):
    """This rank's lease was taken over: another rank delivers what it had claimed."""

    def __init__(self, rank: int, value: dict[str, Any]) -> None:
        self.taken_by = value.get("by")
        super().__init__(
            f"rank {rank}'s dispatch lease was taken over by rank {self.taken_by}: it went "
            "longer than dispatch_lease_seconds without renewing it (stopped, frozen or "
            "cut off), so that rank now delivers the rest of this rank's units"
        )


def state_key(lease: str, number: int) -> str:
    """Where a lease's published state ``number`` lives: one of two slots."""
    return f"{lease}/state/{number % 2}"


def lease_key(key: str, rank: int) -> str:
    return f"{key}/lease/{rank}"


#: What a lease taken over adds to the changes counter (one done adds 1): both counts
#: in one number, read in one request.
TAKEN_CHANGE = 1 << 32


def changes_key(key: str) -> str:
    """The counter of the leases' ends in epoch key ``key``: +1 when one is done,
    +``TAKEN_CHANGE`` when one is taken over. A waiting rank reads it (one small request)
    and looks at every lease only when a takeover happened, when enough leases ended for
    its epoch to be over, or every quarter of a lease (to tell a stale one)."""
    return f"{key}/changes"


def takeover_key(key: str, rank: int) -> str:
    """Where the work of ``rank``'s takeover phase is published (epoch key ``key``)."""
    return f"{key}/takeover/{rank}"


def encode(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def decode(raw: bytes | None, where: str) -> dict[str, Any] | None:
    """A lease value read from the store, or ``None`` for none; a damaged one is an error."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as error:
        raise ValueError(f"dispatch lease {where} holds no JSON ({raw[:60]!r})") from error
    if (
        not isinstance(value, dict)
        or value.get("status") not in (ACTIVE, DONE, TAKEN)
        or type(value.get("beat")) is not int
    ):
        raise ValueError(f"dispatch lease {where} is damaged: {raw[:200]!r}")
    return value


class Lease:
    """The holder's side: this rank's lease in one epoch (see the module doc).

    ``publish_state(text)`` publishes a full position (and resets ``since``),
    ``delivered()`` notes one more item; both raise :class:`LeaseLost` when the
    lease was taken over. ``finish(phases)`` marks it done; ``resume()`` makes a
    done lease active again (the rank reads a taken-over rank's units).
    """

    def __init__(self, client: StoreClient, key: str, rank: int, lease_seconds: float) -> None:
        self.client, self.rank = client, rank
        self.key = lease_key(key, rank)
        self._changes = changes_key(key)
        self.lease_seconds = lease_seconds
        self._lock = threading.Lock()
        self._value: dict[str, Any] = {"status": ACTIVE, "beat": 0, "state": -1, "since": 0}
        self._text = ""  # what the store holds now (to compare_set against)
        self._lost: dict[str, Any] | None = None
        self._published_at = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: When the rank began waiting for its pipeline's next item (``None``: not waiting).
        self._pulling_since: float | None = None

    # ----- writes (each one a compare_set against the last) --------------------------------
    def _write(self, **changes: Any) -> None:
        with self._lock:
            if self._lost is not None:
                raise LeaseLost(self.rank, self._lost)
            value = {**self._value, **changes, "beat": self._value["beat"] + 1}
            text = encode(value)
            now = self.client.compare_set(self.key, self._text, text).decode()
            if now != text:
                self._lost = decode(now.encode(), self.key) or {"by": None}
                self._stop.set()
                raise LeaseLost(self.rank, self._lost)
            self._value, self._text = value, text

    def start(self, state_text: str) -> None:
        """Take the lease at ``state`` (a taker may have fenced it already: LeaseLost), or
        continue holding it (the same epoch iterated again after ``close()``)."""
        if self._text:
            self.publish_state(state_text)
        else:
            self.client.set(state_key(self.key, 0), f"0:{state_text}")
            self._write(status=ACTIVE, state=0, since=0, phase=-1, phases=0)
            self._published_at = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, args=(self._stop,), name=f"datapipes-lease-{self.rank}",
            daemon=True,
        )  # fmt: skip
        self._thread.start()

    def due(self) -> bool:
        """Whether the next item should publish a full state (see the module doc)."""
        return (
            self._value["since"] >= STATE_EVERY_ITEMS
            or clock() - self._published_at >= STATE_EVERY_SECONDS
        )

    def publish_state(self, state_text: str, *, phase: int | None = None) -> None:
        """Publish ``state_text`` as the position (before the item it covers is delivered)."""
        number = self._value["state"] + 1
        self.client.set(state_key(self.key, number), f"{number}:{state_text}")
        changes: dict[str, Any] = {"status": ACTIVE, "state": number, "since": 0}
        if phase is not None:
            changes["phase"] = phase
        self._write(**changes)
        self._published_at = clock()

    def renew(self) -> None:
        """Write the lease again as it is (a heartbeat); :class:`LeaseLost` if it was taken."""
        self._write()

    def delivered(self) -> None:
        """One more item is about to be delivered after the published state."""
        self._write(since=self._value["since"] + 1)

    def finish(self, phases: int) -> None:
        """Everything claimed was delivered; ``phases`` takeovers were seen (and read)."""
        self._write(status=DONE, phases=phases)
        self.client.add(self._changes, 1)

    def is_done(self, phases: int) -> bool:
        """Whether the lease says done, having seen ``phases`` takeovers."""
        return self._value["status"] == DONE and self._value.get("phases") == phases

    def close(self) -> None:
        self._stop.set()

    def pulled_from(self, items: Iterable[Any]) -> Iterator[Any]:
        """``items``, noting while the rank waits for the next one: a rank that waits longer
        than the lease for its pipeline (a stalled DataLoader worker, a hung read) stops
        renewing, so the others take it over; the training loop's own work between items
        (a long step) keeps renewing."""
        iterator = iter(items)
        while True:
            self._pulling_since = clock()
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                self._pulling_since = None
            yield item

    def stuck(self) -> bool:
        """Whether the rank has waited for its pipeline's next item for a whole lease."""
        since = self._pulling_since
        return since is not None and clock() - since >= self.lease_seconds

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def _beat(self, stop: threading.Event) -> None:
        """Renew the lease while the rank makes progress: while the training loop works
        between items, or waits for an item less than a lease (see :meth:`pulled_from`)."""
        interval = self.lease_seconds / 4
        while not stop.wait(interval):
            try:
                if self._value["status"] == ACTIVE and not self.stuck():
                    self.renew()
            except LeaseLost:
                return
            except Exception:  # noqa: BLE001 - the store is gone: the next item says so
                return


@dataclass
class LeaseWatch:
    """A waiting rank's view of the other ranks' leases: which are stale, and taking one."""

    client: StoreClient
    key: str
    rank: int
    world_size: int
    lease_seconds: float
    _seen: dict[int, tuple[bytes, float]] = field(default_factory=dict)

    def read(self, rank: int) -> tuple[bytes, dict[str, Any] | None]:
        raw = self.client.get_or_none(lease_key(self.key, rank)) or b""
        return raw, decode(raw, lease_key(self.key, rank))

    def changes(self) -> tuple[int, int]:
        """``(leases taken over, leases done)`` so far in the epoch (a lease that reads a
        takeover phase is done again after it): one request, a few bytes."""
        value = self.client.add(changes_key(self.key), 0)
        return divmod(value, TAKEN_CHANGE)

    def scan(self) -> dict[int, tuple[bytes, dict[str, Any] | None]]:
        """Every other rank's lease: ``{rank: (raw value, decoded or None)}``, read in two
        round trips to the store whatever the number of ranks."""
        ranks = [rank for rank in range(self.world_size) if rank != self.rank]
        keys = [lease_key(self.key, rank) for rank in ranks]
        values = self.client.get_all_or_none(keys)
        return {
            rank: (raw or b"", decode(raw or b"", key))
            for rank, key, raw in zip(ranks, keys, values, strict=True)
        }

    def pending(
        self, leases: dict[int, tuple[bytes, dict[str, Any] | None]], phases: int
    ) -> tuple[list[int], list[tuple[int, bytes]]]:
        """``(ranks still delivering, stale ones with the value seen)`` among ``leases``:
        a rank is through when its lease is taken, or done having seen ``phases``
        takeovers. A lease is stale when it stayed the same for ``lease_seconds``."""
        waiting, stale = [], []
        for rank, (raw, value) in leases.items():
            if value is not None and (
                value["status"] == TAKEN
                or (value["status"] == DONE and value.get("phases", 0) >= phases)
            ):
                continue
            waiting.append(rank)
            if self.unchanged_for_a_lease(rank, raw):
                stale.append((rank, raw))
        return waiting, stale

    def unchanged_for_a_lease(self, rank: int, raw: bytes) -> bool:
        """Whether ``rank``'s lease has held ``raw`` for ``lease_seconds`` (by this rank's
        clock, from the first look that saw it)."""
        now = clock()
        seen = self._seen.get(rank)
        if seen is None or seen[0] != raw:
            self._seen[rank] = (raw, now)
            return False
        return now - seen[1] >= self.lease_seconds

    def take(self, rank: int, raw: bytes) -> dict[str, Any] | None:
        """Take ``rank``'s lease if it still holds ``raw``: the position it held then (what
        its taker delivers the rest of), else ``None``.

        ``raw`` may itself be a taken lease whose taker stopped before it published the
        work it took (see :meth:`datapipes.dispatch.takeover.Takeovers._published_work`):
        the lease is taken again, and the position is the one the first taker took, which
        the taken value carries (``was``)."""
        old = decode(raw, lease_key(self.key, rank))
        beat = old["beat"] + 1 if old is not None else 0
        was = NEVER_STARTED if old is None else old.get("was") if old["status"] == TAKEN else old
        if not isinstance(was, dict):
            where = lease_key(self.key, rank)
            raise ValueError(f"dispatch lease {where} is damaged: {raw[:200]!r}")
        taken = encode({"status": TAKEN, "by": self.rank, "beat": beat, "was": was})
        now = self.client.compare_set(lease_key(self.key, rank), raw.decode(), taken).decode()
        if now != taken:
            return None
        self.client.add(changes_key(self.key), TAKEN_CHANGE)
        return was

    def state_text(self, rank: int, number: int) -> str | None:
        raw = self.client.get_or_none(state_key(lease_key(self.key, rank), number))
        if raw is None:
            return None
        found, _, text = raw.decode().partition(":")
        if found != str(number):  # the holder cannot reuse the slot while the lease names it
            raise InvalidStateError(
                f"dispatch lease {rank} state {number}",
                f"the state numbered {number}",
                found[:20],
                note="the lease's published position was changed or damaged in the store",
            )
        return text
