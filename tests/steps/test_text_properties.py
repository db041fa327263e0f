"""tokenize, pack and mix, property-based: checkpoints resume on random topologies.

Each case draws documents (empty ones, ones longer than ``seq_len``), a ``seq_len``, a
packer, ``bins``, whether the documents are text through ``tokenize`` and whether two
corpora are mixed, then a chain of topologies (ranks x DataLoader workers). On each but the
last, every rank reads a random number of sequences and saves its state; the merged state
loads on the next topology, and the last one finishes the epoch. Over the whole chain:

* the non-padding tokens delivered are the epoch's tokens, each exactly once;
* every sequence is well formed: each segment is consecutive tokens of one document, its
  position ids count from 0, its first label is -100, ``cu_seqlens`` are its bounds;
* on an unchanged topology the stream is the uninterrupted one, sequence for sequence.

Document ``d``'s token ``i`` is ``d * 1000 + i + 1`` (0 pads), so a token names its place.
A failure names the case; ``pytest -k "<test>[<case>]"`` replays it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
import pytest
from test_text import check_sequence

import datapipes as dp


def ids_of(text: str) -> list[int]:
    """The tokenizer of the cases' text documents: the ids written out, space-separated."""
    return [int(word) for word in text.split()]


def word_ids(tokens: list[int]) -> Any:
    """A Hugging Face tokenizer that reads the same ids (a word-level vocabulary of them),
    so its path (blocks encoded ahead on a thread) is taken too."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {str(t): t for t in tokens} | {"[UNK]": 0}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


@dataclass
class Case:
    seed: int
    docs: list[list[int]]
    other: list[list[int]] | None  # a second corpus, mixed in
    seq_len: int
    method: str
    bins: int
    text: bool
    chain: list[tuple[int, int]]  # (world size, workers) per stage
    hugging_face: bool = False  # text through a Hugging Face tokenizer, else ids_of
    rounds: int = 1  # mixed corpora each repeated (sampled with replacement) this many times

    def recipe(self) -> dp.DataPipe[Any]:
        tokenizer = word_ids(self.tokens()) if self.hugging_face else ids_of

        def corpus(docs: list[list[int]]) -> dp.DataPipe[Any]:
            if self.text:
                texts = [" ".join(map(str, d)) for d in docs]
                return dp.from_sequence(texts).shuffle().tokenize(tokenizer, block=3)
            return dp.from_sequence(docs).shuffle()

        source = corpus(self.docs)
        if self.other is not None:
            if self.rounds > 1:  # each corpus its own epochs
                parts = [corpus(self.docs).repeat(self.rounds), corpus(self.other).repeat(2)]
            else:
                parts = [source, corpus(self.other)]
            source = dp.mix(parts, weights=[0.7, 0.3])
        return source.pack(self.seq_len, self.method, bins=self.bins)

    def tokens(self) -> list[int]:
        if self.other is None:
            return sorted(t for d in self.docs for t in d)
        docs, other = self.docs * self.rounds, self.other * (2 if self.rounds > 1 else 1)
        return sorted(t for d in docs + other for t in d)


def draw(seed: int, workers: bool) -> Case:
    rng = random.Random(seed)
    seq_len = rng.choice([1, 2, 5, 8, 16, 33])
    lengths = [0, 1, 2, 3, seq_len - 1, seq_len, seq_len + 1, 2 * seq_len + 3, 7]

    def corpus(first: int, count: int) -> list[list[int]]:
        return [
            [d * 1000 + i + 1 for i in range(max(0, rng.choice(lengths)))]
            for d in range(first, first + count)
        ]

    docs = corpus(0, rng.randint(0, 40))
    other = corpus(500, rng.randint(0, 15)) if rng.random() < 0.3 else None
    stages = rng.randint(2, 3)
    chain = [(rng.randint(1, 4), rng.choice([0, 1, 2]) if workers else 0) for _ in range(stages)]
    return Case(
        seed, docs, other, seq_len, rng.choice(["concat", "first_fit"]), rng.randint(1, 4),
        rng.random() < 0.4, chain, rng.random() < 0.5, rng.choice([1, 1, 3]),
    )  # fmt: skip


def run_chain(case: Case) -> list[dict[str, Any]]:
    """Every sequence delivered over the chain of topologies (see the module doc)."""
    pipe = case.recipe()
    rng = random.Random(case.seed * 7 + 1)
    delivered: list[dict[str, Any]] = []
    merged: dict[str, Any] | None = None
    for stage, (world, workers) in enumerate(case.chain):
        last = stage == len(case.chain) - 1
        states = []
        for rank in range(world):
            loader = dp.Loader(
                pipe, rank=rank, world_size=world, num_workers=workers, even_batches=False
            )
            with loader:
                if merged is not None:
                    loader.load_state_dict(merged)
                if loader.epoch != 0:  # this rank's share of the epoch was done
                    states.append(loader.state_dict())
                    continue
                if last:
                    delivered += list(loader)
                    continue
                stop = rng.choice([0, 1, 2, 3, 5, 50])
                got = list(islice(iter(loader), stop))
                delivered += got
                states.append(loader.state_dict())
        if not last:
            merged = dp.merge_states(states)
    return delivered


def describe(case: Case) -> str:
    return (
        f"seed {case.seed}: {len(case.docs)} docs{' + mixed' if case.other else ''} "
        f"({case.rounds} rounds), "
        f"seq_len {case.seq_len}, {case.method} bins {case.bins}, text {case.text} "
        f"(hugging face {case.hugging_face}), "
        f"chain {case.chain}"
    )


def check_case(case: Case) -> None:
    delivered = run_chain(case)
    got = sorted(t for s in delivered for t in np.asarray(s["input_ids"]).tolist() if t)
    want = case.tokens()
    if got != want:
        missing = sorted(set(want) - set(got))[:8]
        twice = sorted(t for t in set(got) if got.count(t) > 1)[:8]
        raise AssertionError(f"{describe(case)}: missing {missing}, twice {twice}")
    for sequence in delivered:
        check_sequence({k: np.asarray(v) for k, v in sequence.items()}, case.seq_len)


@pytest.mark.parametrize("seed", range(60))
def test_every_token_once_across_topologies(seed: int) -> None:
    check_case(draw(seed, workers=False))


@pytest.mark.slow  # DataLoader worker processes
@pytest.mark.parametrize("seed", range(1000, 1040))
def test_every_token_once_across_topologies_with_workers(seed: int) -> None:
    check_case(draw(seed, workers=True))


@pytest.mark.parametrize("method", ["concat", "first_fit"])
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_an_unchanged_topology_resumes_the_same_stream(method: str, workers: int) -> None:
    case = draw(7, workers=False)
    pipe = dp.from_sequence(case.docs).shuffle().pack(5, method, bins=2)

    def loaders() -> list[dp.Loader[Any]]:
        return [dp.Loader(pipe, rank=r, world_size=2, num_workers=workers) for r in range(2)]

    reference = []
    for loader in loaders():
        with loader:
            reference.append([s["input_ids"].tolist() for s in loader])
    first, states = [], []
    for loader in loaders():
        with loader:
            first.append([s["input_ids"].tolist() for s in islice(iter(loader), 3)])
            states.append(loader.state_dict())
    for rank, loader in enumerate(loaders()):
        with loader:
            loader.load_state_dict(dp.merge_states(states))
            # a rank whose share had ended is at the next epoch: nothing of this one is left
            rest = [s["input_ids"].tolist() for s in loader] if loader.epoch == 0 else []
        assert first[rank] + rest == reference[rank]


def test_a_buffer_shuffle_below_a_pack_mid_document_is_refused_on_another_topology() -> None:
    docs = [[d * 1000 + i + 1 for i in range(9)] for d in range(12)]
    pipe = dp.from_sequence(docs).shuffle(buffer_size=4).pack(4)
    loader = dp.Loader(pipe)
    next(iter(loader))  # 4 of the first document's 9 tokens
    state = loader.state_dict()
    with pytest.raises(dp.ElasticResumeError, match="pack"):
        dp.Loader(pipe, rank=0, world_size=2).load_state_dict(state)
    resumed = dp.Loader(pipe)  # the saved topology still resumes it exactly
    resumed.load_state_dict(state)
    assert len(list(resumed)) == -(-9 * 12 // 4) - 1
