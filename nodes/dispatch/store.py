"""The store that dynamic dispatch claims through: reaching it from any process, clear errors.

A ``torch.distributed.Store`` object does not pickle, so a DataLoader worker
reaches the store by its address (a ``TCPStore``'s host and port, a
``FileStore``'s path) and opens its own client, once per process. A store with
no address (a ``HashStore``) serves the process that made it only.

Every operation runs under the store's timeout (also the ones a TCPStore
client itself would wait on forever, see :meth:`StoreClient._call`). A store
that went away (its host process died or stalled, the network is down) raises
:class:`DispatchStoreError` saying where the store was and what to do, never a
hang and never a raw ``DistStoreError``.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist

T = TypeVar("T")


class DispatchStoreError(RuntimeError):
    """The dispatch store did not answer: its host process died, or it cannot be reached."""


@dataclass(frozen=True)
class StoreAddress:
    """Where a store is, so that another process can open a client of it.

    ``kind`` is ``"tcp"`` (``host``, ``port``) or ``"file"`` (``path``).
    """

    kind: str
    host: str = ""
    port: int = 0
    path: str = ""
    timeout: float = 60.0

    def describe(self) -> str:
        if self.kind == "tcp":
            return f"TCPStore {self.host}:{self.port}"
        return f"FileStore {self.path}"

    def open(self) -> Any:
        """A new client of the store, with ``timeout`` for every operation."""
        wait = timedelta(seconds=self.timeout)
        try:
            if self.kind == "tcp":
                return dist.TCPStore(
                    self.host, self.port, is_master=False, timeout=wait, wait_for_workers=False
                )
            store = dist.FileStore(self.path, -1)
            store.set_timeout(wait)
            return store
        except (RuntimeError, OSError) as error:  # DistError is a RuntimeError
            raise DispatchStoreError(
                f"dynamic dispatch could not reach its store ({self.describe()}): {error}. "
                "The process that hosts it (rank 0's, or the launcher's) may have died."
            ) from error


def unprefixed(store: Any) -> Any:
    """``store`` without its ``PrefixStore`` wrappers: the keys must be the same in every
    process, and a worker's client (opened from the address) has no prefix. (The default
    process group's store is a ``PrefixStore("default_pg", TCPStore)``: through it the
    Loader would read its workers' claims under keys they never wrote.) Dispatch keys are
    namespaced by the Loader itself."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def address_of(store: Any, timeout: float) -> StoreAddress | None:
    """The address of ``store`` (an unprefixed one), or ``None`` if it has none."""
    if isinstance(store, dist.TCPStore):
        return StoreAddress("tcp", host=store.host, port=store.port, timeout=timeout)
    if isinstance(store, dist.FileStore):
        return StoreAddress("file", path=store.path, timeout=timeout)
    return None


class StoreClient:
    """A store, reached from whichever process uses it: the live object where it was made,
    a client opened from its address anywhere else (a DataLoader worker, a forked child).

    Pickles as its address; a store without one cannot leave its process.
    """

    def __init__(self, store: Any, timeout: float, describe: str = "") -> None:
        store = unprefixed(store)
        address = address_of(store, timeout)
        self._store = store
        self._pid = os.getpid()
        self._broken: str | None = None  # why the store counts as gone (a call timed out)
        self._caller_pid = -1  # the process whose thread serves _call (none yet)
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.address = address
        self._describe = describe or (address.describe() if address else type(store).__name__)

    def __getstate__(self) -> dict[str, Any]:
        if self.address is None:
            raise TypeError(
                f"the dispatch store ({self._describe}) has no address another process can "
                "reach: with DataLoader workers pass a TCPStore or FileStore as store=..."
            )
        return {
            "_store": None,
            "_pid": -1,
            "address": self.address,
            "_describe": self._describe,
            "_broken": None,
            "_caller_pid": -1,
            "_requests": None,
        }

    def _live(self) -> Any:
        if self._store is None or self._pid != os.getpid():  # a forked copy opens its own
            assert self.address is not None
            self._store, self._pid = self.address.open(), os.getpid()
        return self._store

    def _failed(self, what: str, error: Exception | str) -> DispatchStoreError:
        return DispatchStoreError(
            f"dynamic dispatch: the store ({self._describe}) did not answer {what}: {error}. "
            "Its host process (rank 0's, or the launcher's) may have died or stalled; the "
            "job's last checkpoint resumes exactly (also on another topology)."
        )

    def _call(self, what: str, op: Callable[[Any], T]) -> T:
        """``op(store)``, bounded by the store's timeout.

        A TCPStore client applies its timeout to connecting and to waiting for a key,
        not to ``add``/``append``/``set``: one whose server stalls (stopped, frozen, its
        machine gone without a reset) blocks in ``recv`` forever. So the calls run in a
        daemon thread of this client (one per process: threads do not survive a fork)
        and the caller waits at most the timeout; after that the client counts as broken
        (its socket may still get the late answer), and every later call fails at once.
        """
        if self._broken is not None:
            raise self._failed(what, self._broken)
        timeout = self.address.timeout if self.address is not None else None
        if timeout is None:  # a store of this process only (HashStore): nothing to stall
            return self._run(what, op)
        if self._caller_pid != os.getpid():
            self._requests = queue.SimpleQueue()
            self._caller_pid = os.getpid()
            threading.Thread(
                target=self._serve, args=(self._requests,), name="datapipes-dispatch-store",
                daemon=True,
            ).start()  # fmt: skip
        answer: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._requests.put((what, op, answer))
        try:
            ok, value = answer.get(timeout=timeout)
        except queue.Empty:
            self._broken = f"no answer within {timeout:g} s (the store timeout)"
            raise self._failed(what, self._broken) from None
        if not ok:
            raise value
        return value

    def _serve(self, requests: queue.SimpleQueue[Any]) -> None:
        """The calls of ``_call``, one at a time, each answer handed back to its caller."""
        while True:
            what, op, answer = requests.get()
            try:
                answer.put((True, self._run(what, op)))
            except BaseException as error:  # raised in the caller
                answer.put((False, error))

    def _run(self, what: str, op: Callable[[Any], T]) -> T:
        try:
            return op(self._live())
        except (RuntimeError, OSError) as error:
            raise self._failed(what, error) from error

    def add(self, key: str, amount: int) -> int:
        return int(self._call(f"add({key!r})", lambda store: store.add(key, amount)))

    def append(self, key: str, value: str) -> None:
        self._call(f"append({key!r})", lambda store: store.append(key, value))

    def get_or_none(self, key: str) -> bytes | None:
        """The value of ``key``, or ``None`` if it was never set (without waiting for it)."""
        return self._call(
            f"get({key!r})", lambda store: store.get(key) if store.check([key]) else None
        )

    def get(self, key: str) -> bytes:
        """The value of ``key``, which this process knows is set (one round trip)."""
        return self._call(f"get({key!r})", lambda store: store.get(key))

    def get_all_or_none(self, keys: list[str]) -> list[bytes | None]:
        """The values of ``keys`` (``None`` for a key never set): two round trips when every
        key is set (``check`` and ``multi_get``), however many keys."""

        def op(store: Any) -> list[bytes | None]:
            if not keys:
                return []
            if store.check(keys):
                return list(store.multi_get(keys))
            return [store.get(key) if store.check([key]) else None for key in keys]

        return self._call(f"multi_get({len(keys)} keys)", op)

    def delete(self, keys: list[str]) -> None:
        """Remove ``keys`` (those never set are skipped)."""
        self._call(f"delete({len(keys)} keys)", lambda store: [store.delete_key(k) for k in keys])

    def num_keys(self) -> int:
        """How many keys the store holds (its own bookkeeping included)."""
        return int(self._call("num_keys()", lambda store: store.num_keys()))

    def set(self, key: str, value: str) -> None:
        self._call(f"set({key!r})", lambda store: store.set(key, value))

    def compare_set(self, key: str, expected: str, value: str) -> bytes:
        return self._call(
            f"compare_set({key!r})", lambda store: store.compare_set(key, expected, value)
        )
