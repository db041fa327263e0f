"""Packing token ids into sequences of one length, for language-model training.

Two packers, both exact on resume with a state of positions, never tokens:

* ``"concat"``: documents one after another, cut every ``seq_len`` tokens; a
  document may span sequences. State: where the document that the next
  sequence starts in was read from, and how many of its tokens were delivered.
* ``"first_fit"``: documents kept whole (one longer than ``seq_len`` gives
  its full ``seq_len`` chunks first, then its rest is packed like a short
  document), placed in the first of ``bins`` open sequences with room; when
  a document fits none of ``bins`` open sequences, all of them are emitted
  (padded) in order and a new round starts with that document (the rounds of
  Grain's first-fit packer). State: where the round started and how many of
  its sequences were delivered; a resume reads the round again.

Every sequence is a dict of numpy arrays: ``input_ids`` (``seq_len``,
int64), ``labels`` (``input_ids`` with ``-100`` at padding and at the first
token of every segment: a model that shifts labels does not predict a
document's start from another document), ``position_ids`` (restarting at 0
at every segment: the piece of one document inside the sequence, padding
included as a segment of its own) and ``cu_seqlens`` (int32, the segments'
bounds ``[0, l1, l1 + l2, ..., seq_len]``, what variable-length attention
takes; ``dp.default_collate`` concatenates them for a batch).

On another topology (elastic resume) the rest of a document that was partly
delivered is handed on as that document's item with a selection of its
tokens (``{"from": k, "upto": n}`` on the source's piece, see
:mod:`nodes.elastic`), so every token of the epoch is delivered once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from nodes import elastic as el
from nodes.base import UPSTREAM, Node, NotReset, State
from nodes.errors import InvalidStateError
from nodes.origins import OriginReader, refuse_random_map
from nodes.state_checks import at, expect_int, expect_keys

METHODS = ("concat", "first_fit")
#: The label of a token no loss is computed on (PyTorch's cross_entropy ignore_index).
IGNORE = -100
_END = object()
_PRIMED = object()  # the generator read what a conversion's reset needs (see reset)


def check_pack_args(seq_len: Any, method: Any, bins: Any, pad_id: Any) -> None:
    if type(seq_len) is not int or seq_len < 1:
        raise ValueError(f"pack seq_len must be an int >= 1, got {seq_len!r}")
    if method not in METHODS:
        raise ValueError(f"pack method must be one of {list(METHODS)}, got {method!r}")
    if type(bins) is not int or bins < 1:
        raise ValueError(f"pack bins must be an int >= 1, got {bins!r}")
    if type(pad_id) is not int:
        raise ValueError(f"pack pad_id must be an int, got {pad_id!r}")


def check_origins(pack: Node, up: Node) -> None:
    """Refuse partly delivered documents where the steps below ``pack`` cannot say which
    source item each document came from (a buffer shuffle, a flat_map: they would need
    notes), or a ``.shard()`` stream hands them out (in stream order only)."""
    if not up.plain_origins():
        raise el.refuse(
            pack,
            "was in the middle of a document, and a step below it (a buffer shuffle, a "
            "flat_map) cannot say which document each of its items is, so the rest of that "
            "document cannot be handed to another consumer; shuffle with the source "
            "(.shuffle() without buffer_size on a sequence, or files' order) instead",
        )
    for part in el.sources_and_nodes(up):
        if part.elastic == "source" and part.elastic_kind == el.STREAM:
            raise el.refuse(
                pack,
                "was in the middle of a document of a .shard() stream, which hands its "
                "items out in stream order only",
            )


def _token_ids(tokens: Any, field: str) -> np.ndarray:
    """A document's ids as a 1-d int array; anything else a ``TypeError`` saying what it got."""
    try:
        array = np.asarray(tokens)
    except (ValueError, TypeError):  # ragged lists
        array = None
    if array is not None and array.size == 0 and array.ndim == 1:
        return array.astype(np.int64)  # [] is float64 to numpy
    if array is None or array.ndim != 1 or array.dtype.kind not in "iu":
        got = "ragged lists" if array is None else f"{array.dtype} of shape {array.shape}"
        raise TypeError(
            f"pack takes documents of token ids (1-d ints, such as tokenize gives in "
            f"{field!r}), got {got}"
        )
    return array


class _Doc:
    """A document being packed: its tokens (after a selection), where they start among the
    document's own tokens, and (while converting) its origin."""

    __slots__ = ("tokens", "start", "origin")

    def __init__(self, tokens: np.ndarray, start: int, origin: Any) -> None:
        self.tokens, self.start, self.origin = tokens, start, origin


class PackNode(Node):
    """Packs documents' token ids into sequences of ``seq_len`` (see the module doc).

    An item is a dict holding ``field`` (token ids: a list, an array or a
    tensor, such as ``tokenize`` gives) or the ids themselves. An empty
    document adds nothing; the last sequence of an epoch is padded with
    ``pad_id``, or dropped with ``drop_last=True`` (its tokens counted in
    ``Loader.dropped()``).
    """

    kind = "pack"
    elastic = "buffer"

    def __init__(
        self,
        upstream: Node,
        seq_len: int,
        *,
        method: str = "concat",
        field: str = "input_ids",
        pad_id: int = 0,
        bins: int = 8,
        drop_last: bool = False,
    ) -> None:
        super().__init__(upstream)
        check_pack_args(seq_len, method, bins, pad_id)
        self._up = upstream
        self._len, self._method, self._field = seq_len, method, field
        self._pad, self._bins, self._drop_last = pad_id, bins, drop_last
        self.drop_label = f"pack({seq_len}, drop_last=True) tokens"
        self._it: Iterator[Any] = NotReset(self)
        self._noting = False  # converting for another topology: note where documents came from

    # ----- reading documents --------------------------------------------------------------
    def _documents(self) -> Iterator[tuple[State, _Doc]]:
        """(upstream state before it, the document) for every document. After a topology
        change, a partly delivered document comes with a selection of its tokens on its
        origin, whenever it arrives (a mix may bring it late): only those are packed."""
        up, src = self._up, iter(self._up)
        noting, track, field = self._noting, self._track, self._field
        while True:
            before = up.state_dict()
            parent = next(src, _END)
            if parent is _END:
                self._end_state = before
                return
            tokens = _token_ids(parent[field] if isinstance(parent, dict) else parent, field)
            start = 0
            origin = up.last_origin() if noting or track else None
            if track and el.has_selection(origin[1]):
                kept = el.selected(origin[1], len(tokens))
                start = kept[0] if kept else len(tokens)
                if kept and kept != list(range(start, start + len(kept))):
                    raise InvalidStateError("plan", "a contiguous run of a document's tokens", kept)
                tokens = tokens[start : start + len(kept)]
            yield before, _Doc(tokens, start, origin)

    # ----- positions ----------------------------------------------------------------------
    def reset(self, state: State | None = None) -> None:
        self._up.reset(None if state is None else state[UPSTREAM])
        self._track = el.selections_below(self._up)
        if self._track:  # after a topology change: each document's origin says its selection
            check_origins(self, self._up)
        for part in el.sources_and_nodes(self._up):
            if hasattr(part, "note_origins"):
                part.note_origins(self._track)
        self.dropped = 0
        self._held: list[tuple[Any, int, int]] = []  # (doc origin, from, upto): converting
        self._last_segments: list[tuple[Any, int, int]] = []
        if self._method == "concat":
            offset = 0 if state is None else int(state["offset"])
            self._state: State = {UPSTREAM: state[UPSTREAM], "offset": offset} if state else {}
            self._it = self._concat(offset)
        else:
            emitted = 0 if state is None else int(state["emitted"])
            self._state = {UPSTREAM: state[UPSTREAM], "emitted": emitted} if state else {}
            self._it = self._first_fit(emitted)
        if self._noting:
            # Read now what was read before the state was taken (the document it is in the
            # middle of, the round's documents up to the sequences delivered), so that the
            # source's position moves past them and what they hold shows in in_flight.
            if next(self._it, _END) is not _PRIMED:
                raise AssertionError("a converting pack primes its generator")

    def _set_state(self, before: State, key: str, value: int) -> None:
        self._state = {UPSTREAM: before, key: value}

    def _concat(self, offset: int) -> Iterator[Any]:
        size, noting = self._len, self._noting
        parts: list[np.ndarray] = []
        segments: list[tuple[Any, int, int]] = []  # what the sequence holds (its origin)
        filled = 0
        if noting and not offset:
            yield _PRIMED  # nothing of the state's document was delivered: read nothing
        for before, doc in self._documents():
            tokens, count = doc.tokens, len(doc.tokens)
            position, offset = offset, 0
            if position:
                if position >= count:
                    raise InvalidStateError("offset", f"below {count} (its tokens)", position)
                if noting:
                    self._held = [(doc.origin, doc.start + position, doc.start + count)]
                    yield _PRIMED
            while position < count:
                take = min(size - filled, count - position)
                parts.append(tokens[position : position + take])
                segments.append((doc.origin, doc.start + position, doc.start + position + take))
                filled += take
                position += take
                if filled == size:
                    if position < count:
                        self._set_state(before, "offset", position)
                        if noting:
                            self._held = [(doc.origin, doc.start + position, doc.start + count)]
                    else:
                        self._set_state(self._up.state_dict(), "offset", 0)
                        self._held = []
                    self._last_segments = segments
                    yield self._sequence(parts)
                    parts, segments, filled = [], [], 0
            self._held = []
        self._set_state(self._end_state, "offset", 0)
        if filled:
            if self._drop_last:
                self.dropped += filled
                return
            self._last_segments = segments
            yield self._sequence(parts)

    def _first_fit(self, skip: int) -> Iterator[Any]:
        size, most, noting = self._len, self._bins, self._noting
        if noting and not skip:
            yield _PRIMED  # nothing of the state's round was delivered: read nothing
        docs = self._documents()
        entry = next(docs, None)
        while entry is not None:
            round_before = entry[0]
            bins: list[tuple[list[np.ndarray], list[tuple[Any, int, int]]]] = []
            room: list[int] = []
            count = 0  # sequences of the round emitted
            while entry is not None:
                doc = entry[1]
                tokens, length = doc.tokens, len(doc.tokens)
                full, tail = divmod(length, size)
                fits = -1
                if tail:
                    fits = next((i for i, free in enumerate(room) if free >= tail), -1)
                    if fits < 0 and len(bins) == most:
                        break  # the round ends before the document that fits no bin
                for chunk in range(full):
                    count += 1
                    if count < skip:
                        continue
                    stop = doc.start + (chunk + 1) * size
                    self._set_state(round_before, "emitted", count)
                    if noting:  # the round's bins, and the rest of this document
                        rest = [(doc.origin, stop, doc.start + length)]
                        self._held = [s for _, segs in bins for s in segs] + rest
                    if count == skip:
                        if noting:
                            yield _PRIMED
                        continue
                    self._last_segments = [(doc.origin, stop - size, stop)]
                    yield self._sequence([tokens[chunk * size : (chunk + 1) * size]])
                if tail:
                    if fits < 0:
                        bins.append(([], []))
                        room.append(size)
                    bins[fits][0].append(tokens[full * size :])
                    bins[fits][1].append((doc.origin, doc.start + full * size, doc.start + length))
                    room[fits] -= tail
                entry = next(docs, None)
            # The round ends (a document fit no bin, or the epoch ended): its bins go out.
            for index, (parts, segments) in enumerate(bins):
                count += 1
                if count < skip:
                    continue
                if index == len(bins) - 1:  # delivered: the next round starts before `entry`
                    if entry is None:
                        self._set_state(self._end_state, "emitted", 0)
                    else:
                        self._set_state(entry[0], "emitted", 0)
                else:
                    self._set_state(round_before, "emitted", count)
                if noting:
                    self._held = [s for _, segs in bins[index + 1 :] for s in segs]
                    if entry is not None:
                        doc = entry[1]
                        self._held.append((doc.origin, doc.start, doc.start + len(doc.tokens)))
                if count == skip:
                    if noting:
                        yield _PRIMED
                    continue
                self._last_segments = segments
                yield self._sequence(parts)
            if count < skip:
                raise InvalidStateError("emitted", f"at most {count} (the round's sequences)", skip)
            skip = 0
        self._set_state(self._end_state, "emitted", 0)
        self._held = []

    def _sequence(self, parts: list[np.ndarray]) -> dict[str, np.ndarray]:
        size = self._len
        lengths = [len(p) for p in parts if len(p)]
        filled = sum(lengths)
        ids = np.empty(size, dtype=np.int64)
        if len(parts) == 1:
            ids[:filled] = parts[0]
        elif parts:
            np.concatenate(parts, out=ids[:filled], casting="unsafe")
        if filled < size:
            ids[filled:] = self._pad
            lengths.append(size - filled)
        bounds = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=bounds[1:])
        starts = bounds[:-1]
        positions = np.arange(size, dtype=np.int64) - np.repeat(starts, lengths)
        labels = ids.copy()
        labels[starts] = IGNORE
        if filled < size:
            labels[filled:] = IGNORE
        return {"input_ids": ids, "labels": labels, "position_ids": positions, "cu_seqlens": bounds}

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def state_dict(self) -> State:
        if not self._state:  # nothing read since reset(None)
            key = "offset" if self._method == "concat" else "emitted"
            self._state = {UPSTREAM: self._up.state_dict(), key: 0}
        return {**self._state}

    def validate_state(self, state: Any, path: str = "node") -> None:
        key = "offset" if self._method == "concat" else "emitted"
        expect_keys(state, path, {UPSTREAM, key})
        expect_int(state, key, path)  # checked against the documents when they are read
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))

    # ----- elastic resume (nodes.elastic) ---------------------------------------------------
    def begin_conversion(self) -> None:
        self._noting = True

    def _origins(self, segments: list[tuple[Any, int, int]]) -> list[Any]:
        out = []
        for origin, start, stop in segments:
            if stop <= start:
                continue
            if origin[0] == el.BATCH:
                raise el.refuse(self, "packs batches: unbatch them first")
            check_origins(self, self._up)
            place, piece = origin
            whole = {k: v for k, v in piece.items() if k not in ("outputs", "from", "upto")}
            out.append((place, {**whole, "from": start, "upto": stop}))
        return out

    def last_origin(self) -> Any:
        """Where the last sequence's tokens came from: a batch of document pieces."""
        return (el.BATCH, self._origins(self._last_segments))

    def origin_reader(self) -> OriginReader:
        raise refuse_random_map(self, "packs many documents into one item", "before the pack")

    def in_flight(self) -> list[Any]:
        """The tokens read and not delivered: the rest of a document (concat), the documents
        of the round not emitted yet (first_fit)."""
        return self._origins(self._held)
