"""The node contract: what every runtime step implements, and walks over a built graph.

The floor of the graph: it imports only :mod:`nodes.errors` and
:mod:`nodes.origins` (which import nothing of ``nodes``), never a module that
builds on nodes. The context a graph is bound to is :mod:`nodes.context`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, TypeVar

from nodes.errors import ErrorPolicy, InvalidStateError, refuse
from nodes.origins import OriginReader, refuse_random_map, source_origin

T = TypeVar("T")

State = dict[str, Any]

#: The key under which a node keeps its input's state in its own (``{UPSTREAM: ...,
#: "taken": 3}``), or a list of them, one per input (zip, mix). What a state holds is
#: read through :meth:`Node.upstream_states`, which follows this key by default.
UPSTREAM = "upstream"


class Node(Iterator[T]):
    """A runtime step: an iterator with a resumable position.

    The contract (checked for any node by :func:`nodes.testing.check_node`):

    * ``reset(None)`` starts the epoch from the beginning; ``reset(state)``
      continues right after the item at which ``state`` was taken.
    * ``__next__`` returns the next item or raises ``StopIteration`` (and keeps
      raising it once the epoch is over).
    * ``state_dict()`` is the position after the last item returned: plain
      nested dicts/lists of str/int/float/bool/None, a fresh object each call.
    * ``validate_state(state, path)`` refuses, with
      :class:`nodes.errors.InvalidStateError` naming the path, a state the node
      could not resume exactly (the default checks only the inputs' states).
    * ``close()`` releases threads, files and processes; it is idempotent,
      ``state_dict()`` still answers after it, and a later ``reset`` makes the
      node usable again (breaking out of a Loader loop closes the graph).

    ``__iter__`` may return a faster iterator (a chain of C iterators) that
    shares this node's position; it is valid until the next ``reset``. A
    downstream node therefore calls ``iter(upstream)`` after resetting it.

    Example, a node that adds one to every item::

        class AddOne(Node):
            def __init__(self, upstream):
                super().__init__(upstream)
                self.upstream = upstream

            def reset(self, state=None):
                self.upstream.reset(state)

            def __next__(self):
                return next(self.upstream) + 1

            def state_dict(self):
                return self.upstream.state_dict()

            @classmethod
            def upstream_states(cls, state):
                return [(0, state)]  # its state is its input's (see upstream_states)
    """

    # What a node declares about itself, read by the statistics and the skip counts.

    #: Its input runs elsewhere (a thread, worker processes): the time its ``next()``
    #: takes is waiting, not its input's work (see :func:`nodes.observe.stats.graph_stats`).
    upstream_in_background: bool = False
    #: The bad-record policy of a node that can skip records (``on_error``), whose
    #: count shows in ``Loader.skipped()`` and the statistics; ``None`` otherwise.
    errors: ErrorPolicy | None = None

    #: A short name for this kind of node, recorded with checkpoints and shown by
    #: ``python -m datapipes inspect``; a subclass that sets none is named by its class.
    kind: ClassVar[str] = "Node"

    # How a resume on another topology (elastic resume) treats this node; see nodes.elastic.

    #: ``"source"``: it deals data itself (and has a ``place``); ``"transparent"``: it
    #: holds no item between two ``next`` calls and ``reset(state)`` puts its input at
    #: the position after the last item it returned (map, filter, batch, prefetch);
    #: ``"buffer"``: it holds items and says where they came from (:meth:`in_flight`);
    #: ``None`` (the default, e.g. a custom node that sets nothing): a resume on another
    #: topology is refused, naming the step.
    elastic: ClassVar[str | None] = None
    #: What the refusal says for a node whose ``elastic`` is ``None`` (why, what works).
    elastic_refusal: ClassVar[str] = ""

    # The source protocol: what a source (``elastic = "source"``) declares besides untouched().

    #: A source's place in the recipe, the same on every topology (set when the recipe is
    #: built: :meth:`nodes.context.Context.place_of`); it names the source's work in a
    #: plan. ``None``: not a source, or not built from a recipe.
    place: str | None = None
    #: How a source's remaining work is cut and dealt: ``"positions"``, ``"stream"``,
    #: ``"records"`` or ``"files"`` (see :mod:`nodes.elastic`); ``None``: not a source.
    elastic_kind: str | None = None

    # What a step that drops items at an epoch's end declares (see nodes.steps.batch.drop_counts).

    #: Items it dropped this epoch (reported by ``Loader.dropped()``, under ``drop_label``).
    dropped: int = 0
    #: How ``Loader.dropped()`` names the step (``"batch(32, drop_last=True)"``).
    drop_label: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" not in cls.__dict__:
            cls.kind = cls.__name__

    def __init__(self, *inputs: Node) -> None:
        self.inputs: tuple[Node, ...] = inputs

    @classmethod
    def upstream_states(cls, state: State) -> list[tuple[int, State]]:
        """``(input index, that input's state)`` for each input state nested in ``state``.

        The default follows :data:`UPSTREAM`: a dict there is input 0's state,
        a list holds one per input; a state without it nests none (``inspect``
        then shows it as one opaque level). A node whose state *is* its
        input's returns ``[(0, state)]``; a node with another layout overrides
        this. It is a class method because the layout belongs to the node
        type: ``inspect`` asks the type recorded in a checkpoint, building nothing.

        >>> Node.upstream_states({UPSTREAM: [{"position": 1}, {"position": 2}], "draws": 4})
        [(0, {'position': 1}), (1, {'position': 2})]
        """
        upstream = state.get(UPSTREAM) if isinstance(state, dict) else None
        if isinstance(upstream, dict):
            return [(0, upstream)]
        if isinstance(upstream, list):
            return [(i, up) for i, up in enumerate(upstream) if isinstance(up, dict)]
        return []

    def validate_state(self, state: Any, path: str = "node") -> None:
        """Refuse a ``state`` this node could not resume exactly, before ``reset`` uses it.

        Raises :class:`nodes.errors.InvalidStateError` naming ``path`` (where
        ``state`` sits in a checkpoint, e.g. ``ranks["0"].node.upstream``) and
        what was expected. Built-in nodes check their own fields (types, ranges
        against the data they will read, unknown keys) and then their inputs'
        states. This default accepts the node's own part (a custom node's state
        is opaque to it) and checks the inputs' states found by
        :meth:`upstream_states`. Called once per load, never per item.
        """
        try:
            found = type(self).upstream_states(state) if isinstance(state, dict) else []
        except Exception:  # noqa: BLE001 - a custom layout this default cannot read
            return
        if not isinstance(state, dict):
            return
        upstream = state.get(UPSTREAM)
        if self.inputs and UPSTREAM in state and not isinstance(upstream, dict | list):
            where = upstream_path(state, upstream, path)
            raise InvalidStateError(where, "the input's state (a dict)", upstream)
        if isinstance(upstream, list) and (
            len(upstream) != len(self.inputs) or not all(isinstance(s, dict) for s in upstream)
        ):
            raise InvalidStateError(
                f"{path}.{UPSTREAM}", f"a list of {len(self.inputs)} input states (dicts)", upstream
            )
        for index, upstream in found:
            if isinstance(index, int) and 0 <= index < len(self.inputs):
                self.inputs[index].validate_state(upstream, upstream_path(state, upstream, path))

    # ----- elastic resume (see nodes.elastic); never called while the data is read ---------
    def begin_conversion(self) -> None:
        """Before a ``reset`` that only finds where items came from: run inline, take notes."""

    def last_origin(self) -> Any:
        """``(place, piece)`` of the source item behind the last item this node returned.

        Asked by a buffer above, right after it took an item, while the graph is
        being converted (threads inline). A transparent node asks its input.
        """
        if self.elastic == "transparent" and len(self.inputs) == 1:
            return self.inputs[0].last_origin()
        raise refuse(
            self,
            "feeds a step that holds items, and cannot say which source item its items came from",
        )

    def validate_plan(self, plan: Any, path: str) -> None:
        """Refuse (``InvalidStateError``) a dealt share a source could not read (sources)."""

    def untouched(self) -> list[Any]:
        """A source's work not read yet, as pieces (after a conversion ``reset``; sources)."""
        raise refuse(
            self,
            'is a source (elastic = "source") that cannot say which of its work it has not '
            "read: implement untouched() (see nodes.elastic)",
        )

    def in_flight(self) -> list[Any]:
        """``(place, piece)`` of every item this node holds (read, not yet returned)."""
        return []

    # ----- random_map's per-item seeds (see nodes.steps.random_map); asked once, when built -------
    def origin_reader(self) -> OriginReader:
        """A call that says where the item this node returned last came from (its origin,
        see :mod:`nodes.origins`), from which a ``random_map`` above seeds the item.

        Asked once, before the graph is reset: a buffer turns on its origin notes
        then. A source answers from :meth:`last_origin`, a transparent step with one
        input asks its input; another step raises :class:`nodes.origins.RandomMapError`
        naming itself and where to put the ``random_map`` instead.
        """
        if self.elastic == "source":
            last = self.last_origin
            return lambda: source_origin(*last())
        if self.elastic == "transparent" and len(self.inputs) == 1:
            return self.inputs[0].origin_reader()  # one item out per item in, nothing held
        raise refuse_random_map(
            self, "cannot say which item of the epoch it returned", f"before the {self.kind}"
        )

    def plain_origins(self) -> bool:
        """Whether :meth:`last_origin` answers without origin notes: a source, or steps that
        hand items on one for one down to sources (a concat or a mix of such branches)."""
        if self.elastic == "source":
            return True
        return (
            self.elastic == "transparent"
            and len(self.inputs) == 1
            and self.inputs[0].plain_origins()
        )

    def live_inputs(self) -> tuple[Node, ...]:
        """The inputs whose work is not done (a concat leaves out the finished ones)."""
        return self.inputs

    def reset(self, state: State | None = None) -> None:
        """Start the epoch (``None``) or continue from ``state``."""
        raise NotImplementedError

    def __next__(self) -> T:
        raise NotImplementedError

    def state_dict(self) -> State:
        """The position after the last item returned, as plain data."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources held by this node and its inputs."""
        for node in self.inputs:
            node.close()

    def __iter__(self) -> Iterator[T]:
        return self


def upstream_path(state: Any, upstream: Any, path: str) -> str:
    """The path of ``upstream`` (an input's state found in ``state``) below ``path``.

    >>> up = {"position": 1}
    >>> upstream_path({UPSTREAM: up}, up, "node"), upstream_path(up, up, "node")
    ('node.upstream', 'node')
    """
    if upstream is state:
        return path
    if isinstance(state, dict):
        for key, value in state.items():
            if value is upstream:
                return f"{path}.{key}"
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is upstream:
                        return f"{path}.{key}[{i}]"
    return path


def walk_graph(node: Node | None) -> Iterator[Node]:
    """Every node of a built graph, from ``node`` up through all of its inputs."""
    if node is not None:
        yield node
        for upstream in node.inputs:
            yield from walk_graph(upstream)


class NotReset:
    """Placeholder iterator for a node that has not been reset yet."""

    def __init__(self, node: Node) -> None:
        self._name = type(node).__name__

    def __iter__(self) -> NotReset:
        return self

    def __next__(self) -> Any:
        raise RuntimeError(f"{self._name}: call reset() before iterating the node")
