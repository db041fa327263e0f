"""An exception raised in a DataLoader worker, raised again in the main process as itself.

torch sends a worker's exception to the main process as its type and its
formatted traceback, and rebuilds it there as ``type(message)``; a type whose
constructor takes anything else (``BadRecordError(url, where, reason)``, most
exceptions with several arguments) turns into a ``RuntimeError``, so
``except dp.BadRecordError`` would work at ``num_workers=0`` only. Here a
worker raises :class:`RaisedInWorker` instead, whose message carries the
original exception (pickled); when torch rebuilds it in the main process, its
``__new__`` returns the original exception, with the worker's traceback
attached. This takes effect under torch's ``DataLoader`` and torchdata's
``StatefulDataLoader`` alike (``tests/adapters/test_torchdata_adapter.py`` checks
torch's rebuild still goes through ``type(message)``).
"""

from __future__ import annotations

import base64
import pickle
import re
import traceback
from typing import Any

from nodes.credentials import scrub_error, scrubbed

#: Marks the carried exception inside the message torch sends.
_START, _END = "<<datapipes worker exception ", ">>"
_CARRIED = re.compile(re.escape(_START) + r"([A-Za-z0-9+/=]+)" + re.escape(_END))


class WorkerTraceback(Exception):
    """The traceback of an exception raised in a DataLoader worker (its ``__cause__``).

    Set on an exception rebuilt from a worker whose message could not carry
    the traceback (one with several arguments, or a ``KeyError``'s key).
    """


class RaisedInWorker(Exception):
    """What a worker raises in place of an exception; the main process gets the original.

    Never seen by users: rebuilt from its message in the main process (by
    torch, as ``RaisedInWorker(message)``), it becomes the exception it carries.
    """

    def __new__(cls, *args: Any) -> Any:
        if len(args) == 1 and isinstance(args[0], str):
            carried = _CARRIED.search(args[0])
            if carried is not None:
                try:
                    return rebuild(carried.group(1))
                except Exception:  # a payload cut short: still an error, and one that says so
                    return RuntimeError(args[0])
        return super().__new__(cls, *args)


def carry(error: BaseException, worker_id: int) -> RaisedInWorker:
    """The exception a worker raises so that the main process gets ``error`` itself
    (without the credentials of any URL this worker opened: see :mod:`nodes.credentials`)."""
    scrub_error(error)
    parts: dict[str, Any] = {
        "worker": worker_id,
        "name": type(error).__name__,
        "traceback": scrubbed(
            "".join(traceback.format_exception(type(error), error, error.__traceback__))
        ),
        "pickled": _dumps_if_it_loads(error),
        "type": _dumps_if_it_loads(type(error)),
        "args": _dumps_if_it_loads(error.args),
        "dict": _dumps_if_it_loads(getattr(error, "__dict__", {})),
    }
    payload = base64.b64encode(pickle.dumps(parts)).decode("ascii")
    # Made without __new__'s rebuild: this one must stay a carrier until the main process.
    carrier = Exception.__new__(RaisedInWorker, f"{_START}{payload}{_END}")
    carrier.args = (f"{_START}{payload}{_END}",)
    return carrier


def _dumps_if_it_loads(value: Any) -> bytes | None:
    """``value`` pickled, if it also unpickles here (a type the main process can import)."""
    try:
        data = pickle.dumps(value)
        pickle.loads(data)
    except Exception:
        return None
    return data


def _loads(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # the worker could load it; the main process may not import the same
        return None


def rebuild(payload: str) -> BaseException:
    """The exception a :func:`carry` payload holds: the same type, arguments and attributes.

    Its message gets the worker's traceback (as torch's rebuild gives it) where
    it is a single string; otherwise the traceback is its ``__cause__``. A type
    that cannot be rebuilt here becomes a ``RuntimeError`` naming it.
    """
    parts = pickle.loads(base64.b64decode(payload))
    message = (
        f"Caught {parts['name']} in DataLoader worker process {parts['worker']}.\n"
        f"Original {parts['traceback']}"
    )
    error = _loads(parts["pickled"])
    if not isinstance(error, BaseException):
        error = _without_constructor(_loads(parts["type"]), _loads(parts["args"]), parts)
    if error is None:
        return RuntimeError(message)
    if isinstance(error, KeyError) or not _is_a_message(error.args):
        error.__cause__ = WorkerTraceback(message)
    else:
        error.args = (message,)
    return error


def _without_constructor(cls: Any, args: Any, parts: dict[str, Any]) -> BaseException | None:
    """An instance of ``cls`` with ``args`` and the attributes sent, made without ``__init__``
    (whose signature may not take ``args``, like ``BadRecordError(url, where, reason)``)."""
    if not (isinstance(cls, type) and issubclass(cls, BaseException) and isinstance(args, tuple)):
        return None
    try:
        error = cls.__new__(cls, *args)
        error.args = args
        error.__dict__.update(_loads(parts["dict"]) or {})
        str(error)  # a type whose __str__ needs what __init__ would have set: not rebuilt
    except Exception:
        return None
    return error


def _is_a_message(args: tuple[Any, ...]) -> bool:
    return len(args) <= 1 and all(isinstance(arg, str) for arg in args)
