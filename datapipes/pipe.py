"""The recipe: an immutable, picklable description of a pipeline, with the fluent API."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any, Generic, TypeVar

from datapipes.describe import describe
from datapipes.identity import digest, identity, plain
from datapipes.topology import resolve_topology
from datapipes.torch_dataset import TorchDataset
from nodes import Context, Node
from nodes.dispatch import DispatchedSourceNode
from nodes.stats import StatsNode

T = TypeVar("T")


class DataPipe(Generic[T]):
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

        With ``ctx.stats`` every step's node is wrapped in a
        :class:`nodes.stats.StatsNode` that counts its items and time.
        """
        ctx = Context() if ctx is None else ctx
        node = self._build(ctx)
        if node.elastic == "source" and node.place is None:
            node.place = ctx.place_of(self._key())
            if ctx.dispatch is not None:  # dynamic dispatch: it reads the units it claims
                node = DispatchedSourceNode(node, ctx.dispatch)
        if ctx.stats:
            node = StatsNode(node, self.fingerprint(), self.stats_label())
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

    # ----- fluent steps ------------------------------------------------------
    def map(
        self,
        fn: Callable[[T], Any],
        num_workers: int | None = None,
        *,
        method: str = "thread",
        ordered: bool = True,
    ) -> DataPipe[Any]:
        """Apply ``fn`` to every item: ``dp.range(3).map(str)`` yields ``'0', '1', '2'``.

        With ``num_workers=k`` the calls run on a pool of ``k`` threads
        (``method="thread"``, for work that releases the GIL: numpy, Pillow,
        torch ops, I/O) or processes (``method="process"``, for pure-Python
        work; ``fn`` must pickle). At most ``2 * k`` tasks are in flight,
        each holding as many items as take about 2 ms (threads) or 10 ms
        (processes) of work, up to 256.
        ``ordered=True`` keeps the upstream order and exact resume;
        ``ordered=False`` yields results as they finish, and a resume then
        neither loses nor repeats items but may change their order; so no
        later step may resume by re-reading its input (a buffer shuffle,
        ``flat_map``, ``unbatch``, ``shard``, another parallel map, DataLoader
        workers), and the Loader refuses such recipes. See
        :class:`nodes.ParallelMapNode`.

        >>> import datapipes as dp
        >>> list(dp.Loader(dp.range(4).map(str, num_workers=2)))
        ['0', '1', '2', '3']
        """
        return _steps().Map(self, fn, num_workers, method=method, ordered=ordered)

    def random_map(
        self,
        fn: Callable[..., Any],
        *,
        global_rng: bool | str | Sequence[str] = False,
        seed: int | None = None,
    ) -> DataPipe[Any]:
        """Random transforms that resume exactly: ``fn(item, rng)`` for every item.

        ``rng`` is a fresh ``numpy.random.Generator`` whose stream is a pure
        function of (seed, epoch, this step's place in the recipe, the item's
        place in the epoch's data): the same item gets the same draws at any
        ``num_workers`` and world size, after a resume and in a new process,
        and new draws every epoch. ``global_rng=True`` calls ``fn(item)`` with
        torch's CPU RNG, ``random`` and ``np.random`` seeded that way per item and
        restored after it, so unmodified torchvision-style transforms become
        reproducible (``global_rng="torch"``, or some of ``"torch,random,numpy"``:
        only those; numpy's costs the most). ``seed`` overrides the Loader's
        seed for this step. Put it before ``prefetch()`` and
        ``map(..., num_workers=...)``, which read ahead (the Loader refuses it
        after them, saying so). See
        :class:`nodes.random_map.RandomMapNode`.

        >>> import datapipes as dp
        >>> pipe = dp.range(3).random_map(lambda x, rng: x + rng.random())
        >>> [int(x) for x in dp.Loader(pipe)], list(dp.Loader(pipe)) == list(dp.Loader(pipe))
        ([0, 1, 2], True)
        """
        from datapipes.random_steps import RandomMap  # it imports this module

        return RandomMap(self, fn, global_rng=global_rng, seed=seed)

    def random_resized_crop(
        self,
        size: int,
        *,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        flip: float = 0.5,
        fields: str | Sequence[str] | None = None,
        seed: int | None = None,
        fused: bool = True,
        num_threads: int | None = None,
    ) -> DataPipe[Any]:
        """Seeded random resized crops of images to ``size x size``, flipped with ``flip``.

        torchvision's ``RandomResizedCrop`` draws (an area fraction in ``scale``,
        a log-uniform aspect ratio in ``ratio``, 10 tries, then the centre crop)
        and a horizontal flip with probability ``flip``, on uint8 ``(C, H, W)``
        tensors, or on the image fields of dict samples (``fields=None``: every
        field with an image extension, one box for all of a sample's; a name or
        names pick fields). The output is uint8 ``(C, size, size)``, resized
        with torch's antialiased bilinear interpolation. The draws are seeded
        per item as in :meth:`random_map`: the same at any ``num_workers``,
        world size and after a resume, new every epoch; ``seed`` overrides the
        Loader's seed for this step.

        Right after :meth:`decode` it decodes the images itself (``fused=True``):
        a JPEG's size comes from its header, the box is drawn, and the image is
        decoded at the smallest DCT scale (1/8 to 4/8, or full) that keeps the
        box at least ``size`` pixels on each side. The boxes are the same as
        unfused; the pixels are identical when no reduction applies and
        slightly different (a lower-resolution source) when one does;
        ``fused=False`` decodes at full size first (the decode's
        ``image_size`` applies then; fused, the box sets the scale). ``num_threads=k`` decodes
        and crops on ``k`` threads (the decoders release the GIL), resuming
        like ``map(..., num_workers=k)``, with the same pixels.

        >>> import datapipes as dp, torch
        >>> images = [torch.zeros(3, 40, 60, dtype=torch.uint8)] * 2
        >>> [tuple(x.shape) for x in dp.Loader(dp.from_sequence(images).random_resized_crop(16))]
        [(3, 16, 16), (3, 16, 16)]
        """
        from datapipes.vision import RandomResizedCrop  # it imports this module

        return RandomResizedCrop(
            self,
            size,
            scale=scale,
            ratio=ratio,
            flip=flip,
            fields=fields,
            seed=seed,
            fused=fused,
            num_threads=num_threads,
        )

    def filter(self, predicate: Callable[[T], bool]) -> DataPipe[T]:
        """Keep the items for which ``predicate(item)`` is true."""
        return _steps().Filter(self, predicate)

    def flat_map(self, fn: Callable[[T], Iterable[Any]]) -> DataPipe[Any]:
        """Replace every item by the items of ``fn(item)`` (a deterministic function)."""
        return _steps().FlatMap(self, fn)

    def shuffle(self, buffer_size: int | None = None, *, seed: int | None = None) -> DataPipe[T]:
        """Shuffle, with a new order every epoch.

        Without ``buffer_size`` on random-access data (``range``,
        ``from_sequence`` and maps of them) this is a global shuffle: a fresh
        permutation of all items every epoch, computed on the fly with O(1)
        memory and state. On a stream, ``buffer_size`` is required and the
        shuffle mixes items within a buffer of that size (see
        :class:`nodes.BufferShuffleNode` for its state and resume cost).
        ``seed`` overrides the Loader's seed for this step.
        """
        return _steps().Shuffle(self, buffer_size=buffer_size, seed=seed)

    def batch(
        self,
        size: int,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> DataPipe[Any]:
        """Group ``size`` items and collate them (``dp.default_collate`` unless ``collate_fn``)."""
        return _steps().Batch(self, size, drop_last=drop_last, collate_fn=collate_fn)

    def unbatch(self) -> DataPipe[Any]:
        """Split batches (lists, tensors, arrays, dicts of columns) back into items."""
        return _steps().Unbatch(self)

    def take(self, count: int) -> DataPipe[T]:
        """Stop after ``count`` items (per consumer)."""
        return _steps().Take(self, count)

    def repeat(self, times: int | None = None) -> DataPipe[T]:
        """Run the pipeline ``times`` times within one epoch (forever if ``None``).

        Each round gets a fresh random stream, so shuffles differ between rounds.
        """
        return _steps().Repeat(self, times)

    def decode(
        self,
        *,
        image: str | None = "chw",
        image_mode: str | None = "RGB",
        decoders: dict[str, Callable[[bytes], Any] | None] | None = None,
        on_error: str = "raise",
        image_size: int | tuple[int, int] | None = None,
        image_backend: str = "auto",
    ) -> DataPipe[Any]:
        """Decode the bytes fields of dict samples by extension (``read_tar``, ``read_bytes``).

        Built in: ``json``, ``txt``/``text``/``transcript``,
        ``cls``/``index``/``inx``/``id`` (int), ``npy``, ``npz`` (a dict of
        arrays), ``pth`` (``weights_only``), images (``jpg``, ``png``,
        ``webp``, ... through Pillow) as uint8 tensors laid out ``"chw"``
        (default) or ``"hwc"``, or ``"pil"`` images (``image=None`` leaves
        images as bytes), and audio (``wav``, ``flac``, ``ogg``/``oga``,
        ``opus``, ``mp3``, ``aiff``/``aif``, ``au``, ``caf``, ``w64``,
        ``rf64`` through soundfile, ``pip install 'datapipes-torch[audio]'``)
        as a tuple ``(waveform, sample_rate)``: a float32 tensor shaped
        ``(channels, frames)`` and an int, as ``torchaudio.load`` returns.
        A field ``"json.gz"`` is gunzipped, then decoded as ``"json"``.
        ``decoders`` adds or overrides decoders by extension or full field
        name (``{"seg.png": my_fn, "txt": None}``; ``{"wav": None}`` leaves
        wav fields as bytes). A field that fails to decode raises an error
        naming the URL, key and field, or with ``on_error="skip"`` drops the
        sample and counts it; a missing library (Pillow, soundfile) raises
        ``ImportError`` naming it, also under ``"skip"``.

        JPEGs decode through ``image_backend``: ``"auto"`` (simplejpeg when
        installed, ``pip install 'datapipes-torch[jpeg]'``, else Pillow),
        ``"pillow"`` or ``"simplejpeg"``; the pixels are Pillow's either way
        (files simplejpeg would decode differently, CMYK ones for example, go
        to Pillow). ``image_size=(h, w)`` (or an int for both) decodes JPEGs
        at the smallest DCT scale (1/8, 2/8, 3/8 with simplejpeg, 4/8 of each
        side, or full) that keeps them at least that big: faster when a later
        step resizes anyway, and the pixels then differ from a full-size
        decode's.
        A :meth:`random_resized_crop` right after ``decode()`` picks the scale
        per image from its crop box instead.

        >>> import datapipes as dp
        >>> sample = {"__key__": "a", "cls": b"3", "json": b'{"x": 1}'}
        >>> list(dp.Loader(dp.from_sequence([sample]).decode()))
        [{'__key__': 'a', 'cls': 3, 'json': {'x': 1}}]
        """
        return _steps().Decode(
            self,
            image=image,
            image_mode=image_mode,
            decoders=decoders,
            on_error=on_error,
            image_size=image_size,
            image_backend=image_backend,
        )

    def shard(self) -> DataPipe[T]:
        """Split a stream across consumers here: each keeps every n-th item.

        Sources normally shard themselves (files are dealt, sequences split by
        index). ``shard()`` is for sources that cannot, such as
        ``dp.from_iterable``, or to choose where the split happens: the steps
        before it read all the data in every consumer (identically, shuffles
        included), so they cost ``world_size * num_workers`` times as much, and
        consumer ``c`` of ``C`` keeps items ``c, c + C, ...``. Sources before an
        explicit ``shard()`` do not shard again.

        >>> import datapipes as dp
        >>> gen = dp.from_iterable(lambda: iter("abcde")).shard()
        >>> list(dp.Loader(gen, rank=1, world_size=2))
        ['b', 'd']
        """
        return _steps().Shard(self)

    def pin_memory(self) -> DataPipe[T]:
        """Put the tensors of every item in page-locked memory (a no-op without CUDA).

        Runs in the main process, after the worker processes; pinned batches
        copy to the GPU faster and asynchronously (see :meth:`to_device`).
        """
        return _steps().PinMemory(self)

    def to_device(self, device: str | None = None) -> DataPipe[Any]:
        """Move the tensors of every item (nested dicts, lists, tuples) to ``device``.

        Runs in the main process. On CUDA the copy is asynchronous, on a side
        stream, so it overlaps the training step on the previous batch. With
        ``device=None`` it copies to the current CUDA device when there is one
        and does nothing otherwise, so one recipe runs on GPU and CPU machines.
        """
        return _steps().ToDevice(self, device)

    def as_torch_dataset(
        self,
        seed: int = 0,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        mesh: Any = None,
        mesh_dims: Sequence[str] | str | None = None,
    ) -> TorchDataset:
        """This recipe as a torch ``IterableDataset`` for your own ``DataLoader``.

        It shards itself across DataLoader workers and ranks (``rank`` and
        ``world_size``, or a ``mesh`` with its data-parallel ``mesh_dims``, else
        ``torch.distributed``, else ``RANK``/``WORLD_SIZE``), and under torchdata's
        ``StatefulDataLoader`` resumes exactly. Use ``batch_size=None`` in the
        DataLoader when the recipe batches. See :class:`datapipes.TorchDataset`.
        """
        topology = resolve_topology(rank, world_size, mesh=mesh, mesh_dims=mesh_dims)
        return TorchDataset(self, topology, seed)

    def apply_node(
        self, factory: Callable[..., Node[Any]], /, *args: Any, **kwargs: Any
    ) -> DataPipe[Any]:
        """Run a node of your own on the items: ``factory(upstream_node, *args, **kwargs)``.

        ``factory`` is a :class:`nodes.Node` subclass (or a function returning
        a node) whose ``__init__`` takes the upstream node first and passes it
        to ``super().__init__(upstream)``. If it has a ``ctx`` parameter it also
        gets the :class:`nodes.Context` of the consumer it runs for (rank,
        worker, epoch; ``ctx.random_key(...)`` seeds an RNG, scoped to this
        step; add ``ctx.consumer_index`` to the key where workers and ranks
        must draw differently), passed by keyword. The node runs wherever
        the recipe runs (DataLoader workers included), and its
        ``state_dict()`` becomes part of the Loader's checkpoints, so it must
        keep the node contract: check it with :func:`nodes.testing.check_node`.
        ``args`` and ``kwargs`` are part of the recipe's fingerprint and must
        pickle for spawned workers.

        >>> import datapipes as dp
        >>> from nodes import Node
        >>> class RunningSum(Node):
        ...     def __init__(self, upstream):
        ...         super().__init__(upstream)
        ...         self.upstream = upstream
        ...     def reset(self, state=None):
        ...         self.upstream.reset(None if state is None else state["up"])
        ...         self.total = 0 if state is None else state["total"]
        ...     def __next__(self):
        ...         self.total += next(self.upstream)
        ...         return self.total
        ...     def state_dict(self):
        ...         return {"up": self.upstream.state_dict(), "total": self.total}
        >>> list(dp.Loader(dp.range(1, 5).apply_node(RunningSum)))
        [1, 3, 6, 10]
        """
        return _custom().ApplyNode(self, factory, *args, **kwargs)

    def prefetch(self, depth: int = 2) -> DataPipe[T]:
        """Compute up to ``depth`` items ahead on a background thread."""
        return _steps().Prefetch(self, depth)


# The step classes subclass DataPipe, so their modules import this one; the fluent methods
# above reach them through these two functions, at call time, which is what lets both
# modules exist. (Everything else this module needs is imported at the top.)
def _steps() -> ModuleType:
    from datapipes import steps

    return steps


def _custom() -> ModuleType:
    from datapipes import custom

    return custom


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
