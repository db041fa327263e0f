"""Tokenizing text records in blocks: one tokenizer call for many documents.

A fast tokenizer (Hugging Face ``tokenizers``) encodes a list of texts in one
call on threads of its own, without the GIL; calling it once per document
loses that. :class:`TokenizeNode` reads a block of records, encodes their
texts in one call and returns them one by one, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Any

import numpy as np

from nodes.base import UPSTREAM, Node, NotReset, State
from nodes.errors import InvalidStateError, add_note
from nodes.origins import OriginReader, reads_ahead
from nodes.state_checks import at, expect_int, expect_keys

#: Records read and encoded per tokenizer call.
BLOCK = 128

EncodeBatch = Callable[[list[str]], Sequence[Sequence[int]]]


_LARGEST = int(np.iinfo(np.int32).max)  # ids are int32


class TokenizeNode(Node):
    """Adds ``output`` (the token ids, an int32 array) to every record, from its ``field``.

    A record is a dict (its ``field`` is the text) or a str (the record becomes
    ``{output: ids}``). ``encode_batch`` takes a list of texts and returns
    their ids; ``bos``/``eos`` ids, when given, go around every document. A
    field that is not a str is a ``TypeError`` naming it; an error of the
    tokenizer is raised as it is, with a note naming the step and the text.

    State: ``{UPSTREAM: upstream's state before the current block, "skip": k}``,
    ``k`` records of the block returned. A resume reads the block again and
    encodes only the records not returned: at most ``block`` records re-read.
    """

    kind = "tokenize"
    elastic = "buffer"
    #: Hands on its input's items one for one, in order (a pack above may take the rest of
    #: a partly delivered document from the source's plan: see nodes.steps.pack).
    keeps_order = True

    def __init__(
        self,
        upstream: Node,
        encode_batch: EncodeBatch,
        *,
        field: str = "text",
        output: str = "input_ids",
        bos: int | None = None,
        eos: int | None = None,
        block: int = BLOCK,
    ) -> None:
        super().__init__(upstream)
        if type(block) is not int or block < 1:
            raise ValueError(f"tokenize block must be an int >= 1, got {block!r}")
        self._up = upstream
        self._encode = encode_batch
        self._field, self._output = field, output
        self._bos, self._eos = bos, eos
        self._block = block
        self._it: Iterator[Any] = NotReset(self)
        self._inline = False  # converting for another topology: one record at a time
        self._track = False  # a pack above asks each record's origin: note_origins()

    def reset(self, state: State | None = None) -> None:
        self._up.reset(None if state is None else state[UPSTREAM])
        self._src = iter(self._up)
        skip = 0 if state is None else int(state["skip"])
        self._before: State | None = None if state is None else state[UPSTREAM]
        # Records of the current block returned, and its length (until the block is read
        # again, a state taken is the one given: one more record is assumed to come).
        self._returned, self._length = skip, skip + 1 if skip else 0
        self._block_state = self._before
        self._notes: list[Any] = []
        if self._inline and skip:
            # Converting: the block's first records were returned; read them now, so that
            # the source's position is past them (the rest of the block is untouched).
            if len(list(islice(self._src, skip))) < skip:
                raise InvalidStateError("skip", "at most the records left", skip)
            self._before, self._length, self._returned, skip = None, 0, 0, 0
        self._it = self._records(skip)

    def _records(self, skip: int) -> Iterator[Any]:
        src, up = self._src, self._up
        size = 1 if self._inline else self._block
        while True:
            before = self._before if self._before is not None else up.state_dict()
            self._before = None
            if self._track:
                raw, notes = [], self._notes
                notes.clear()
                for record in islice(src, max(size, skip)):
                    raw.append(record)
                    notes.append(up.last_origin())
            else:
                raw = list(islice(src, max(size, skip)))
            if skip > len(raw):
                raise InvalidStateError("skip", f"at most {len(raw)} (the records left)", skip)
            if not raw:
                self._length = self._returned = 0
                self._block_state = before
                return
            self._block_state, self._length, self._returned = before, len(raw), skip
            for record in self._encoded(raw[skip:]):
                self._returned += 1
                yield record
            skip = 0

    def _encoded(self, records: list[Any]) -> list[Any]:
        texts = [self._text(record) for record in records]
        try:
            ids = self._encode(texts)
        except Exception as error:
            first = next((t for t in texts if t), "")
            add_note(
                error,
                f"raised by the tokenizer of tokenize(field={self._field!r}) on a block of "
                f"{len(texts)} texts, the first non-empty one starting {first[:60]!r}",
            )
            raise
        if len(ids) != len(texts):
            raise ValueError(
                f"tokenize: the tokenizer returned {len(ids)} token lists for {len(texts)} texts"
            )
        out = []
        for record, array in zip(records, self._block_ids(ids)):
            if isinstance(record, dict):
                out.append({**record, self._output: array})
            else:
                out.append({self._output: array})
        return out

    def _text(self, record: Any) -> str:
        if isinstance(record, str):
            return record
        if not isinstance(record, dict):
            raise TypeError(
                f"tokenize takes dicts with a {self._field!r} field or strs, got a "
                f"{type(record).__name__}: map each record to one first"
            )
        if self._field not in record:
            raise KeyError(
                f"tokenize(field={self._field!r}): a record has no such field (its fields: "
                f"{sorted(map(str, record))}); pass field= to name the text"
            )
        text = record[self._field]
        if not isinstance(text, str):
            raise TypeError(
                f"tokenize(field={self._field!r}) takes text, got a {type(text).__name__} "
                f"({text!r:.60}): decode bytes, or map the field to str (or drop the record "
                "with a filter) first"
            )
        return text

    def _block_ids(self, ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Each text's ids (with ``bos``/``eos``) as int32 arrays: views of one array made
        from the whole block's lists at once (one conversion a block, not one a text);
        anything but lists of ints goes through :meth:`_ids`, which says what is wrong."""
        if not all(type(tokens) is list for tokens in ids):
            return [self._ids(tokens) for tokens in ids]
        bos, eos = self._bos, self._eos
        flat: list[int] = []
        bounds = [0]
        for tokens in ids:
            if bos is not None:
                flat.append(bos)
            flat += tokens
            if eos is not None:
                flat.append(eos)
            bounds.append(len(flat))
        try:
            array = np.array(flat, dtype=np.int32)
        except (TypeError, ValueError, OverflowError):  # nested lists, non-ints, too large
            return [self._ids(tokens) for tokens in ids]
        if array.size and array.min() < 0:
            return [self._ids(tokens) for tokens in ids]  # says which
        return [array[start:stop] for start, stop in zip(bounds, bounds[1:])]

    def _ids(self, tokens: Sequence[int]) -> np.ndarray:
        array = np.asarray(tokens, dtype=np.int64)
        if array.ndim != 1:
            raise ValueError(f"tokenize: the tokenizer returned ids of shape {array.shape}")
        if array.size and (array.min() < 0 or array.max() > _LARGEST):
            raise ValueError(
                f"tokenize: the tokenizer returned ids outside 0..{_LARGEST} "
                f"(from {array.min()} to {array.max()})"
            )
        if self._bos is None and self._eos is None:
            return array.astype(np.int32, copy=False)
        parts = [array]
        if self._bos is not None:
            parts.insert(0, np.array([self._bos]))
        if self._eos is not None:
            parts.append(np.array([self._eos]))
        return np.concatenate(parts).astype(np.int32, copy=False)

    def __next__(self) -> Any:
        return next(self._it)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def state_dict(self) -> State:
        if self._returned < self._length:
            return {UPSTREAM: self._block_state, "skip": self._returned}
        return {UPSTREAM: self._up.state_dict(), "skip": 0}

    def validate_state(self, state: Any, path: str = "node") -> None:
        expect_keys(state, path, {UPSTREAM, "skip"})
        expect_int(state, "skip", path)  # checked against the records left when read
        self._up.validate_state(state[UPSTREAM], at(path, UPSTREAM))

    # ----- elastic resume (nodes.elastic) ---------------------------------------------------
    def begin_conversion(self) -> None:
        # One record per block: what was read is what was returned, so nothing is held
        # (the rest of a block whose first records were returned is still untouched).
        self._inline = True

    def last_origin(self) -> Any:
        if self._track:
            return self._notes[self._returned - 1]
        if not self._inline:
            raise AssertionError("tokenize reads ahead: its last origin is noted only if tracked")
        return self._up.last_origin()  # inline: the record returned last is upstream's last

    def note_origins(self, on: bool = True) -> None:
        """Note every record's origin from now on, for :meth:`last_origin` (asked by a pack
        above after a topology change, while the epoch lasts; see nodes.steps.pack). A pack sets
        it at each reset; a ``repeat`` between them resetting this node for a new round
        keeps it."""
        self._track = on

    def plain_origins(self) -> bool:
        # Its records' origins are noted whenever a pack above needs them (see reset).
        return self._up.plain_origins()

    def origin_reader(self) -> OriginReader:
        raise reads_ahead(self)

    def in_flight(self) -> list[Any]:
        return []
