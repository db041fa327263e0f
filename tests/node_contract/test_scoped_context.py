"""A ScopedContext is its parent's view: every public attribute shows through, its tag wins.

Fast: contexts only, no graph is built.
"""

from __future__ import annotations

import pytest

from nodes import Context, ScopedContext
from nodes.steps.shard import WholeDataContext

#: What a scope answers itself instead of its parent: the tag it adds to every RNG key,
#: and what is built on that key.
OVERRIDDEN = {"random_key", "place_of"}


def public_names(ctx: Context) -> list[str]:
    return [name for name in dir(ctx) if not name.startswith("_")]


def a_context() -> Context:
    return Context(rank=1, world_size=3, worker_id=1, num_workers=2, epoch=4, seed=9, stats=True)


def test_every_public_attribute_of_a_context_is_reachable_on_its_scope() -> None:
    ctx = a_context()
    scope = ScopedContext(ctx, tag=5)
    names = public_names(ctx)
    assert {"rank", "epoch", "work", "trace", "shard_ctx", "consumer_index", "plan_for"} <= set(
        names
    )
    for name in names:
        assert hasattr(scope, name), name
        value = getattr(ctx, name)
        if not callable(value):
            assert getattr(scope, name) == value, name
        elif name not in OVERRIDDEN:  # a method: the scope's runs on the scope
            assert callable(getattr(scope, name)), name


def test_the_scope_reads_its_parent_when_asked_not_when_made() -> None:
    ctx = a_context()
    scope = ScopedContext(ScopedContext(ctx, tag=1), tag=2)  # nested: read through both
    for name in vars(ctx):  # every field __init__ sets; then the two with class defaults
        marker = object()
        setattr(ctx, name, marker)
        assert getattr(scope, name) is marker, name
    ctx.trace, ctx.shard_ctx = "recorder", "consumer"
    assert (scope.trace, scope.shard_ctx) == ("recorder", "consumer")


def test_every_field_of_a_context_is_annotated_so_a_scope_reads_it_from_its_parent() -> None:
    """A scope delegates the names :class:`Context` annotates: a field set in ``__init__``
    or given a class default without an annotation would be missing from, or stale on,
    every scope."""
    ctx = a_context()
    derived = {name for name, value in vars(Context).items() if isinstance(value, property)}
    fields = {
        name
        for name in public_names(ctx)
        if name not in derived and not callable(getattr(ctx, name))
    }
    assert set(vars(ctx)) <= fields and {"trace", "shard_ctx"} <= fields
    assert fields == set(Context.__annotations__)
    for name in fields:
        assert isinstance(vars(ScopedContext)[name], property), name


def test_a_scope_adds_its_tag_to_every_random_key_and_place() -> None:
    ctx = a_context()
    outer = ScopedContext(ctx, tag=3)
    inner = ScopedContext(outer, tag=7)
    assert ctx.random_key(11) == [9, 4, 11]
    assert outer.random_key(11) == [9, 4, 3, 11]
    assert inner.random_key(11, seed=1) == [1, 4, 3, 7, 11]
    assert (ctx.place_of(11), outer.place_of(11), inner.place_of(11)) == ("11", "3/11", "3/7/11")
    outer.tag = 4  # a repeat bumps its scope's tag per round
    assert inner.random_key(11) == [9, 4, 4, 7, 11]
    ctx.epoch = 5
    assert inner.random_key() == [9, 5, 4, 7]


def test_what_the_scope_derives_uses_the_parents_fields() -> None:
    scope = ScopedContext(a_context(), tag=1)
    assert (scope.consumer_index, scope.num_consumers) == (3, 6)
    assert scope.plan_for("0") is None and scope.rounds_planned("0") == []
    assert scope.dispatch is None
    assert repr(scope) == repr(scope._parent)


def test_a_scopes_fields_are_its_parents_to_set() -> None:
    scope = ScopedContext(a_context())
    with pytest.raises(AttributeError):
        scope.epoch = 1  # set on the parent: every scope of it sees it
    assert scope.epoch == 4


def test_a_scope_of_a_whole_data_context_reads_its_fields() -> None:
    ctx = a_context()
    whole = WholeDataContext(ctx)
    scope = ScopedContext(whole, tag=2)
    assert (scope.consumer_index, scope.num_consumers, scope.shard_ctx) == (0, 1, ctx)
    assert scope.work is None and scope.epoch == 4
    with pytest.raises(AttributeError):
        scope.no_such_attribute  # noqa: B018 - the lookup is the test
