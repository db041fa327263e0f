"""Text steps of a recipe: ``tokenize`` and ``pack`` (nodes: ``tokenize``, ``pack`` in nodes.steps).

A tokenizer is a Hugging Face ``tokenizers.Tokenizer`` (or a ``transformers``
fast tokenizer, through its ``backend_tokenizer``), encoded many documents per
call on its own threads; or any callable ``text -> list of token ids``. Its
identity is part of the recipe's fingerprint: for a Hugging Face tokenizer a
digest of its whole definition (vocabulary, merges, normalizer), so a
checkpoint taken with another vocabulary is refused; for a callable its
qualified name, or the ``name`` given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from datapipes.pipe import DataPipe
from nodes import Context, Node
from nodes.steps.pack import PackNode, check_pack_args
from nodes.steps.tokenize import BLOCK, TokenizeNode


class Encoder:
    """A tokenizer as ``encode_batch(texts) -> token id lists`` (picklable: it goes to
    DataLoader workers), and ``identity``, a short string that changes with the vocabulary."""

    def __init__(self, tokenizer: Any, name: str | None = None) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)  # transformers' fast tokenizers
        self.hf = backend if backend is not None else tokenizer
        self.batched = hasattr(self.hf, "encode_batch") and hasattr(self.hf, "to_str")
        if not self.batched and not callable(tokenizer):
            raise TypeError(
                "tokenize takes a Hugging Face tokenizer (tokenizers.Tokenizer, or a "
                "transformers fast tokenizer) or a callable text -> list of token ids, got "
                f"a {type(tokenizer).__name__}"
            )
        if self.batched:
            definition = self.hf.to_str().encode()
            self.identity = name or f"tokenizers:{hashlib.sha256(definition).hexdigest()[:16]}"
        else:
            self.hf = tokenizer
            qualname = getattr(tokenizer, "__qualname__", type(tokenizer).__qualname__)
            self.identity = name or f"callable:{qualname}"

    def __call__(self, texts: list[str]) -> Sequence[Sequence[int]]:
        if self.batched:
            encode = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)
            return [encoding.ids for encoding in encode(texts, add_special_tokens=False)]
        return [self.hf(text) for text in texts]


class Tokenize(DataPipe[Any]):
    """Records with their text's token ids added (see :meth:`DataPipe.tokenize`)."""

    name = "tokenize"
    replays_input = True  # resumes by re-reading a block of upstream records
    consumer_length = DataPipe._upstream_length

    def __init__(
        self,
        upstream: DataPipe[Any],
        tokenizer: Any,
        *,
        field: str = "text",
        output: str = "input_ids",
        bos: int | None = None,
        eos: int | None = None,
        block: int = BLOCK,
        name: str | None = None,
    ) -> None:
        encoder = tokenizer if isinstance(tokenizer, Encoder) else Encoder(tokenizer, name)
        for label, value in (("bos", bos), ("eos", eos)):
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"tokenize {label} must be a token id (an int >= 0) or None")
        if not isinstance(field, str) or not isinstance(output, str):
            raise TypeError("tokenize field and output must be str (the records' keys)")
        if type(block) is not int or block < 1:
            raise ValueError(f"tokenize block must be an int >= 1, got {block!r}")
        super().__init__(
            upstream,
            args=(encoder,),
            tokenizer=encoder.identity, field=field, output=output, bos=bos, eos=eos,
            block=block,
        )  # fmt: skip

    def _build(self, ctx: Context) -> Node[Any]:
        kw = self.kwargs
        return TokenizeNode(
            self.inputs[0].build(ctx), self.args[0], field=kw["field"], output=kw["output"],
            bos=kw["bos"], eos=kw["eos"], block=kw["block"],
        )  # fmt: skip


class Pack(DataPipe[Any]):
    """Token ids packed into sequences of one length (see :meth:`DataPipe.pack`)."""

    name = "pack"
    replays_input = True  # resumes by re-reading the documents of the current sequence

    def __init__(
        self,
        upstream: DataPipe[Any],
        seq_len: int,
        *,
        method: str = "concat",
        field: str = "input_ids",
        pad_id: int = 0,
        bins: int = 8,
        drop_last: bool = False,
    ) -> None:
        check_pack_args(seq_len, method, bins, pad_id)
        super().__init__(
            upstream,
            args=(seq_len,),
            method=method, field=field, pad_id=pad_id, bins=bins, drop_last=bool(drop_last),
        )  # fmt: skip

    def _build(self, ctx: Context) -> Node[Any]:
        kw = self.kwargs
        return PackNode(
            self.inputs[0].build(ctx), self.args[0], method=kw["method"], field=kw["field"],
            pad_id=kw["pad_id"], bins=kw["bins"], drop_last=kw["drop_last"],
        )  # fmt: skip
