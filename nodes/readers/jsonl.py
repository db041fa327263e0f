"""JSON lines: one JSON value per line, parsed by orjson where it agrees with the stdlib."""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np

from nodes.readers.lines import MAX_RECORD_BYTES, RECORD_BLOCK_SIZE, LineFormat

try:  # optional (pip install datapipes-torch[json]): JSON lines decode about 2x faster
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover - the stdlib decodes the same records
    _orjson_loads = None

_first, _second = itemgetter(0), itemgetter(1)


class JsonLinesFormat(LineFormat):
    """One JSON value per line; blank lines are ignored.

    With ``orjson`` installed (and no ``loads`` given), a block's lines are
    parsed from its bytes by ``orjson.loads``; a block where orjson could
    differ from :func:`json.loads` (it rejects NaN, Infinity, lone surrogates
    and numbers beyond a double, and reads integers beyond 64 bits as floats)
    takes the stdlib path, so the records are the same either way.
    """

    name = "read_jsonl"

    def __init__(
        self,
        block_size: int = RECORD_BLOCK_SIZE,
        loads: Callable[[str], Any] | None = None,
        max_record_bytes: int | None = MAX_RECORD_BYTES,
    ) -> None:
        super().__init__("utf-8", block_size, max_record_bytes)
        decoder = json.JSONDecoder()
        self.loads = loads or decoder.decode
        # The fast path calls the C scanner that json.loads ends in, skipping loads's per-call
        # checks and whitespace regexes: measured 2.1 us instead of 3.1 us per 150-byte record.
        self._scan = decoder.scan_once if loads is None else None
        # orjson per line, guarded: measured 1.1-1.2 us instead of 2.3-2.7 us per 214-byte record
        # of benchmarks/jsonl_pipeline.py. One orjson call on the whole block (the lines
        # wrapped and joined into one array) parsed them in 0.8 us, but proving that the
        # array's items are the lines (a line `1,2`, or `[1` followed by `2]`, must still be
        # a bad record) cost more than it saved: 1.4 us.
        self._fast_loads = _orjson_loads if loads is None else None

    def decode_records(self, chunk: bytes, meta: Any) -> list[Any]:
        if self._fast_loads is not None:
            records = self._decode_fast(chunk)
            if records is not None:
                return records
        lines = self.split_lines(chunk)
        if self._scan is None:
            return list(map(self.loads, lines))
        # A line that is not exactly one JSON value (blank, padded, malformed) stops the
        # scan early (StopIteration ends `list`) or ends elsewhere than the line's end; the
        # whole block then takes the per-line path, which parses like json.loads.
        parsed = list(map(self._scan, lines, repeat(0)))
        if len(parsed) != len(lines) or list(map(_second, parsed)) != list(map(len, lines)):
            raise ValueError("a line needs the per-line path")
        return list(map(_first, parsed))

    def _decode_fast(self, chunk: bytes) -> list[Any] | None:
        """The chunk's records parsed by orjson; ``None`` where json.loads must decide."""
        if _may_overflow_64_bits(chunk):
            return None
        lines = chunk.split(b"\n")
        if not lines[-1]:
            lines.pop()
        loads = self._fast_loads
        try:
            return list(map(loads, lines))
        except ValueError:  # orjson.JSONDecodeError: a blank or bad line, NaN, ...
            pass
        # Blank lines are ignored, as on the per-line path: parse the others.
        kept = [line for line in lines if not self.ignores(line)]
        if len(kept) == len(lines):
            return None
        try:
            return list(map(loads, kept))
        except ValueError:
            return None

    def ignores(self, line: bytes) -> bool:
        return not line.strip()

    def decode_one(self, line: bytes, meta: Any) -> Any:
        return self.loads(line.decode())


_DIGIT_IS_1 = bytes(48 <= byte <= 57 for byte in range(256))
_NINETEEN_1 = b"\x01" * 19


def _may_overflow_64_bits(chunk: bytes) -> bool:
    """Whether ``chunk`` may hold an integer out of orjson's range, which it reads as a float.

    Outside [-2**63, 2**64) a literal has 20 digits or more, or a minus sign
    and 19 or more; digit runs inside strings and fractions count too (the
    stdlib then parses the block, exactly). Measured: 1 us for 512 bytes with
    bytes methods; 30 us for 64 KiB with numpy (0.1 us per 214-byte record),
    whose fixed cost of about 9 us a call is the larger below 8 KiB.
    """
    if len(chunk) < 8192 and chunk.translate(_DIGIT_IS_1).find(_NINETEEN_1) < 0:
        return False
    text = np.frombuffer(chunk, np.uint8)
    run = (text - 48) < 10  # uint8 arithmetic wraps: only b"0" ... b"9" are below 10
    # run[i] <- whether text[i : i + k] is all digits, for k = 2, 4, 8, 16, 19
    run = run[:-1] & run[1:]
    run = run[:-2] & run[2:]
    run = run[:-4] & run[4:]
    run = run[:-8] & run[8:]
    run = run[:-3] & run[3:]
    if not run.any():
        return False
    return bool((run[:-1] & run[1:]).any() or ((text[:-19] == 45) & run[1:]).any())
