"""tokenize and pack: the sequences' contents, exact resume, hostile input, the fingerprint.

Documents are lists of token ids that name themselves: document ``d``'s token ``i`` is
``d * 1000 + i + 1`` (0 is the padding id), so every delivered token says which document
and which position it came from. The elastic properties (random topologies) are in
test_text_properties.py.
"""

from __future__ import annotations

import random
from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch

import datapipes as dp
from nodes import Context
from nodes.testing import check_hostile_states, check_node


def documents(count: int, seed: int, longest: int = 13) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [0, 1, 2, 3, 5, 8, longest, 2 * longest + 1]
    return [[d * 1000 + i + 1 for i in range(rng.choice(lengths))] for d in range(count)]


def tokens_of(sequences: list[dict[str, Any]]) -> list[int]:
    return [t for s in sequences for t in np.asarray(s["input_ids"]).tolist() if t]


def check_sequence(sequence: dict[str, Any], seq_len: int) -> list[list[int]]:
    """The segments of one packed sequence, each checked against the documents' ids:
    one document's consecutive tokens, position ids from 0, labels -100 at its first token."""
    ids, labels = sequence["input_ids"], sequence["labels"]
    positions, bounds = sequence["position_ids"], sequence["cu_seqlens"]
    assert ids.shape == labels.shape == positions.shape == (seq_len,)
    assert ids.dtype == labels.dtype == positions.dtype == np.int64
    assert bounds.dtype == np.int32 and bounds[0] == 0 and bounds[-1] == seq_len
    assert np.all(np.diff(bounds) > 0)
    segments = []
    for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        segment = ids[start:stop].tolist()
        assert positions[start:stop].tolist() == list(range(stop - start))
        assert labels[start] == -100
        if segment[0] == 0:  # padding: the last segment, all ignored
            assert stop == seq_len and set(segment) == {0}
            assert set(labels[start:stop].tolist()) == {-100}
            continue
        assert labels[start + 1 : stop].tolist() == segment[1:]
        doc = segment[0] // 1000
        assert segment == list(range(segment[0], segment[0] + len(segment)))
        assert all(t // 1000 == doc for t in segment), segment
        segments.append(segment)
    return segments


# ----- what a sequence holds ---------------------------------------------------------------


@pytest.mark.parametrize("seq_len", [1, 4, 7, 64])
def test_concat_is_the_documents_end_to_end_cut_every_seq_len(seq_len: int) -> None:
    docs = documents(40, seq_len)
    out = list(dp.Loader(dp.from_sequence(docs).pack(seq_len)))
    flat = [t for d in docs for t in d]
    assert tokens_of(out) == flat  # in order, every token once
    for sequence in out[:-1]:
        assert 0 not in sequence["input_ids"].tolist()  # full
    for sequence in out:
        check_sequence(sequence, seq_len)
    assert len(out) == -(-len(flat) // seq_len)


@pytest.mark.parametrize("seq_len", [1, 4, 7, 64])
@pytest.mark.parametrize("bins", [1, 3, 8])
def test_first_fit_keeps_documents_whole_in_one_sequence(seq_len: int, bins: int) -> None:
    docs = documents(60, seq_len + bins)
    out = list(dp.Loader(dp.from_sequence(docs).pack(seq_len, "first_fit", bins=bins)))
    assert sorted(tokens_of(out)) == sorted(t for d in docs for t in d)
    pieces: dict[int, list[list[int]]] = {}
    for sequence in out:
        for segment in check_sequence(sequence, seq_len):
            pieces.setdefault(segment[0] // 1000, []).append(segment)
    for doc, segments in pieces.items():
        length = len(docs[doc])
        full, tail = divmod(length, seq_len)
        # a long document: its full chunks, each a sequence of its own, then its rest whole
        assert [len(s) for s in segments] == [seq_len] * full + ([tail] if tail else [])


def test_first_fit_fills_the_first_bin_with_room_and_flushes_a_round_in_order() -> None:
    docs = [[1, 2, 3], [11, 12], [21], [31, 32, 33], [41]]  # seq_len 4, 2 bins
    out = list(dp.Loader(dp.from_sequence(docs).pack(4, "first_fit", bins=2)))
    # [1,2,3] opens bin 0; [11,12] opens bin 1; [21] fits bin 0; [31,32,33] fits none:
    # the round goes out (bin 0, bin 1) and the next starts with it; [41] fits its bin
    assert [s["input_ids"].tolist() for s in out] == [
        [1, 2, 3, 21], [11, 12, 0, 0], [31, 32, 33, 41],
    ]  # fmt: skip


def test_a_batch_of_sequences_has_the_bounds_of_the_sequences_end_to_end() -> None:
    docs = [[1, 2, 3], [11, 12], [21], [31, 32, 33, 34, 35]]
    batch = next(iter(dp.Loader(dp.from_sequence(docs).pack(4).batch(2))))
    assert batch["input_ids"].shape == (2, 4) and batch["input_ids"].dtype == torch.int64
    assert batch["cu_seqlens"].tolist() == [0, 3, 4, 5, 6, 8]  # [1,2,3|11] [12|21|31,32]
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0], [0, 0, 0, 1]]


def test_drop_last_drops_the_short_last_sequence_and_counts_its_tokens() -> None:
    docs = [[1, 2, 3], [11, 12]]
    loader = dp.Loader(dp.from_sequence(docs).pack(4, drop_last=True))
    assert [s["input_ids"].tolist() for s in loader] == [[1, 2, 3, 11]]
    assert loader.dropped() == {"pack(4, drop_last=True) tokens": 1}


# ----- exact resume ------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["concat", "first_fit"])
@pytest.mark.parametrize("seq_len", [1, 5, 16])
def test_every_position_resumes_exactly(method: str, seq_len: int) -> None:
    pipe = dp.from_sequence(documents(30, seq_len)).pack(seq_len, method, bins=3)
    check_node(lambda ctx: pipe.build(ctx), max_positions=40)


@pytest.mark.parametrize("method", ["concat", "first_fit"])
def test_a_shuffled_sharded_source_resumes_exactly(method: str) -> None:
    pipe = dp.from_sequence(documents(50, 3)).shuffle().pack(6, method, bins=2)

    def context(epoch: int) -> Context:
        return Context(rank=1, world_size=3, epoch=epoch, seed=5)

    check_node(lambda ctx: pipe.build(ctx), context=context, max_positions=30)


def test_tokenize_resumes_exactly_mid_block() -> None:
    texts = [f"doc {i} " + "x" * (i % 9) for i in range(45)]
    pipe = dp.from_sequence(texts).tokenize(encode_chars, block=7).pack(8)
    check_node(lambda ctx: pipe.build(ctx), max_positions=60)
    alone = dp.from_sequence(texts).tokenize(encode_chars, block=4)
    check_node(lambda ctx: alone.build(ctx), max_positions=60)


def test_the_state_is_positions_not_tokens() -> None:
    # a state after every sequence: a few numbers, whatever the document lengths
    docs = [[d * 1000 + i + 1 for i in range(900)] for d in range(4)]
    for method in ("concat", "first_fit"):
        loader = dp.Loader(dp.from_sequence(docs).pack(256, method))
        sizes = []
        for _ in islice(iter(loader), 12):
            sizes.append(len(loader.state_dict()["ranks"]["0"]["node"]))
        assert max(sizes) < 80, (method, sizes)


@pytest.mark.parametrize("method", ["concat", "first_fit"])
def test_hostile_states_are_refused(method: str) -> None:
    pipe = dp.from_sequence(documents(20, 1)).pack(5, method, bins=2)
    assert check_hostile_states(lambda: pipe.build(Context()), 4) > 0


def test_an_offset_past_the_document_is_refused() -> None:
    from nodes.errors import InvalidStateError

    node = dp.from_sequence([[1, 2, 3], [4]]).pack(2).build(Context())
    node.reset({"upstream": {"position": 0}, "offset": 3})
    with pytest.raises(InvalidStateError, match="offset"):
        next(node)


# ----- tokenize ----------------------------------------------------------------------------


def encode_chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_tokenize_adds_int32_ids_and_keeps_the_record() -> None:
    records = [{"id": 1, "text": "ab"}, {"id": 2, "text": ""}]
    out = list(dp.Loader(dp.from_sequence(records).tokenize(encode_chars, bos=1, eos=2)))
    assert [r["id"] for r in out] == [1, 2]
    assert [r["input_ids"].tolist() for r in out] == [[1, 97, 98, 2], [1, 2]]
    assert out[0]["input_ids"].dtype == np.int32 and out[0]["text"] == "ab"


def test_a_hugging_face_tokenizer_encodes_blocks_as_one_at_a_time_would() -> None:
    tok = small_tokenizer()
    texts = [f"the cat {i} sat on the mat " * (i % 4) for i in range(50)]
    out = list(dp.Loader(dp.from_sequence(texts).tokenize(tok, block=16)))
    assert [r["input_ids"].tolist() for r in out] == [tok.encode(t).ids for t in texts]


@pytest.mark.parametrize("block", [1, 5, 16])
def test_a_hugging_face_tokenizer_resumes_exactly_mid_block(block: int) -> None:
    # a block encoded in one call; the state names the block and the records returned
    tok = small_tokenizer()
    texts = [f"the cat {i} sat on the mat " * (i % 4) for i in range(40)]
    pipe = dp.from_sequence(texts).tokenize(tok, eos=1, block=block)
    check_node(lambda ctx: pipe.build(ctx), max_positions=45)
    check_node(lambda ctx: pipe.pack(8).build(ctx), max_positions=45)


def test_an_error_in_a_block_is_raised_at_its_place() -> None:
    tok = small_tokenizer()
    records = [{"text": "the cat"}] * 7 + [{"text": None}]
    loader = dp.Loader(dp.from_sequence(records).tokenize(tok, block=4))
    got = []
    with pytest.raises(TypeError, match="takes text"):
        for record in loader:
            got.append(record)
    assert len(got) == 4  # the first block whole; the second fails where it is reached


def small_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", "[EOS]"])
    tok.train_from_iterator([f"the cat {i} sat on the mat" for i in range(40)], trainer)
    return tok


def test_another_vocabulary_is_another_recipe() -> None:
    first, second = small_tokenizer(), small_tokenizer()
    second.add_tokens(["zebra"])
    recipe = dp.from_sequence(["a b"] * 10).tokenize(first).pack(4)
    assert (
        recipe.fingerprint()
        == dp.from_sequence(["a b"] * 10).tokenize(small_tokenizer()).pack(4).fingerprint()
    )  # the same definition, another object
    other = dp.from_sequence(["a b"] * 10).tokenize(second).pack(4)
    assert recipe.fingerprint() != other.fingerprint()
    loader = dp.Loader(recipe)
    next(iter(loader))
    with pytest.raises(dp.StateMismatchError):
        dp.Loader(other).load_state_dict(loader.state_dict())
    # a callable counts by its name, or by the name given
    named = dp.from_sequence(["a"]).tokenize(encode_chars, name="chars-v2")
    assert named.fingerprint() != dp.from_sequence(["a"]).tokenize(encode_chars).fingerprint()


# ----- hostile input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "error", "message"),
    [
        ({"text": None}, TypeError, "takes text, got a NoneType"),
        ({"text": b"bytes"}, TypeError, "takes text, got a bytes"),
        ({"text": 5}, TypeError, "takes text, got a int"),
        ({"body": "x"}, KeyError, "has no such field"),
        (7, TypeError, "takes dicts"),
    ],
)
def test_a_record_without_text_is_a_clear_error(record: Any, error: type, message: str) -> None:
    pipe = dp.from_sequence([{"text": "fine"}, record]).tokenize(encode_chars)
    with pytest.raises(error, match=message):
        list(dp.Loader(pipe))


def test_a_tokenizer_that_raises_is_raised_with_a_note() -> None:
    def broken(text: str) -> list[int]:
        if "bad" in text:
            raise RuntimeError("cannot encode")
        return [1]

    pipe = dp.from_sequence(["ok", "bad text"]).tokenize(broken)
    with pytest.raises(RuntimeError, match="cannot encode") as caught:
        list(dp.Loader(pipe))
    assert any("tokenize(field='text')" in note for note in caught.value.__notes__)


@pytest.mark.parametrize(
    ("ids", "message"),
    [([-1, 2], "outside 0..2147483647"), ([2**40], "outside 0..2147483647"),
     ([[1, 2], [3]], "shape"), (["a"], "invalid literal|could not convert")],
)  # fmt: skip
def test_a_tokenizer_returning_what_are_not_token_ids_is_refused(ids: Any, message: str) -> None:
    """A block is converted at once; a bad list among good ones is still named."""
    pipe = dp.from_sequence(["ok", "bad", "ok"]).tokenize(lambda t: ids if t == "bad" else [7])
    with pytest.raises((ValueError, TypeError), match=message):
        list(dp.Loader(pipe))


@pytest.mark.parametrize(
    ("tokens", "message"),
    [([[1, 2], [3]], "1-d ints"), ([0.5, 1.5], "1-d ints"), (["a", "b"], "1-d ints")],
)
def test_pack_refuses_what_is_not_token_ids(tokens: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        list(dp.Loader(dp.from_sequence([{"input_ids": tokens}]).pack(4)))


@pytest.mark.parametrize("method", ["concat", "first_fit"])
def test_empty_documents_add_nothing_and_an_empty_epoch_gives_no_sequence(method: str) -> None:
    assert list(dp.Loader(dp.from_sequence([[], [], []]).pack(4, method))) == []
    out = list(dp.Loader(dp.from_sequence([[], [5, 6], []]).pack(4, method)))
    assert [s["input_ids"].tolist() for s in out] == [[5, 6, 0, 0]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seq_len": 0}, "seq_len"),
        ({"seq_len": 4, "method": "best_fit"}, "method"),
        ({"seq_len": 4, "bins": 0}, "bins"),
        ({"seq_len": 4, "pad_id": "0"}, "pad_id"),
    ],
)
def test_pack_arguments_are_checked(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dp.range(3).pack(**kwargs)


def test_tokenize_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="Hugging Face tokenizer"):
        dp.range(3).tokenize("gpt2")
    with pytest.raises(ValueError, match="bos"):
        dp.range(3).tokenize(encode_chars, bos=-1)
    with pytest.raises(ValueError, match="block"):
        dp.range(3).tokenize(encode_chars, block=0)


@pytest.mark.slow  # DataLoader worker processes
def test_a_hugging_face_tokenizer_in_workers_delivers_every_token_once() -> None:
    tok = small_tokenizer()
    texts = [f"the cat {i} sat on the mat " * (i % 5 + 1) for i in range(300)]
    tok.encode_batch(texts[:50])  # its threads ran before the workers were forked
    pipe = dp.from_sequence(texts).tokenize(tok, eos=1, block=32).pack(64).batch(4)
    with dp.Loader(pipe, num_workers=2) as loader:
        got = sorted(t for b in loader for t in b["input_ids"].reshape(-1).tolist() if t)
    assert got == sorted(t for text in texts for t in [*tok.encode(text).ids, 1])
