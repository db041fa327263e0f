"""The conformance kit (nodes.testing.check_node) over every built-in node and a user node,
and proof that the kit catches nodes that break the contract."""

from __future__ import annotations

import inspect
import textwrap
import threading

import numpy as np
import pytest

from nodes import (
    BatchNode,
    BufferShuffleNode,
    ConcatNode,
    Context,
    FilterNode,
    FlatMapNode,
    IterableNode,
    MapNode,
    MixNode,
    Node,
    PrefetchNode,
    RepeatNode,
    ScopedContext,
    SequenceNode,
    TakeNode,
    ZipNode,
    no_collate,
)
from nodes.iterators import list_iterator_position
from nodes.testing import check_node


def square(x: int) -> int:
    return x * x


def not_multiple_of_3(x: int) -> bool:
    return x % 3 != 0


def up_to_three_copies(x: int) -> list[int]:
    return [x] * (x % 4)  # 0..3 outputs, including none


def sharded(epoch: int) -> Context:
    return Context(rank=1, world_size=3, epoch=epoch)


# ----- sources --------------------------------------------------------------------------


def test_sequence_node_plain():
    report = check_node(lambda ctx: SequenceNode(list(range(50)), ctx))
    assert report.items_per_epoch == [50, 50]
    assert report.positions_checked > 2 * 20  # a spread of positions in both epochs


def test_sequence_node_range_every_position():
    report = check_node(lambda ctx: SequenceNode(range(3, 40, 2), ctx), max_positions=100)
    n = len(range(3, 40, 2))
    assert report.items_per_epoch == [n, n]
    assert report.positions_checked == 2 * (n + 1)


def test_sequence_node_sharded_with_custom_context():
    report = check_node(lambda ctx: SequenceNode(list(range(50)), ctx), context=sharded)
    assert report.items_per_epoch == [len(range(1, 50, 3))] * 2


@pytest.mark.parametrize("seq", [range(100), list(range(100, 200))], ids=["range", "list"])
def test_sequence_node_global_shuffle(seq):
    report = check_node(lambda ctx: SequenceNode(seq, ctx, shuffle_key=[7]))
    assert report.items_per_epoch == [100, 100]


def test_sequence_node_global_shuffle_sharded_with_fused_fns():
    report = check_node(
        lambda ctx: SequenceNode(range(100), ctx, shuffle_key=[3], fns=(square, str)),
        context=sharded,
    )
    assert report.items_per_epoch == [len(range(1, 100, 3))] * 2


def test_sequence_node_shuffle_crosses_blocks():
    # more items than one block of the on-the-fly permutation (4096)
    report = check_node(
        lambda ctx: SequenceNode(range(9000), ctx, shuffle_key=[1]), max_positions=12
    )
    assert report.items_per_epoch == [9000, 9000]


def test_iterable_node_over_a_list():
    data = [{"i": i, "s": str(i)} for i in range(30)]
    report = check_node(lambda ctx: IterableNode(data, ctx))
    assert report.items_per_epoch == [30, 30]


def test_iterable_node_over_a_factory_of_generators():
    def factory():
        return (i * 2 for i in range(25))

    report = check_node(lambda ctx: IterableNode(factory, ctx))
    assert report.items_per_epoch == [25, 25]


class CountingReader:
    """A stateful stream (like a torchdata Stateful): resumes by its own position."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.position = 0

    def __iter__(self):
        while self.position < self.n:
            self.position += 1
            yield self.position * 10

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def test_iterable_node_over_a_stateful_object():
    report = check_node(lambda ctx: IterableNode(CountingReader(30), ctx))
    assert report.items_per_epoch == [30, 30]


# ----- per-item steps -------------------------------------------------------------------


def test_map_node():
    report = check_node(lambda ctx: MapNode(SequenceNode(range(40), ctx), square))
    assert report.items_per_epoch == [40, 40]


def test_filter_node():
    report = check_node(
        lambda ctx: FilterNode(SequenceNode(range(60), ctx, shuffle_key=[2]), not_multiple_of_3)
    )
    expected = sum(1 for x in range(60) if not_multiple_of_3(x))
    assert report.items_per_epoch == [expected, expected]


def test_flat_map_node():
    report = check_node(
        lambda ctx: FlatMapNode(SequenceNode(range(40), ctx, shuffle_key=[4]), up_to_three_copies),
        max_positions=100,
    )
    expected = sum(len(up_to_three_copies(x)) for x in range(40))
    assert report.items_per_epoch == [expected, expected]


def test_flat_map_of_flat_map():
    report = check_node(
        lambda ctx: FlatMapNode(
            FlatMapNode(SequenceNode(range(20), ctx), up_to_three_copies), up_to_three_copies
        )
    )
    expected = sum(len(up_to_three_copies(y)) for x in range(20) for y in up_to_three_copies(x))
    assert report.items_per_epoch == [expected, expected]


@pytest.mark.parametrize("count", [0, 1, 17, 50, 80])
def test_take_node(count):
    report = check_node(lambda ctx: TakeNode(SequenceNode(range(50), ctx, shuffle_key=[5]), count))
    assert report.items_per_epoch == [min(count, 50)] * 2


@pytest.mark.parametrize("times", [1, 3])
def test_repeat_node_with_scope(times):
    def make(ctx):
        scope = ScopedContext(ctx)
        return RepeatNode(SequenceNode(range(15), scope, shuffle_key=[6]), scope, times)

    report = check_node(make, max_positions=50)
    assert report.items_per_epoch == [15 * times] * 2


def test_repeat_node_over_a_buffer_shuffle():
    def make(ctx):
        scope = ScopedContext(ctx)
        shuffled = BufferShuffleNode(SequenceNode(range(20), scope), 6, scope, key=9)
        return RepeatNode(shuffled, scope, 2)

    report = check_node(make)
    assert report.items_per_epoch == [40, 40]


def test_repeat_forever_under_take():
    def make(ctx):
        scope = ScopedContext(ctx)
        forever = RepeatNode(SequenceNode(range(6), scope, shuffle_key=[3]), scope, None)
        return TakeNode(forever, 37)

    report = check_node(make, max_positions=100)
    assert report.items_per_epoch == [37, 37]


def test_repeat_node_over_an_empty_source_ends():
    def make(ctx):
        scope = ScopedContext(ctx)
        return RepeatNode(SequenceNode([], scope), scope, None)

    report = check_node(make)
    assert report.items_per_epoch == [0, 0]


# ----- shuffle, batch, prefetch ---------------------------------------------------------


@pytest.mark.parametrize("buffer_size", [1, 2, 7, 64, 100, 1000])
def test_buffer_shuffle_node(buffer_size):
    report = check_node(
        lambda ctx: BufferShuffleNode(SequenceNode(range(200), ctx), buffer_size, ctx, key=11),
        max_positions=30,
    )
    assert report.items_per_epoch == [200, 200]


def test_buffer_shuffle_node_over_a_stream_sharded():
    report = check_node(
        lambda ctx: BufferShuffleNode(
            FilterNode(SequenceNode(range(300), ctx), not_multiple_of_3), 16, ctx, key=1, seed=5
        ),
        context=sharded,
        max_positions=25,
    )
    expected = sum(1 for x in range(1, 300, 3) if not_multiple_of_3(x))
    assert report.items_per_epoch == [expected, expected]


@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_node(drop_last):
    report = check_node(
        lambda ctx: BatchNode(SequenceNode(range(23), ctx, shuffle_key=[1]), 5, drop_last=drop_last)
    )
    expected = 23 // 5 if drop_last else -(-23 // 5)
    assert report.items_per_epoch == [expected, expected]


def test_batch_node_without_collate():
    report = check_node(
        lambda ctx: BatchNode(SequenceNode(["a", "b", "c"] * 5, ctx), 4, collate_fn=no_collate)
    )
    assert report.items_per_epoch == [4, 4]


@pytest.mark.parametrize("depth", [1, 2, 8])
def test_prefetch_node(depth):
    report = check_node(
        lambda ctx: PrefetchNode(
            MapNode(SequenceNode(range(40), ctx, shuffle_key=[2]), square), depth
        )
    )
    assert report.items_per_epoch == [40, 40]


def test_prefetch_under_take_closes_its_thread():
    report = check_node(lambda ctx: TakeNode(PrefetchNode(SequenceNode(range(40), ctx), 4), 10))
    assert report.items_per_epoch == [10, 10]


# ----- combinators ----------------------------------------------------------------------


def test_concat_node():
    report = check_node(
        lambda ctx: ConcatNode(
            [
                SequenceNode(range(10), ctx, shuffle_key=[1]),
                SequenceNode([], ctx),
                FilterNode(SequenceNode(range(20), ctx), not_multiple_of_3),
            ]
        )
    )
    expected = 10 + sum(1 for x in range(20) if not_multiple_of_3(x))
    assert report.items_per_epoch == [expected, expected]


def test_zip_node():
    report = check_node(
        lambda ctx: ZipNode(
            [SequenceNode(range(30), ctx, shuffle_key=[1]), SequenceNode("abcdefghijklm", ctx)]
        )
    )
    assert report.items_per_epoch == [13, 13]


@pytest.mark.parametrize("stop", ["all_exhausted", "first_exhausted"])
def test_mix_node(stop):
    def make(ctx):
        return MixNode(
            [SequenceNode(range(40), ctx), SequenceNode(range(100, 110), ctx, shuffle_key=[2])],
            [0.7, 0.3],
            ctx,
            key=13,
            stop=stop,
        )

    report = check_node(make, max_positions=60)
    if stop == "all_exhausted":
        assert report.items_per_epoch == [50, 50]
    else:
        assert all(0 < n < 50 for n in report.items_per_epoch)


def test_mix_node_with_a_zero_weight_input():
    report = check_node(
        lambda ctx: MixNode(
            [SequenceNode(range(20), ctx), SequenceNode(range(5), ctx)], [1.0, 0.0], ctx, key=1
        )
    )
    assert report.items_per_epoch == [20, 20]


# ----- a user-written node --------------------------------------------------------------


def _docstring_example(obj: object, marker: str) -> dict[str, object]:
    """Run the indented code block that follows ``marker`` in ``obj.__doc__``.

    The docstring is cleaned first (``inspect.cleandoc``): Python 3.13 strips its common
    indentation when compiling, older Pythons keep it, so the block is found by being
    indented deeper than the marker's line, whatever either is.
    """
    doc = inspect.cleandoc(obj.__doc__ or "").splitlines()
    at = next(i for i, line in enumerate(doc) if marker in line)
    depth = len(doc[at]) - len(doc[at].lstrip())
    lines = []
    for line in doc[at + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= depth:
            break
        lines.append(line)
    namespace: dict[str, object] = {"Node": Node}
    exec(textwrap.dedent("\n".join(lines)), namespace)
    assert namespace.keys() - {"Node", "__builtins__"}, f"no code after {marker!r}"
    return namespace


# The example from the Node docstring, run as written there.
AddOne = _docstring_example(Node, "a node that adds one to every item::")["AddOne"]


class RunningSum(Node):
    """A user node with its own state on top of upstream's."""

    def __init__(self, upstream: Node) -> None:
        super().__init__(upstream)
        self.upstream = upstream
        self.total = 0

    def reset(self, state=None):
        self.upstream.reset(None if state is None else state["up"])
        self.total = 0 if state is None else state["total"]

    def __next__(self):
        self.total += next(self.upstream)
        return self.total

    def state_dict(self):
        return {"up": self.upstream.state_dict(), "total": self.total}


def test_user_node_add_one():
    report = check_node(lambda ctx: AddOne(SequenceNode(range(50), ctx, shuffle_key=[0])))
    assert report.items_per_epoch == [50, 50]


def test_user_node_with_own_state_over_a_buffer_shuffle():
    report = check_node(
        lambda ctx: RunningSum(BufferShuffleNode(SequenceNode(range(60), ctx), 8, ctx, key=2))
    )
    assert report.items_per_epoch == [60, 60]


# ----- the kit catches broken nodes -----------------------------------------------------


class Counter(Node):
    """Yields 0..n-1; the knobs below break it in one way each."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.i = 0

    def reset(self, state=None):
        self.i = 0 if state is None else int(state["i"])

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def state_dict(self):
        return {"i": self.i}


def test_the_reference_counter_passes():
    # the broken variants below differ from this one in one way only
    assert check_node(lambda ctx: Counter(20)).items_per_epoch == [20, 20]


class NumpyState(Counter):
    def state_dict(self):
        return {"i": np.int64(self.i)}


class OffByOne(Counter):
    def reset(self, state=None):
        self.i = 0 if state is None else int(state["i"]) + 1


class NoRestart(Counter):
    def reset(self, state=None):
        if state is not None:
            self.i = int(state["i"])


class YieldsAfterStop(Counter):
    def __next__(self):
        if self.i >= self.n:
            self.i = 0
            raise StopIteration
        return super().__next__()


class EpochBlind(Counter):
    """Reads the epoch when built instead of at reset: wrong once the epoch changes."""

    def __init__(self, n: int, ctx: Context) -> None:
        super().__init__(n)
        self.ctx = ctx
        self.epoch_seen = ctx.epoch

    def __next__(self):
        item = super().__next__()
        return item + 100 * self.epoch_seen


_release_leak = threading.Event()


class LeaksThread(Counter):
    def reset(self, state=None):
        super().reset(state)
        if not getattr(self, "thread", None):
            self.thread = threading.Thread(target=_release_leak.wait, name="leaky", daemon=True)
            self.thread.start()


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda ctx: NumpyState(20), "int64"),
        (lambda ctx: OffByOne(20), "not exact"),
        (lambda ctx: NoRestart(20), "restart"),
        (lambda ctx: YieldsAfterStop(20), "after StopIteration"),
        (lambda ctx: EpochBlind(20, ctx), "epoch 1"),
    ],
    ids=["numpy-int-state", "off-by-one-resume", "no-restart", "yields-after-stop", "epoch"],
)
def test_check_node_catches(factory, message):
    with pytest.raises(AssertionError, match=message):
        check_node(factory)


def test_check_node_catches_a_thread_left_running():
    _release_leak.clear()
    try:
        with pytest.raises(AssertionError, match="leaky"):
            check_node(lambda ctx: LeaksThread(10), positions=[0, 5])
    finally:
        _release_leak.set()
    for thread in threading.enumerate():
        if thread.name == "leaky":
            thread.join(10)
            assert not thread.is_alive()


def test_list_iterator_position_on_python_3_12_range_iterators():
    """Python >= 3.12 reduces a range iterator to the remaining range with no index."""

    class Py312RangeIterator:
        def __init__(self, remaining: range) -> None:
            self.remaining = remaining

        def __reduce__(self):
            return (iter, (self.remaining,), None)

    assert list_iterator_position(Py312RangeIterator(range(7, 10)), 10) == 7
    assert list_iterator_position(Py312RangeIterator(range(10, 10)), 10) == 10
    assert list_iterator_position(Py312RangeIterator(range(5, 20, 5)), 6) == 3
    it = iter(range(0, 30, 3))
    for _ in range(4):
        next(it)
    assert list_iterator_position(it, 10) == 4
