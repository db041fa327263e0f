"""One consumer's side of an epoch's dynamic dispatch: its units, its claims, its current unit.

A :class:`Dispatcher` is the consumer's ``ctx.work`` (a
:class:`nodes.consumer_work.ConsumerWork` that claims on demand): a source asks it
for its plan as after an elastic resume,
and it answers with the unit the source's :class:`DispatchedSourceNode` claimed
last. Claims go through the store (``add`` on one counter per source: the
counter's old value is the unit's index, so no unit is handed out twice), and
each is recorded under the consumer's own key (``append``) before the unit is
read, where a Loader finds the claims of its DataLoader workers.

Replaying a checkpoint (``recorded``: the claims the consumer had made), the
dispatcher hands those out again instead, and notes which ones the consumer
reached (``reached``): the units nobody reached are what the epoch still had
to hand out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from nodes.consumer_work import ConsumerWork
from nodes.dispatch.store import StoreClient
from nodes.dispatch.units import units_of
from nodes.elastic import Piece, Work
from nodes.errors import InvalidStateError


@dataclass
class DispatchSpec:
    """What every consumer of one epoch's dynamic dispatch shares.

    ``key``: this epoch's namespace in the store (a Loader's run, the epoch, the
    attempt); ``work``: the epoch's work per source place, whole or what a
    resume left; ``consumers`` and ``unit_items`` size the units.
    """

    client: StoreClient | None
    key: str
    epoch: int
    consumers: int
    unit_items: int
    work: Work = field(default_factory=dict)
    #: Consumers per rank when claims go through lists a taker can seal (leases, see
    #: :func:`sealable_claim`), else 0: claims are one ``add`` on a counter.
    sealable_per_rank: int = 0
    _units: dict[str, list[list[Piece]]] = field(default_factory=dict, repr=False, compare=False)

    def units(self, place: str) -> list[list[Piece]]:
        """Every unit of ``place``'s work (the same list in every process), cut once per
        process however many consumers' dispatchers share the spec."""
        units = self._units.get(place)
        if units is None:
            entry = self.work.get(place)
            units = (
                []
                if entry is None
                else units_of(entry["kind"], entry["pieces"], self.consumers, self.unit_items)
            )
            self._units[place] = units
        return units

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_units": {}}  # workers cut their own: no large pickles


def claims_key(key: str, place: str, consumer: int) -> str:
    return f"{key}/claims/{place}/{consumer}"


def counter_key(key: str, place: str) -> str:
    """The store key whose ``add`` hands out ``place``'s next unit (claims without leases)."""
    return f"{key}/next/{place}"


def epoch_keys(key: str, places: list[str], consumers: int) -> list[str]:
    """The claim keys an epoch's dispatch under ``key`` may have made: each place's counter
    and claim list, and each consumer's claims of it."""
    keys = []
    for place in places:
        keys += [counter_key(key, place), claim_list_key(key, place)]
        keys += [claims_key(key, place, consumer) for consumer in range(consumers)]
    return keys


def claim_list_key(key: str, place: str) -> str:
    """The store key of ``place``'s sealable claim list (claims under leases)."""
    return f"{key}/list/{place}"


#: A sealable claim list's entry that seals a rank: no consumer of it claims after it.
SEAL = "S"


def claimants(raw: bytes | str | None) -> list[str]:
    """The entries of a sealable claim list, in the order the store appended them: claims
    ``"<rank>.<consumer>.<its claims before>"`` and seals ``"S<rank>"``."""
    text = raw.decode() if isinstance(raw, bytes) else (raw or "")
    return [entry for entry in text.split(",") if entry]


def unit_owners(entries: list[str]) -> list[int]:
    """The consumer that claimed each unit, in unit order: the i-th claim that counts
    claimed unit i. A seal claims nothing, and nor does any later entry of the rank it
    seals (that consumer finds itself sealed and reads nothing). Units past the work's
    last are claims that found every unit taken."""
    sealed: set[str] = set()
    owners = []
    for entry in entries:
        if entry.startswith(SEAL):
            sealed.add(entry[len(SEAL) :])
            continue
        rank, consumer, _ = entry.split(".")
        if rank not in sealed:
            owners.append(int(consumer))
    return owners


def claims_in(entries: list[str], consumer: int) -> list[int]:
    """The units ``consumer`` claimed in a sealable claim list (see :func:`unit_owners`)."""
    return [unit for unit, owner in enumerate(unit_owners(entries)) if owner == consumer]


def sealable_claim(
    client: StoreClient, key: str, consumer: int, rank: int, units: int, before: int
) -> int | None:
    """Claim the next of ``units`` units in the sealable claim list ``key``: the unit, or
    ``None`` when the list seals ``rank`` or every unit was claimed. ``before``: the
    claims this consumer made in the list before (it makes the entry unique: a
    ``FileStore`` drops an append equal to the whole value it holds).

    The claim is appended (the store orders appends), then the list is read: the claims
    that count before this one are its unit (:func:`unit_owners`). Two requests whatever
    the number of consumers claiming at once, and a taker that appended a seal before
    this claim sees the same list: a consumer of a rank whose lease was taken over never
    reads a unit its taker did not see."""
    mine = f"{rank}.{consumer}.{before}"
    client.append(key, f"{mine},")
    entries = claimants(client.get(key))
    earlier = entries[: entries.index(mine)]
    if f"{SEAL}{rank}" in earlier:
        return None
    unit = len(unit_owners(earlier))
    return unit if unit < units else None


def seal(client: StoreClient, key: str, rank: int) -> list[str]:
    """Seal ``rank``'s claims on the sealable claim list ``key``; the list's entries then
    (sealing again is harmless: a later seal changes nothing)."""
    client.append(key, f"{SEAL}{rank},")
    return claimants(client.get(key))


def recorded_claims(client: StoreClient, key: str, place: str, consumer: int) -> list[int]:
    """The units ``consumer`` claimed of ``place``, in order, as the store recorded them."""
    raw = client.get_or_none(claims_key(key, place, consumer))
    return [int(unit) for unit in raw.decode().split(",") if unit] if raw else []


class Dispatcher(ConsumerWork):
    """One consumer's view of an epoch's dynamic dispatch (see the module doc)."""

    claims_on_demand = True

    def __init__(
        self, spec: DispatchSpec, consumer: int, recorded: dict[str, list[int]] | None = None
    ) -> None:
        self.consumer = consumer
        self._recorded = recorded
        self.use(spec)

    def use(self, spec: DispatchSpec) -> None:
        """Hand out ``spec``'s units from now on (a Loader's next epoch, same graph)."""
        self.spec = spec
        self._current: dict[str, int] = {}
        #: The claims each source reached (its own list, which grows), by place.
        self.reached: dict[str, list[int]] = {}
        #: The places whose source a replay asked for its untouched data: the inputs the
        #: consumer's graph had not finished (a concat's earlier inputs are not asked).
        self.live: set[str] = set()
        #: Units claimed through the store, and the seconds those claims took, by source
        #: place (one dispatcher serves every source of the consumer's graph).
        self.claimed: dict[str, int] = {}
        self.wait_seconds: dict[str, float] = {}

    # ----- what a source reads (Context.plan_for) ----------------------------------------
    @property
    def epoch(self) -> int:
        return self.spec.epoch

    def plan_for(self, place: str) -> list[Any]:
        """The pieces of the unit the source at ``place`` reads now (``[]``: none yet)."""
        unit = self._current.get(place)
        return [] if unit is None else self.units(place)[unit]

    def units(self, place: str) -> list[list[Piece]]:
        """Every unit of ``place``'s work this epoch (see :meth:`DispatchSpec.units`)."""
        return self.spec.units(place)

    def point_at(self, place: str, unit: int) -> None:
        self._current[place] = unit

    # ----- claiming ----------------------------------------------------------------------
    def claim(self, place: str, claimed_before: int) -> int | None:
        """The next unit of ``place`` for this consumer, or ``None`` when none is left.

        ``claimed_before``: how many this consumer claimed of it before (a replay hands
        out the recorded claim at that index).
        """
        if self._recorded is not None:
            mine = self._recorded.get(place, [])
            return mine[claimed_before] if claimed_before < len(mine) else None
        count = len(self.units(place))
        if not count:
            return None
        client = self.spec.client
        assert client is not None
        started = perf_counter()
        if self.spec.sealable_per_rank:
            rank = self.consumer // self.spec.sealable_per_rank
            key = claim_list_key(self.spec.key, place)
            listed = sealable_claim(client, key, self.consumer, rank, count, claimed_before)
            unit = count if listed is None else listed  # sealed, or none left
        else:
            unit = client.add(counter_key(self.spec.key, place), 1) - 1
        if unit < count:  # recorded before it is read: a checkpoint finds it
            client.append(claims_key(self.spec.key, place, self.consumer), f"{unit},")
            self.claimed[place] = self.claimed.get(place, 0) + 1
        waited = perf_counter() - started
        self.wait_seconds[place] = self.wait_seconds.get(place, 0.0) + waited
        return unit if unit < count else None

    def note_reached(self, place: str, claims: list[int]) -> None:
        """``claims`` (the source's own list, which grows) are the units it reached.

        Replaying a checkpoint, they must be the first of the consumer's recorded claims
        (the store records each claim before its unit is read).
        """
        if self._recorded is not None:
            mine = self._recorded.get(place, [])
            if claims != mine[: len(claims)]:
                raise InvalidStateError(
                    "node.claims",
                    f"the first claims of consumer {self.consumer}'s dispatch record {mine}",
                    claims,
                )
        self.reached[place] = claims

    def note_live(self, place: str) -> None:
        """The source at ``place`` was asked what it had not read: its input was not done."""
        self.live.add(place)
