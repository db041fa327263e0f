"""The recipe: an immutable, picklable description of a pipeline.

Its fluent API (``.map``, ``.shuffle``, ...) is in :mod:`datapipes.fluent`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from datapipes.describe import describe
from datapipes.fluent import FluentSteps
from datapipes.identity import digest, identity, plain
from nodes import Context, Node
from nodes.dispatch import DispatchedSourceNode
from nodes.observe.stats import SAMPLE_EVERY, TRACE_SAMPLE_EVERY, StatsNode

T = TypeVar("T")


class DataPipe(FluentSteps[T]):
    """A recipe: a graph of steps that runs nothing until it is built.

    Recipes are immutable (every step returns a new recipe), picklable when
    their functions are, printable (``repr`` reads like the code that built
    them) and fingerprinted (``fingerprint()`` is stable across processes).
    ``build(ctx)`` turns a recipe into runtime nodes; a :class:`datapipes.Loader`
    does that for you.

    >>> import datapipes as dp
    >>> dp.range(10).map(abs).batch(4)
    dp.range(10).map(abs).batch(4)
    """

    #: the name in the fluent API and in ``repr``; the step's kind in its identity
    name = "pipe"

    # What a step declares about itself; the Loader reads these to place and check it
    # (datapipes.placement). Steps set them as class attributes or properties.

    #: It must run in the main process (``pin_memory``, ``to_device``): the Loader
    #: splits the recipe there and runs the part before it in the DataLoader workers.
    main_process_only: bool = False
    #: It resumes by re-reading items of its input (a buffer shuffle, ``flat_map``, a
    #: parallel map, ``shard``, a custom node), so no unordered step may come before it.
    replays_input: bool = False
    #: How it re-reads its input, for the message that refuses an unordered step before it.
    replay_note: str = "re-reads them when it resumes"
    #: It yields items in the order they finish (``map(..., ordered=False)``), so a
    #: second pass from the same position may order them differently.
    unordered: bool = False

    def __init__(self, *inputs: DataPipe[Any], args: Sequence[Any] = (), **kwargs: Any) -> None:
        object.__setattr__(self, "inputs", tuple(inputs))
        object.__setattr__(self, "args", tuple(args))
        object.__setattr__(self, "kwargs", dict(kwargs))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"{type(self).__name__} recipes are immutable; chain a new step instead of "
            f"setting .{name}"
        )

    # ----- description -----------------------------------------------------
    def _own_args(self) -> str:
        parts = [describe(a) for a in self.args]
        parts += [f"{k}={describe(v)}" for k, v in self.kwargs.items()]
        return ", ".join(parts)

    def describe_step(self) -> str:
        """This step alone, e.g. ``"shuffle(buffer_size=100)"``."""
        return f"{self.name}({self._own_args()})"

    def __repr__(self) -> str:
        if len(self.inputs) == 1:
            return f"{self.inputs[0]!r}.{self.describe_step()}"
        if not self.inputs:
            return f"dp.{self.describe_step()}"
        inputs = ", ".join(repr(pipe) for pipe in self.inputs)
        rest = self._own_args()
        return f"dp.{self.name}({inputs}{', ' + rest if rest else ''})"

    def steps(self) -> list[str]:
        """Every step of the recipe, sources first, each with its nesting depth.

        Used to explain what differs when a checkpoint is loaded into another recipe.
        """
        out: list[str] = []

        def walk(pipe: DataPipe[Any], depth: int) -> None:
            for child in pipe.inputs:
                walk(child, depth + (len(pipe.inputs) > 1))
            out.append("  " * depth + pipe.describe_step())

        walk(self, 0)
        return out

    def resume_caveat(self) -> str | None:
        """Why resuming this step is not exact, said at ``Loader(...)``; ``None``: it is."""
        return None

    def resume_caveats(self) -> list[str]:
        """The :meth:`resume_caveat` of every step of the recipe, sources first."""
        found = [caveat for pipe in self.inputs for caveat in pipe.resume_caveats()]
        own = self.resume_caveat()
        return found if own is None else [*found, own]

    def identity(self, *, names: bool = True) -> dict[str, Any]:
        """The recipe's structure as plain data: step kinds, parameters, nesting.

        What the fingerprint and every random stream derive from, unlike
        ``repr``, which is for people. Functions count by their qualified
        name (``names=False``: not at all), data sources by type and length.
        See :mod:`datapipes.identity` for what it does and does not see.

        >>> import datapipes as dp
        >>> dp.range(3).shuffle(seed=1).identity()["kwargs"]
        {'seed': 1}
        """
        return identity(self, names=names)

    def identity_params(self, names: bool) -> tuple[list[Any], dict[str, Any]]:
        """This step's own ``(args, kwargs)`` as plain data, for :meth:`identity`.

        Sources override it to describe their data by type and length.
        """
        args = [plain(value, names) for value in self.args]
        return args, {key: plain(value, names) for key, value in self.kwargs.items()}

    def fingerprint(self) -> str:
        """A hex digest of the recipe's identity, the same in every process and run.

        It changes with any step, parameter, explicit seed or function name
        (so a checkpoint of another recipe is refused), and not with the
        contents of data sources or the bodies of functions.
        """
        return digest(self.identity())[:16]

    def _key(self) -> int:
        """The step's place in the recipe, as a 63-bit int seeding its random streams.

        From the identity without function names: renaming a function, or a
        new wording of ``repr``, leaves every shuffle order as it was.
        """
        cached = self.__dict__.get("_key_cache")
        if cached is None:  # a recipe never changes: every build of it asks again
            cached = int(digest(self.identity(names=False))[:16], 16) >> 1
            object.__setattr__(self, "_key_cache", cached)
        return cached

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and self.name == other.name  # type: ignore[attr-defined]
            and _identity(self.args) == _identity(other.args)  # type: ignore[attr-defined]
            and _identity(self.kwargs) == _identity(other.kwargs)  # type: ignore[attr-defined]
            and self.inputs == other.inputs  # type: ignore[attr-defined]
        )

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.__dict__))

    def _with_inputs(self, *inputs: DataPipe[Any]) -> DataPipe[T]:
        """This step, unchanged, reading from ``inputs`` instead of its own."""
        state = {k: v for k, v in self.__dict__.items() if k != "_key_cache"}  # new inputs
        return _rebuild(type(self), {**state, "inputs": tuple(inputs)})

    # ----- runtime -----------------------------------------------------------
    def build(self, ctx: Context | None = None) -> Node[T]:
        """Build the runtime nodes for ``ctx`` (default: one consumer, epoch 0, seed 0).

        With ``ctx.stats`` (or a ``ctx.trace``) every step's node is wrapped in a
        :class:`nodes.observe.stats.StatsNode` that counts its items and time (and notes spans).
        """
        ctx = Context() if ctx is None else ctx
        node = self._build(ctx)
        if node.elastic == "source" and node.place is None:
            node.place = ctx.place_of(self._key())
            if ctx.dispatch is not None:  # dynamic dispatch: it reads the units it claims
                node = DispatchedSourceNode(node, ctx.dispatch)
        if ctx.stats or ctx.trace is not None:
            # A trace alone times one item in TRACE_SAMPLE_EVERY: it keeps few of them anyway.
            every = SAMPLE_EVERY if ctx.stats else TRACE_SAMPLE_EVERY
            node = StatsNode(
                node,
                self.fingerprint(),
                self.stats_label(),
                sample_every=every,
                recorder=ctx.trace,
                counts=ctx.stats,
            )
        return node

    def stats_label(self) -> str:
        """This step's name in the statistics table (:meth:`datapipes.Loader.stats`)."""
        return self.describe_step()

    def _build(self, ctx: Context) -> Node[T]:
        raise NotImplementedError

    def consumer_length(self, ctx: Context) -> int | None:
        """How many items this recipe yields for ``ctx``'s consumer, or ``None`` if unknown.

        Known without reading any data for sequences and the steps that keep
        counts computable (map, shuffle, batch, take, repeat, concat, zip, ...);
        a filter, a flat_map or a file reader makes it unknown.
        """
        return None

    def _upstream_length(self, ctx: Context) -> int | None:
        return self.inputs[0].consumer_length(ctx)

    def random_access(self) -> tuple[Sequence[Any], tuple[Callable[[Any], Any], ...]] | None:
        """``(sequence, fns)`` if item i is ``fns(sequence[i])``, else ``None`` (a stream)."""
        return None


def _identity(values: Any) -> Any:
    """Compare plain values by value and data objects (datasets, arrays) by identity."""
    if isinstance(values, dict):
        return {k: _identity(v) for k, v in values.items()}
    if isinstance(values, tuple):
        return tuple(_identity(v) for v in values)
    if values is None or isinstance(values, bool | int | float | str | range):
        return values
    return id(values)


def _rebuild(cls: type, state: dict[str, Any]) -> DataPipe[Any]:
    pipe = cls.__new__(cls)
    for key, value in state.items():
        object.__setattr__(pipe, key, value)
    return pipe
