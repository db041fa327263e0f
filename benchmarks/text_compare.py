"""Text pretraining (W5): Parquet text -> BPE tokens (+ EOS) -> packed 2,048 -> batches of 8.

Used by ``compare.py`` (the ``text`` workload: ``python benchmarks/compare.py --only
text``). The data, made once per work folder (``generate``):

* documents of English-like text (words of a fixed pseudo-English vocabulary drawn
  with Zipf frequencies, sentences of 5-24 words, capitals and full stops), 50 to
  3,000 words each (log-uniform), deterministic from the seed, in Parquet shards
  (several files, several row groups each) with one ``text`` column;
* a byte-level BPE tokenizer trained on the first documents with ``tokenizers``
  (``Tokenizer(models.BPE())``, a ``BpeTrainer``, vocabulary 8,192 with the
  special tokens ``<pad>`` = 0 and ``<eos>`` = 1), saved beside the shards;
* what every implementation must deliver: the documents' tokens, each document's
  followed by EOS, counted, summed and summed in squares (``expected``).

Every implementation reads the same shards with the same tokenizer (no special
tokens added by the tokenizer; EOS appended to every document), packs the token
stream into sequences of 2,048 (concat packing: documents run on across
sequences; the last sequence of a stream padded with ``<pad>``) and batches 8:

* ``hand_written``: ``pyarrow`` ``iter_batches`` over the files, one tokenizer
  call per record batch (``encode_batch_fast`` where the installed ``tokenizers``
  has it, else ``encode_batch``: the call datapipes makes), the ids appended to a
  token buffer that is cut into 2,048-token rows, 8 rows stacked into a tensor
  (input ids only); ``hand_written_workers`` runs the same loop in a torch
  ``DataLoader`` with worker processes, each taking every n-th file;
* ``torchtitan_style``: torchtitan's Hugging Face loader (``HuggingFaceDataset``
  in ``torchtitan/datasets/hf_datasets.py``) rebuilt: ``datasets.load_dataset(
  "parquet", data_files=..., streaming=True)``, ``split_dataset_by_node``, one
  ``tokenizer.encode`` per document (EOS appended; torchtitan adds BOS too, no row
  does here), the ids appended to a list buffer from which
  ``seq_len + 1`` tokens are cut at a time (input = the first 2,048, labels = the
  last 2,048: the 2,049th token is only a label), in torchdata's
  ``StatefulDataLoader(batch_size=8)`` (torchtitan's loader class; 0 workers,
  its default). It drops the stream's last partial sequence, so it delivers a
  little fewer tokens (its check is against the same stream's first sequences);
* ``grain_pack``: Grain's ``ParquetIterDataset`` over the files (it interleaves
  them, reading on threads), the texts tokenized per record in a ``map``, or in
  blocks of 128 records (``batch`` -> ``map(encode_batch)`` -> ``FlatMapIterDataset``),
  Grain's own ``ConcatThenSplitIterDataset`` packing (it also makes segment ids
  and positions) and ``batch(8)`` (numpy arrays);
* ``datapipes_pack``: ``dp.files(...).read_parquet(columns=["text"]).tokenize(tok,
  eos=EOS).pack(2048).batch(8)`` in a ``dp.Loader``, 0 or 2 workers; each batch
  holds ``input_ids``, ``labels``, ``position_ids`` and ``cu_seqlens``.

Tokens counted (the throughput's numerator, the same for every row): the data
set's document tokens with their EOS, padding not counted. The check of a pass
(``keep``/``digest``): the count of non-padding tokens delivered, their sum and
sum of squares, which must equal ``expected`` (an order-free check: 2 workers
pack their own files, Grain interleaves them).

Worker processes are forked after the tokenizer has run on its threads in this
process; ``tokenizers`` then tokenizes on one thread in the children (0.23, here,
silently; older versions warn). The rows with workers set
``TOKENIZERS_PARALLELISM=false`` while they fork their workers, so that every worker
tokenizes on one thread whatever the version (2 workers on 2 cores).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonl_pipeline
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import datapipes as dp

SEQ_LEN = 2048
BATCH = 8
VOCAB = 8192
SPECIAL = ["<pad>", "<eos>"]
PAD, EOS = 0, 1  # the special tokens' ids (the trainer gives them the first ids)
MIN_WORDS, MAX_WORDS = 50, 3000
TRAIN_DOCUMENTS = 400  # the tokenizer is trained on the first documents
ENCODE_BLOCK = 128  # records per tokenizer call (datapipes' default block)
FORMAT_VERSION = 1
TOKENIZER_FILE = "tokenizer.json"
PARALLELISM = "TOKENIZERS_PARALLELISM"

FUNCTION_WORDS = (
    "the of and to a in is that it for was on with as he be by at from his an or "
    "are this had not but which they you were her she there one all we their has been"
).split()


# ----- the data --------------------------------------------------------------------------
def word_list(rng: np.random.Generator, size: int = 6000) -> list[str]:
    """English-looking words: 1-3 consonant-vowel syllables, some with a final consonant."""
    onsets = list("bcdfghjklmnprstvwz") + ["th", "ch", "sh", "st", "tr", "pl", "gr", "br"]
    vowels = list("aeiou") + ["ea", "ou", "ai", "ee"]
    words = set(FUNCTION_WORDS)
    out = list(FUNCTION_WORDS)
    while len(out) < size:
        syllables = int(rng.integers(1, 4))
        word = "".join(
            onsets[int(rng.integers(len(onsets)))] + vowels[int(rng.integers(len(vowels)))]
            for _ in range(syllables)
        )
        if rng.random() < 0.4:
            word += onsets[int(rng.integers(len(onsets)))]
        if word not in words:
            words.add(word)
            out.append(word)
    return out


def make_documents(count: int, seed: int = 0) -> list[str]:
    """``count`` documents (see the module doc), the same for the same ``count`` and ``seed``."""
    rng = np.random.default_rng(seed)
    vocab = word_list(rng)
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.05  # Zipf-like: "the" most often
    weights /= weights.sum()
    logs = rng.uniform(np.log(MIN_WORDS), np.log(MAX_WORDS + 1), count)
    lengths = np.minimum(np.exp(logs).astype(np.int64), MAX_WORDS)
    documents = []
    for length in lengths.tolist():
        words = [vocab[i] for i in rng.choice(len(vocab), size=length, p=weights).tolist()]
        cuts = np.cumsum(rng.integers(5, 25, size=length // 5 + 1)).tolist()
        sentences, start = [], 0
        for stop in cuts:
            if start >= length:
                break
            sentence = words[start:stop]
            sentence[0] = sentence[0].capitalize()  # a copy: the slice
            sentences.append(" ".join(sentence) + ".")
            start = stop
        documents.append(" ".join(sentences))
    return documents


def train_tokenizer(documents: list[str]) -> Any:
    """A byte-level BPE tokenizer of ``VOCAB`` ids trained on ``documents`` (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer)
    if [tokenizer.token_to_id(t) for t in SPECIAL] != [PAD, EOS]:
        raise AssertionError(f"the special tokens are not ids {PAD}, {EOS}")
    return tokenizer


def encoder(tokenizer: Any) -> Callable[..., Any]:
    """The batch call every batched implementation makes (the one datapipes makes)."""
    return getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)


def stream_digest(tokens: np.ndarray) -> tuple[int, int, int]:
    """(count, sum, sum of squares) of token ids: the check of a pass."""
    wide = tokens.astype(np.int64)
    return len(wide), int(wide.sum()), int((wide * wide).sum())


def generate(directory: Path, documents: int, shards: int, seed: int = 0) -> dict[str, Any]:
    """Shards ``train-0000N-of-0000M.parquet`` of ``documents`` documents in all, the
    tokenizer and the expected checks; cached by manifest."""

    def build() -> dict[str, Any]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        start = time.perf_counter()
        texts = make_documents(documents, seed)
        made = time.perf_counter() - start
        per_shard = -(-documents // shards)
        row_group = max(1, -(-per_shard // 6))  # about 6 row groups a file
        names = [f"train-{i:05d}-of-{shards:05d}.parquet" for i in range(shards)]
        for number, name in enumerate(names):
            part = texts[number * per_shard : (number + 1) * per_shard]
            pq.write_table(pa.table({"text": part}), directory / name, row_group_size=row_group)
        start = time.perf_counter()
        tokenizer = train_tokenizer(texts[:TRAIN_DOCUMENTS])
        trained = time.perf_counter() - start
        tokenizer.save(str(directory / TOKENIZER_FILE))
        flat: list[int] = []
        for encoding in encoder(tokenizer)(texts, add_special_tokens=False):
            flat += encoding.ids
            flat.append(EOS)
        stream = np.array(flat, dtype=np.int64)
        titan = len(stream) // (SEQ_LEN + 1) * (SEQ_LEN + 1)  # whole seq_len + 1 chunks
        files = [*names, TOKENIZER_FILE]
        return {
            "files": files,
            "sizes": [(directory / name).stat().st_size for name in files],
            "documents": documents,
            "row_group": row_group,
            "words": sum(len(t.split()) for t in texts),
            "tokens": len(stream),
            "expected": stream_digest(stream),
            "expected_titan": stream_digest(stream[:titan]),
            "generate_s": round(made, 2),
            "train_s": round(trained, 2),
            "vocab": tokenizer.get_vocab_size(),
        }

    wanted = {"version": FORMAT_VERSION, "documents": documents, "shards": shards, "seed": seed}
    what = f"{documents:,} text documents in {shards} Parquet shard(s) and a BPE tokenizer"
    made = jsonl_pipeline.cached_data_set(directory, wanted, what, build)
    made["expected"] = tuple(made["expected"])
    made["expected_titan"] = tuple(made["expected_titan"])
    return made


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


# ----- the implementations: (paths, tokenizer) -> an iterator of batches ------------------
def record_batches(paths: list[str]) -> Iterator[list[str]]:
    import pyarrow.parquet as pq

    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(columns=["text"]):
            yield batch.column(0).to_pylist()


def hand_written(paths: list[str], tokenizer: Any) -> Iterator[torch.Tensor]:
    """The hand-written loop (see the module doc): batches of input ids, [<= 8, 2048]."""
    encode = encoder(tokenizer)
    rest = np.empty(0, dtype=np.int64)
    rows: list[np.ndarray] = []
    for texts in record_batches(paths):
        flat = rest.tolist()
        for encoding in encode(texts, add_special_tokens=False):
            flat += encoding.ids
            flat.append(EOS)
        stream = np.array(flat, dtype=np.int64)
        full = len(stream) // SEQ_LEN * SEQ_LEN
        rows.extend(stream[:full].reshape(-1, SEQ_LEN))
        rest = stream[full:]
        while len(rows) >= BATCH:
            yield torch.from_numpy(np.stack(rows[:BATCH]))
            del rows[:BATCH]
    if len(rest):
        rows.append(np.concatenate([rest, np.full(SEQ_LEN - len(rest), PAD, dtype=np.int64)]))
    for start in range(0, len(rows), BATCH):
        yield torch.from_numpy(np.stack(rows[start : start + BATCH]))


class HandWritten(IterableDataset):
    """The hand-written loop over every n-th file of worker n (batches made in the workers)."""

    def __init__(self, paths: list[str], tokenizer: Any) -> None:
        super().__init__()
        self.paths, self.tokenizer = paths, tokenizer

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        paths = self.paths if info is None else self.paths[info.id :: info.num_workers]
        return hand_written(paths, self.tokenizer)


@contextmanager
def serial_tokenizers() -> Iterator[None]:
    """``TOKENIZERS_PARALLELISM=false`` while worker processes are forked: each worker
    tokenizes on one thread (``tokenizers`` 0.23 does so anyway in a child forked after
    its threads ran; older versions warn)."""
    saved = os.environ.get(PARALLELISM)
    os.environ[PARALLELISM] = "false"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(PARALLELISM, None)
        else:
            os.environ[PARALLELISM] = saved


def started(loader: Any) -> Iterator[Any]:
    """``loader``'s batches, its worker processes forked here (see ``serial_tokenizers``)."""
    with serial_tokenizers():
        stream = iter(loader)
        first = next(stream, None)
    if first is not None:
        yield first
        yield from stream


def hand_written_workers(paths: list[str], tokenizer: Any, workers: int) -> Iterator[Any]:
    loader = DataLoader(HandWritten(paths, tokenizer), batch_size=None, num_workers=workers)
    return started(loader)


class TorchtitanStyle(IterableDataset):
    """torchtitan's ``HuggingFaceDataset`` loop (see the module doc), one pass, no BOS."""

    def __init__(self, paths: list[str], tokenizer: Any, seq_len: int = SEQ_LEN) -> None:
        super().__init__()
        from datasets import load_dataset
        from datasets.distributed import split_dataset_by_node

        ds = load_dataset("parquet", data_files=paths, split="train", streaming=True)
        self._data = split_dataset_by_node(ds, rank=0, world_size=1)
        self._tokenizer = tokenizer
        self.seq_len = seq_len
        self._sample_idx = 0
        self._token_buffer: list[int] = []

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        max_buffer_token_len = 1 + self.seq_len
        for sample in iter(self._data):
            tokens = self._tokenizer.encode(sample["text"], add_special_tokens=False).ids
            tokens.append(EOS)
            self._token_buffer.extend(tokens)
            self._sample_idx += 1
            while len(self._token_buffer) >= max_buffer_token_len:
                x = torch.LongTensor(self._token_buffer[:max_buffer_token_len])
                self._token_buffer = self._token_buffer[max_buffer_token_len:]
                yield {"input": x[:-1]}, x[1:]


def torchtitan_style(paths: list[str], tokenizer: Any) -> Iterator[Any]:
    from torchdata.stateful_dataloader import StatefulDataLoader

    return iter(StatefulDataLoader(TorchtitanStyle(paths, tokenizer), batch_size=BATCH))


def grain_pack(paths: list[str], tokenizer: Any, batched: bool) -> Iterator[Any]:
    from grain import experimental as gx

    ds = gx.ParquetIterDataset(paths)
    if batched:
        encode = encoder(tokenizer)

        class Unbatch(gx.FlatMapTransform):
            max_fan_out = ENCODE_BLOCK

            def flat_map(self, element: list[dict[str, Any]]) -> list[dict[str, Any]]:
                return element

        def encode_block(records: list[dict[str, Any]]) -> list[dict[str, np.ndarray]]:
            texts = [r["text"] for r in records]
            return [
                {"input_ids": np.array([*e.ids, EOS], dtype=np.int32)}
                for e in encode(texts, add_special_tokens=False)
            ]

        ds = ds.batch(ENCODE_BLOCK, batch_fn=list).map(encode_block)
        ds = gx.FlatMapIterDataset(ds, Unbatch())
    else:

        def encode_one(record: dict[str, Any]) -> dict[str, np.ndarray]:
            ids = tokenizer.encode(record["text"], add_special_tokens=False).ids
            return {"input_ids": np.array([*ids, EOS], dtype=np.int32)}

        ds = ds.map(encode_one)
    ds = gx.ConcatThenSplitIterDataset(ds, length_struct={"input_ids": SEQ_LEN})
    return iter(ds.batch(BATCH))


def datapipes_pipe(pattern: str, tokenizer: Any) -> dp.DataPipe[Any]:
    return (
        dp.files(pattern)
        .read_parquet(columns=["text"])
        .tokenize(tokenizer, eos=EOS)
        .pack(SEQ_LEN, pad_id=PAD)
        .batch(BATCH)
    )


def datapipes_pack(pattern: str, tokenizer: Any, workers: int) -> Iterator[Any]:
    loader = dp.Loader(datapipes_pipe(pattern, tokenizer), num_workers=workers)
    return started(loader) if workers else iter(loader)


# ----- checks ------------------------------------------------------------------------------
def keep(batch: Any) -> tuple[int, int, int]:
    """(non-padding tokens, their sum, their sum of squares) of one batch of any row."""
    if isinstance(batch, (tuple, list)):  # torchtitan-style: ({"input": x[:-1]}, x[1:])
        inputs, labels = batch
        ids = torch.cat([inputs["input"], labels[:, -1:]], dim=1)
    else:
        ids = torch.as_tensor(batch["input_ids"] if isinstance(batch, dict) else batch)
        assert ids.shape[1:] == (SEQ_LEN,), ids.shape
    ids = ids.to(torch.int64)
    return int((ids != PAD).sum()), int(ids.sum()), int((ids * ids).sum())


def digest(kept: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    return tuple(sum(k[i] for k in kept) for i in range(3))  # type: ignore[return-value]


# ----- for compare.py --------------------------------------------------------------------
HAND = "hand-written (pyarrow, encode_batch, buffer)"
TITAN = "torchtitan-style (HF streaming, list buffer)"
GRAIN_ONE = "Grain ConcatThenSplit (encode per record)"
GRAIN_BLOCK = f"Grain ConcatThenSplit (encode_batch of {ENCODE_BLOCK})"
WORKERS = 2
HAND_WORKERS = f"hand-written in torch DataLoader ({WORKERS} workers)"


def ours(workers: int) -> str:
    return f"datapipes ({workers} workers)"


TITLE = (
    "Parquet text -> BPE tokenize (+ EOS) -> pack into 2,048-token sequences (concat) -> "
    "batch(8), {n:,} tokens"
)


def contenders(
    paths: list[str], pattern: str, tokenizer: Any
) -> list[tuple[str, Callable[[], Iterator[Any]], str | None, str]]:
    """(row name, make, baseline name or None, which expected check) of every row."""
    return [
        (HAND, functools.partial(hand_written, paths, tokenizer), None, "expected"),
        (TITAN, functools.partial(torchtitan_style, paths, tokenizer), HAND, "expected_titan"),
        (GRAIN_ONE, functools.partial(grain_pack, paths, tokenizer, False), HAND, "expected"),
        (GRAIN_BLOCK, functools.partial(grain_pack, paths, tokenizer, True), HAND, "expected"),
        (ours(0), functools.partial(datapipes_pack, pattern, tokenizer, 0), HAND, "expected"),
        (
            HAND_WORKERS,
            functools.partial(hand_written_workers, paths, tokenizer, WORKERS),
            HAND,
            "expected",
        ),
        (
            ours(WORKERS),
            functools.partial(datapipes_pack, pattern, tokenizer, WORKERS),
            HAND_WORKERS,
            "expected",
        ),
    ]


#: The data set's manifest of the run (filled by compare.py's builder, for the section).
INFO: dict[str, Any] = {}


def section(rows: list[Any]) -> list[str]:
    """The markdown section of the workload (``rows``: ``Timed`` rows)."""
    if not INFO:
        return []
    made = INFO
    tokens, documents = made["tokens"], made["documents"]
    out = ["", "## Text pretraining", ""]
    out.append(
        f"{documents:,} generated documents ({made['words']:,} words, "
        f"{MIN_WORDS}-{MAX_WORDS:,} a document) in {len(made['files']) - 1} Parquet shards "
        f"(row groups of {made['row_group']} documents); a byte-level BPE tokenizer of "
        f"{made['vocab']:,} ids trained here on {min(TRAIN_DOCUMENTS, documents)} of them "
        f"({made['train_s']:.1f} s); {tokens:,} tokens with the EOS of every document "
        f"({tokens / documents:,.0f} a document, {-(-tokens // SEQ_LEN):,} sequences of "
        f"{SEQ_LEN:,}). Tokens/s counts these tokens for every row (padding not counted); "
        "every pass delivered the same count, sum and sum of squares of non-padding "
        "tokens (the torchtitan-style loader: those of the whole seq_len + 1 chunks it "
        "cuts; it drops the last partial one)."
    )
    out += ["", "| implementation | tokens/s | sequences/s | CPU s per M tokens |"]
    out.append("| --- | ---: | ---: | ---: |")
    for row in rows:
        if row.skipped:
            out.append(f"| {row.name} | — | — | skipped: {row.skipped} |")
            continue
        out.append(
            f"| {row.name} | {tokens / row.best:,.0f} | {tokens / SEQ_LEN / row.best:,.1f} "
            f"| {row.cpu / tokens * 1e6:.2f} |"
        )
    return out


def goals(rows: list[Any]) -> list[tuple[bool | None, str]]:
    """(ok or None when not measured, text) for the issue's goals."""
    by_name = {r.name: r for r in rows if not r.skipped}
    mine, pooled = by_name.get(ours(0)), by_name.get(ours(WORKERS))
    out: list[tuple[bool | None, str]] = []

    def speedup(theirs: Any, us: Any) -> float | None:
        return theirs.best / us.best if theirs and us else None

    def add(ratio: float | None, target: float, text: str, strict: bool = False) -> None:
        ok = None if ratio is None else (ratio > target if strict else ratio >= target)
        out.append((ok, f"{text}: {'n/a' if ratio is None else f'{ratio:.2f}x'}"))

    add(speedup(by_name.get(HAND), mine), 1.0, "datapipes (0 workers) >= the hand-written loop")
    add(
        speedup(by_name.get(TITAN), mine),
        2.0,
        "datapipes (0 workers) >= 2x faster than the torchtitan-style loader",
    )
    grains = [by_name[n] for n in (GRAIN_ONE, GRAIN_BLOCK) if n in by_name]
    fastest = min(grains, key=lambda r: r.best) if grains else None
    add(
        speedup(fastest, mine),
        1.0,
        "datapipes (0 workers) faster than Grain's packing (its faster row)",
        strict=True,
    )
    add(
        speedup(by_name.get(HAND_WORKERS), pooled),
        1.0,
        f"datapipes ({WORKERS} workers) >= the hand-written loop in a DataLoader",
    )
    add(
        speedup(mine, pooled),
        1.6,
        f"datapipes {WORKERS} workers >= 1.6x datapipes in one process",
    )
    return out


if __name__ == "__main__":  # python benchmarks/text_compare.py: compare.py's text workload
    import subprocess
    import sys

    here = Path(__file__).resolve().parent
    sys.exit(
        subprocess.call([sys.executable, str(here / "compare.py"), "--only", "text"] + sys.argv[1:])
    )
