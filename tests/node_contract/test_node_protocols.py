"""The protocols a node declares on nodes.Node (the source protocol, origins for random_map),
answered by their defaults for a user's node, and the node contract as the floor of nodes/."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import datapipes as dp
from nodes import Node, RandomMapError
from nodes.elastic import ElasticResumeError, consumer_work

NODES = Path(__file__).resolve().parents[2] / "nodes"


class ListSource(Node):
    """A user's source: it deals nothing itself, but declares it is one and where its items
    came from (positions), and says nothing about the work it has not read."""

    kind = "list source"
    elastic = "source"
    place = "0"

    def __init__(self, items: list[Any]) -> None:
        super().__init__()
        self.items = items

    def reset(self, state: dict[str, Any] | None = None) -> None:
        self.position = 0 if state is None else state["position"]

    def __next__(self) -> Any:
        if self.position >= len(self.items):
            raise StopIteration
        self.position += 1
        return self.items[self.position - 1]

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def last_origin(self) -> Any:
        return self.place, {"range": [self.position - 1, self.position, 1]}


class Double(Node):
    """A user's step that hands items on one for one."""

    elastic = "transparent"

    def __init__(self, upstream: Node) -> None:
        super().__init__(upstream)
        self.up = upstream

    def reset(self, state: dict[str, Any] | None = None) -> None:
        self.up.reset(state)

    def __next__(self) -> Any:
        return 2 * next(self.up)

    def state_dict(self) -> dict[str, Any]:
        return self.up.state_dict()


class Opaque(Double):
    """A user's step that declares nothing about where its items came from."""

    kind = "opaque"
    elastic = None


def test_a_source_and_a_step_of_the_users_give_origins_through_the_defaults() -> None:
    node = Double(ListSource(["a", "b", "c"]))
    origin = node.origin_reader()
    node.reset()
    assert [(next(node), origin()) for _ in range(3)] == [
        ("aa", ("0", 0)),
        ("bb", ("0", 1)),
        ("cc", ("0", 2)),
    ]
    assert node.plain_origins()


def test_a_step_that_declares_nothing_is_refused_by_random_map_naming_it() -> None:
    with pytest.raises(RandomMapError, match="step 'opaque' below it cannot say which item"):
        Opaque(ListSource([1])).origin_reader()
    assert not Opaque(ListSource([1])).plain_origins()


def test_a_concat_with_a_batch_in_an_input_is_refused_by_random_map() -> None:
    pipe = dp.concat(dp.range(4), dp.range(4).batch(2)).random_map(lambda x, rng: x)
    with pytest.raises(RandomMapError, match="step 'concat' below it has an input with a step"):
        pipe.build()


def test_a_source_without_untouched_is_refused_on_another_topology_naming_it() -> None:
    root = Double(ListSource([1, 2, 3]))
    with pytest.raises(ElasticResumeError, match="step 'list source' is a source .* untouched()"):
        consumer_work(root, {"position": 1})


def test_the_source_protocol_has_defaults_for_every_node() -> None:
    node = Double(ListSource([1]))
    assert (node.place, node.elastic_kind, node.dropped, node.drop_label) == (None, None, 0, "")
    assert node.inputs[0].place == "0"


def _imports_of_nodes(path: Path) -> set[str]:
    """The nodes modules ``path`` imports, at the top, in functions or for type checking."""
    found = set()
    for statement in ast.walk(ast.parse(path.read_text())):
        if isinstance(statement, ast.ImportFrom) and statement.module:
            names = [statement.module]
        elif isinstance(statement, ast.Import):
            names = [alias.name for alias in statement.names]
        else:
            continue
        found.update(name for name in names if name == "nodes" or name.startswith("nodes."))
    return found


def test_the_node_contract_imports_only_the_floor_below_it() -> None:
    floor_below = {"nodes.errors", "nodes.origins", "nodes.consumer_work", "nodes.rounds"}
    assert _imports_of_nodes(NODES / "base.py") <= floor_below
    assert _imports_of_nodes(NODES / "context.py") <= floor_below
    for floor in ("credentials.py", "origins.py", "iterators.py", "rounds.py"):
        assert _imports_of_nodes(NODES / floor) == set(), floor
    # an error's text is scrubbed of credentials (nodes.credentials) before it is raised or warned
    assert _imports_of_nodes(NODES / "errors.py") <= {"nodes.credentials"}
    # the work a consumer reads names rounds of a repeat's sources (pure functions of names)
    assert _imports_of_nodes(NODES / "consumer_work.py") <= {"nodes.rounds"}
