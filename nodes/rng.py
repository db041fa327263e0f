"""Deterministic, seekable randomness: no global RNG is ever touched.

Every random choice is a pure function of an entropy key (seed, epoch, the
node's place in the graph, ...) and a counter, so a position is enough to
resume a random stream exactly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import numpy as np

from nodes.iterators import list_iterator_position, positioned_iterator

_BLOCK = 1024
_MASK64 = (1 << 64) - 1
_MIX1 = np.uint64(0x9E3779B97F4A7C15)
_MIX2 = np.uint64(0xBF58476D1CE4E5B9)
_S29, _S32 = np.uint64(29), np.uint64(32)


def stable_hash(text: str) -> int:
    """A 63-bit hash of ``text`` that is the same in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def _generator(key: Sequence[int]) -> np.random.Generator:
    entropy = [int(k) & _MASK64 for k in key]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


class UniformStream:
    """Floats in [0, 1) drawn from ``key``, positioned in O(1) by a draw counter.

    Draws come in blocks, each from its own generator seeded by (key, block),
    so ``seek(n)`` costs one block regardless of ``n``.

    >>> s = UniformStream([1, 2]); a = [s.next() for _ in range(5)]
    >>> s.seek(3); s.next() == a[3]
    True
    """

    def __init__(self, key: Sequence[int]) -> None:
        self._key = list(key)
        self.seek(0)

    def _load(self, block: int) -> None:
        self._block = block
        self._values = _generator([*self._key, block]).random(_BLOCK).tolist()
        self._it = iter(self._values)

    def seek(self, position: int) -> None:
        """Make the next draw the one at ``position``."""
        self._load(position // _BLOCK)
        self._it = positioned_iterator(self._values, position % _BLOCK)

    def position(self) -> int:
        """How many draws have been taken."""
        return self._block * _BLOCK + list_iterator_position(self._it, _BLOCK)

    def next(self) -> float:
        """The next float in [0, 1)."""
        for value in self._it:
            return value
        return next(self.next_block())

    def current_block(self) -> Iterator[float]:
        """The draws left in the current block: a hot loop may take them with ``next``."""
        return self._it

    def next_block(self) -> Iterator[float]:
        """Move to the next block (after ``current_block()`` ran out) and return its draws."""
        self._load(self._block + 1)
        return self._it


#: Up to this many items a permutation is drawn whole (uniform over all orders).
EXPLICIT_PERMUTATION_LIMIT = 1 << 16


class IndexPermutation:
    """A pseudo-random permutation of ``range(n)``, seeded by ``key``.

    Up to :data:`EXPLICIT_PERMUTATION_LIMIT` (65,536) items it is drawn whole
    with a Fisher-Yates shuffle, so every order is equally likely (file lists,
    small datasets: under 1 ms and 512 KiB). Above that it is computed on
    demand: a keyed Feistel network over the smallest even power of two >= n,
    with cycle walking to stay inside [0, n), so nothing of size n is ever
    built and a permutation of 10**9 or 10**12 indices costs the same memory
    as one of 10. (A Feistel network reaches only part of the n! orders, which
    for small n shows as a bias: hence the exact draw there.)

    >>> p = IndexPermutation(10, key=[0]); sorted(p.apply(np.arange(10)).tolist())
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """

    _ROUNDS = 6

    def __init__(self, n: int, key: Sequence[int]) -> None:
        self.n = n
        self._table: np.ndarray | None = None
        if n <= EXPLICIT_PERMUTATION_LIMIT:
            self._table = _generator(key).permutation(n)
            return
        bits = max(2, (n - 1).bit_length())
        bits += bits & 1
        self._half = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        seeds = np.random.SeedSequence([int(k) & _MASK64 for k in key])
        self._round_keys = seeds.generate_state(self._ROUNDS, np.uint64)

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        # splitmix64-style round function; uint64 arithmetic wraps, which is what we want.
        # In place: one scratch array per call instead of five temporaries per round.
        left = x >> self._half
        right = x & self._mask
        h = np.empty_like(right)
        for round_key in self._round_keys:
            np.bitwise_xor(right, round_key, out=h)
            h *= _MIX1
            h ^= h >> _S29
            h *= _MIX2
            h ^= h >> _S32
            h &= self._mask
            h ^= left
            left, right, h = right, h, left
        left <<= self._half
        left |= right
        return left

    def apply(self, positions: np.ndarray) -> np.ndarray:
        """Map positions in [0, n) to their permuted indices (vectorized)."""
        if self._table is not None:
            return self._table[positions]
        n = np.uint64(self.n)
        with np.errstate(over="ignore"):
            out = self._encrypt(positions.astype(np.uint64))
            # cycle walking: re-encrypt only the values still outside [0, n)
            outside = np.flatnonzero(out >= n)
            while outside.size:
                walked = self._encrypt(out[outside])
                out[outside] = walked
                outside = outside[walked >= n]
        return out.astype(np.int64)
