"""The store that dynamic dispatch claims through: reaching it from any process, clear errors.

A ``torch.distributed.Store`` object does not pickle, so a DataLoader worker
reaches the store by its address (a ``TCPStore``'s host and port, a
``FileStore``'s path) and opens its own client, once per process. A store with
no address (a ``HashStore``) serves the process that made it only.

Every operation runs under the store's timeout. A store that went away (its
host process died, the network is down) raises :class:`DispatchStoreError`
saying where the store was and what to do, never a hang and never a raw
``DistStoreError``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist


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


def address_of(store: Any, timeout: float) -> StoreAddress | None:
    """The address of ``store`` (through ``PrefixStore`` wrappers), or ``None`` if it has none.

    Dispatch keys are namespaced by the Loader itself, so a prefix is not needed.
    """
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
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

    def __init__(self, store: Any, address: StoreAddress | None, describe: str = "") -> None:
        self._store = store
        self._pid = os.getpid()
        self.address = address
        self._describe = describe or (address.describe() if address else type(store).__name__)

    def __getstate__(self) -> dict[str, Any]:
        if self.address is None:
            raise TypeError(
                f"the dispatch store ({self._describe}) has no address another process can "
                "reach: with DataLoader workers pass a TCPStore or FileStore as store=..."
            )
        return {"_store": None, "_pid": -1, "address": self.address, "_describe": self._describe}

    def _live(self) -> Any:
        if self._store is None or self._pid != os.getpid():  # a forked copy opens its own
            assert self.address is not None
            self._store, self._pid = self.address.open(), os.getpid()
        return self._store

    def _failed(self, what: str, error: Exception) -> DispatchStoreError:
        return DispatchStoreError(
            f"dynamic dispatch: the store ({self._describe}) did not answer {what}: {error}. "
            "Its host process (rank 0's, or the launcher's) may have died or stalled; the "
            "job's last checkpoint resumes exactly (also on another topology)."
        )

    def add(self, key: str, amount: int) -> int:
        try:
            return int(self._live().add(key, amount))
        except (RuntimeError, OSError) as error:
            raise self._failed(f"add({key!r})", error) from error

    def append(self, key: str, value: str) -> None:
        try:
            self._live().append(key, value)
        except (RuntimeError, OSError) as error:
            raise self._failed(f"append({key!r})", error) from error

    def get_or_none(self, key: str) -> bytes | None:
        """The value of ``key``, or ``None`` if it was never set (without waiting for it)."""
        try:
            store = self._live()
            return store.get(key) if store.check([key]) else None
        except (RuntimeError, OSError) as error:
            raise self._failed(f"get({key!r})", error) from error

    def set(self, key: str, value: str) -> None:
        try:
            self._live().set(key, value)
        except (RuntimeError, OSError) as error:
            raise self._failed(f"set({key!r})", error) from error

    def compare_set(self, key: str, expected: str, value: str) -> bytes:
        try:
            return self._live().compare_set(key, expected, value)
        except (RuntimeError, OSError) as error:
            raise self._failed(f"compare_set({key!r})", error) from error
