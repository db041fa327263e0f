"""The iterable source node: any re-iterable object, resumed by its own state or by replay."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from torch.utils.data import IterableDataset

from nodes.base import Node, NotReset, State
from nodes.context import Context
from nodes.errors import InvalidStateError
from nodes.origins import OriginReader, refuse_random_map
from nodes.sources.hf_iterable import hf_part, is_hf_iterable
from nodes.sources.worker_info import consumer_worker_info, started_with
from nodes.state_checks import expect_dict, expect_int, expect_keys


def is_factory(source: Any) -> bool:
    """Whether ``source`` is a zero-argument function that returns the iterable."""
    return callable(source) and not hasattr(source, "__iter__")


def check_restartable(source: Any) -> None:
    """Reject a one-shot iterator: it cannot restart for a new epoch or a resume."""
    if hasattr(source, "__next__") and not hasattr(source, "load_state_dict"):
        raise TypeError(
            f"from_iterable got a one-shot iterator ({type(source).__name__}): it cannot "
            "restart for a new epoch or a resume. Pass a re-iterable object (a list, a "
            "dataset) or a function returning a fresh iterable, e.g. "
            "dp.from_iterable(lambda: my_generator())."
        )


#: What an object's own code raises on a state it cannot use (a damaged checkpoint).
_STATE_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError)


def _unusable(obj: Any, error: Exception) -> InvalidStateError:
    return InvalidStateError(
        "inner",
        f"a state that {type(obj).__name__}.load_state_dict can resume",
        "?",
        note=f"resuming from it failed: {type(error).__name__}: {error}",
    )


def _first_checked(items: Iterator[Any], obj: Any) -> Iterator[Any]:
    """``items``, with an error at the first one (where objects such as an HF dataset apply
    a loaded state) reported as the damaged state it comes from, not as a raw error."""
    try:
        first = next(items, _END)
    except _STATE_ERRORS as error:
        raise _unusable(obj, error) from error
    if first is _END:
        return
    yield first
    yield from items


_END = object()


class IterableNode(Node):
    """Yields the items of a re-iterable object, resuming as well as it allows.

    * If the object has ``state_dict()``/``load_state_dict()`` (a torchdata
      ``Stateful``, a Hugging Face ``IterableDataset``, a ``StatefulDataLoader``),
      the state is the object's own state and resume is whatever it provides.
      Its state must be plain data for the checkpoint to be plain.
    * Otherwise resume is a *replay*: the state is the number of items yielded,
      and ``reset(state)`` iterates the object afresh and skips that many
      items. That costs O(position) and needs the object to yield the same
      sequence every time it is iterated.

    ``source`` may also be a zero-argument callable returning the iterable.
    A one-shot iterator (a generator object) cannot restart and is rejected.
    An object with ``set_epoch(epoch)`` (a Hugging Face ``IterableDataset``, a
    sampler) is told the epoch at every reset, before it is iterated.

    Split across consumers (``world_size * num_workers`` of them):

    * a Hugging Face ``IterableDataset`` by its shards (see :mod:`nodes.sources.hf_iterable`);
    * a torch ``IterableDataset`` that splits itself by
      ``torch.utils.data.get_worker_info()``: it is shown consumer ``c`` of ``C``
      as worker ``c`` of ``C`` while it starts (see :mod:`nodes.sources.worker_info`), and
      refused at its first item if it does not read the worker info;
    * anything else is refused (each consumer would read every item): put a
      ``shard()`` after it.

    With one consumer (also before a ``shard()``, which splits the stream later)
    both kinds of dataset see no worker info, so they read all of their data.
    """

    kind = "iterable source"
    elastic_refusal = (
        "(from_iterable) has no positions of its own to deal to other consumers; "
        "dp.from_sequence (random access) or dp.files can be re-dealt"
    )

    def __init__(self, source: Iterable[Any] | Callable[[], Iterable[Any]], ctx: Context) -> None:
        super().__init__()
        self._splits_itself = is_hf_iterable(source) or isinstance(source, IterableDataset)
        if ctx.num_consumers > 1 and not self._splits_itself:
            raise ValueError(
                f"from_iterable(...) cannot split its items across {ctx.num_consumers} "
                "consumers: every consumer would read every item (the classic IterableDataset "
                "+ num_workers duplication). Add .shard() after it (each consumer keeps every "
                "n-th item), or use a source that shards itself (dp.from_sequence, dp.files, "
                "a Hugging Face IterableDataset, a torch IterableDataset that splits itself "
                "by get_worker_info(): pass the dataset object, not a function returning it)."
            )
        self._is_factory = is_factory(source)
        if not self._is_factory:
            check_restartable(source)
        self._source = source
        self._ctx = ctx
        self._obj: Any = None
        self._initial_state: Any = None
        self._it: Iterator[Any] = NotReset(self)
        self._count = 0

    def _open(self) -> Any:
        """The object to iterate for this pass: the source, or a new one from its factory."""
        obj = self._source() if self._is_factory else self._source
        if is_hf_iterable(obj):
            obj = hf_part(obj, self._ctx)
        if self._obj is None:
            self.stateful = hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")
            if self.stateful:
                self._initial_state = obj.state_dict()
        self._obj = obj
        return obj

    def reset(self, state: State | None = None) -> None:
        # A stateful object keeps its own position, so it is opened once; anything else
        # is iterated afresh (a factory called again) and replayed up to the position.
        obj = self._obj if self._obj is not None and self.stateful else self._open()
        set_epoch = getattr(obj, "set_epoch", None)
        if callable(set_epoch):  # an object that reshuffles per epoch (HF, a sampler) learns it
            set_epoch(self._ctx.epoch)
        if self.stateful:
            if state is None:
                obj.load_state_dict(self._initial_state)
                self._it = self._iterate(obj)
                return
            try:
                obj.load_state_dict(state["inner"])
            except _STATE_ERRORS as error:
                raise _unusable(obj, error) from error
            self._it = _first_checked(self._iterate(obj), obj)
            return
        self._count = 0 if state is None else int(state["count"])
        self._it = self._iterate(obj)
        if self._count:
            wanted, self._count = self._count, sum(1 for _ in islice(self._it, self._count))
            if self._count < wanted:  # a position the source never reached: no silent end
                raise InvalidStateError(
                    "count", f"at most {self._count} (the items the source has)", wanted
                )

    def _iterate(self, obj: Any) -> Iterator[Any]:
        """``iter(obj)``; a dataset starts seeing this consumer's worker info (or none)."""
        if is_hf_iterable(obj):  # already this consumer's part (hf_part): HF must not split it
            return started_with(obj, None)
        if not isinstance(obj, IterableDataset):
            return iter(obj)
        if self._ctx.num_consumers == 1:
            return started_with(obj, None)  # the only reader: all of its data
        info = consumer_worker_info(self._ctx, obj)
        refusal = (
            f"from_iterable({type(obj).__name__}) cannot split its items across "
            f"{self._ctx.num_consumers} consumers: it did not ask "
            "torch.utils.data.get_worker_info() when it started, so every consumer would read "
            "every item. Split it by the worker info in its __iter__, or add .shard() after "
            "it (each consumer keeps every n-th item)."
        )
        return started_with(obj, info, refusal=refusal)

    def __next__(self) -> Any:
        item = next(self._it)
        self._count += 1
        return item

    def __iter__(self) -> Iterator[Any]:
        return self._it if self.stateful else self

    def origin_reader(self) -> OriginReader:
        raise refuse_random_map(
            self,
            "(from_iterable) has no positions in the epoch",
            "after a .shard() (which numbers the stream's items), or use dp.from_sequence / "
            "dp.files",
        )

    def state_dict(self) -> State:
        if self.stateful:
            return {"inner": self._obj.state_dict()}
        return {"count": self._count}

    def validate_state(self, state: Any, path: str = "node") -> None:
        # The object's own state ("inner") is opaque; a replay count is ours.
        expect_dict(state, path)
        source = self._source if not self._is_factory else self._obj
        stateful = (
            None
            if source is None
            else hasattr(source, "load_state_dict") and hasattr(source, "state_dict")
        )
        if stateful or (stateful is None and "inner" in state):
            expect_keys(state, path, {"inner"})
            return
        expect_keys(state, path, {"count"})
        expect_int(state, "count", path)
        if source is not None and hasattr(source, "__len__"):
            expect_int(state, "count", path, 0, len(source))
