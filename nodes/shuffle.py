"""Buffer shuffle for streams, with exact resume by bounded replay."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from nodes.base import Context, Node, NotReset, State
from nodes.rng import UniformStream


class BufferShuffleNode(Node):
    """Shuffles a stream through a buffer of ``buffer_size`` items.

    The buffer fills with the first ``buffer_size`` items; after that each new
    item replaces a uniformly drawn slot whose occupant is emitted. When the
    stream ends the buffer drains in random order. Draws come from a seekable
    stream keyed by (seed, epoch, node, consumer): nothing global is touched.

    **State** holds positions, never items: an *anchor* (upstream's state at
    some earlier point, and how many items had been read then), how many items
    have been read since, the draw counter, and, for each buffer slot, which
    item (by its read count) sits there: ``buffer_size`` integers. Taking a
    state copies that list of integers (one C-level copy, O(buffer_size)).

    **Resume** resets upstream to the anchor and re-reads forward to the
    current position, keeping the items that were in the buffer. Anchors are
    recorded every ``buffer_size`` items and dropped once no buffered item is
    older, so the replay is the age of the oldest buffered item plus at most
    ``buffer_size``: about ``buffer_size * ln(buffer_size)`` items, whatever
    the position in the epoch (an item survives ``m`` replacements with
    probability ``(1 - 1/buffer_size) ** m``; measured: 600 reads for a
    buffer of 100, 6,000-8,000 for a buffer of 1,000).
    """

    def __init__(
        self, upstream: Node, buffer_size: int, ctx: Context, key: int, seed: int | None = None
    ) -> None:
        super().__init__(upstream)
        if buffer_size < 1:
            raise ValueError(f"shuffle buffer_size must be at least 1, got {buffer_size}")
        self._up = upstream
        self._size = buffer_size
        self._ctx = ctx
        self._key = key
        self._seed = seed
        self._anchor_every = max(buffer_size, 64)
        self._src: Iterator[Any] = NotReset(self)

    def reset(self, state: State | None = None) -> None:
        key = self._ctx.random_key(self._key, self._ctx.consumer_index, seed=self._seed)
        self._draws = UniformStream(key)
        self._draw = self._draws.next
        if state is None:
            self._up.reset(None)
            self._seq = 0
            self._anchors = deque([(0, self._up.state_dict())])
            self._buffer: list[Any] = []
            self._slots: list[int] = []
            self._exhausted = False
        else:
            self._restore(state)
        self._src = iter(self._up)
        self._countdown = max(1, self._anchor_every - (self._seq - self._anchors[-1][0]))

    def _restore(self, state: State) -> None:
        anchor_seq, anchor_state = int(state["anchor_seq"]), state["anchor"]
        self._up.reset(anchor_state)
        self._seq = int(state["seq"])
        self._slots = [int(seq) for seq in state["slots"]]
        slot_of = {seq: slot for slot, seq in enumerate(self._slots)}
        self._buffer = [None] * len(self._slots)
        src = iter(self._up)
        for seq in range(anchor_seq, self._seq):
            item = next(src)
            slot = slot_of.get(seq)
            if slot is not None:
                self._buffer[slot] = item
        self._anchors = deque([(anchor_seq, anchor_state)])
        self._draws.seek(int(state["draws"]))
        self._exhausted = bool(state["exhausted"])

    def _add_anchor(self) -> None:
        self._countdown = self._anchor_every
        self._anchors.append((self._seq, self._up.state_dict()))
        oldest = min(self._slots) if self._slots else self._seq
        anchors = self._anchors
        while len(anchors) > 1 and anchors[1][0] <= oldest:
            anchors.popleft()

    def _read(self) -> Any:
        item = next(self._src)
        self._seq += 1
        self._countdown -= 1
        if not self._countdown:
            self._add_anchor()
        return item

    def __next__(self) -> Any:
        buffer = self._buffer
        if not self._exhausted:
            try:
                while len(buffer) < self._size:
                    buffer.append(self._read())
                    self._slots.append(self._seq - 1)
                item = self._read()
            except StopIteration:
                self._exhausted = True
            else:
                slot = int(self._draw() * self._size)
                out = buffer[slot]
                buffer[slot] = item
                self._slots[slot] = self._seq - 1
                return out
        if not buffer:
            raise StopIteration
        slot = int(self._draw() * len(buffer))
        out = buffer[slot]
        last, last_seq = buffer.pop(), self._slots.pop()
        if slot < len(buffer):
            buffer[slot] = last
            self._slots[slot] = last_seq
        return out

    def state_dict(self) -> State:
        # anchors[0] is never newer than the oldest buffered item: anchors are
        # pruned against min(slots), and that minimum only grows.
        anchor_seq, anchor_state = self._anchors[0]
        return {
            "anchor": anchor_state,
            "anchor_seq": anchor_seq,
            "seq": self._seq,
            "slots": list(self._slots),
            "draws": self._draws.position(),
            "exhausted": self._exhausted,
        }
