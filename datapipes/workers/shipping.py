"""A recipe made ready to travel to another process: by value, so lambdas and closures go too.

Worker processes started with ``spawn`` (the default on macOS and Windows) or
``forkserver`` (Linux's default from Python 3.14) receive what they run pickled.
The standard pickle names functions by module and qualified name, so a lambda, a
local function or a closure cannot go; a recipe the standard pickle takes goes as
it always did (a function of the script's ``__main__`` by name, which the workers
import again), and only one it refuses goes through cloudpickle, which sends those
functions by value (their code and what they close over) and everything importable
by name. What cannot travel at all (an open file, a lock, a generator) is refused
naming the step that holds it.

>>> import pickle, datapipes as dp
>>> scale = 3
>>> pipe = dp.range(4).map(lambda x: x * scale)
>>> copy = pickle.loads(pickle.dumps(ByValue(pipe)))
>>> list(dp.Loader(copy)) == list(dp.Loader(pipe)) == [0, 3, 6, 9]
True
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

import cloudpickle

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe


class ByValue:
    """``pipe`` pickled with cloudpickle; it unpickles (with the standard pickle) as the
    recipe itself, so whatever holds it needs no code of its own to receive it."""

    __slots__ = ("data",)

    def __init__(self, pipe: DataPipe[Any], method: str | None = None) -> None:
        self.data = pickled(pipe, method)

    def __reduce__(self) -> tuple[Any, ...]:
        return (pickle.loads, (self.data,))


def pickled(pipe: DataPipe[Any], method: str | None = None) -> bytes:
    """``pipe`` as bytes any process with the same packages can load; ``TypeError`` naming
    the step that holds what cannot travel (``method``: how that process starts, if known)."""
    try:
        return pickle.dumps(pipe)
    except Exception:  # noqa: BLE001 - a lambda or a closure: cloudpickle takes those
        pass
    try:
        return cloudpickle.dumps(pipe)
    except Exception as error:  # noqa: BLE001 - whatever the pickler raises, named below
        step = _step_that_fails(pipe)
        where = f"its step .{step.describe_step()}" if step is not None else "it"
        receivers = f"worker processes started with {method!r}" if method else "other processes"
        raise TypeError(
            f"{receivers} receive the recipe pickled, but "
            f"{where} holds something that cannot be pickled: {error}. Open files, locks, "
            "generators and live connections cannot travel to another process: create them "
            "inside the function that uses them (open the file there, for example), or use "
            "multiprocessing_context='fork'."
        ) from error


def _step_that_fails(pipe: DataPipe[Any]) -> DataPipe[Any] | None:
    """The first step, from the sources on, whose own arguments do not pickle."""
    for step in _steps_from_sources(pipe):
        try:
            cloudpickle.dumps((step.args, step.kwargs))  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - the step is what the caller names
            return step
    return None


def _steps_from_sources(pipe: DataPipe[Any]) -> list[DataPipe[Any]]:
    order: list[DataPipe[Any]] = []
    seen: set[int] = set()

    def visit(step: DataPipe[Any]) -> None:
        if id(step) in seen:
            return
        seen.add(id(step))
        for upstream in step.inputs:  # type: ignore[attr-defined]
            visit(upstream)
        order.append(step)

    visit(pipe)
    return order
