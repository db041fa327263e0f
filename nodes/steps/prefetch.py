"""Prefetching upstream items on a background thread."""

from __future__ import annotations

import queue
import threading
from typing import Any

from nodes.base import Node, State
from nodes.origins import OriginReader, reads_ahead

_END = object()
_POLL_SECONDS = 0.1


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class PrefetchNode(Node):
    """Reads up to ``depth`` items ahead of the consumer on a daemon thread.

    The thread records upstream's state next to every item it queues, so the
    state is exactly the position after the last item *returned*, never the
    read-ahead position: items in flight are simply read again after a resume.
    That costs one upstream ``state_dict()`` per item on the background
    thread, so place ``prefetch`` after ``batch`` when upstream states are
    large (a big shuffle buffer). An exception in the thread is re-raised in
    the consumer with its original traceback. ``close()`` and ``reset()``
    stop and join the thread.
    """

    kind = "prefetch"
    elastic = "transparent"

    #: its input runs elsewhere (a thread, worker processes): see nodes.observe.stats
    upstream_in_background = True

    def __init__(self, upstream: Node, depth: int = 2) -> None:
        super().__init__(upstream)
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, got {depth}")
        self._up = upstream
        self._depth = depth
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue[Any] = queue.Queue(depth)
        self._state: State | None = None
        self._done = False
        self._inline = False  # converting for another topology: no thread, no read-ahead

    def reset(self, state: State | None = None) -> None:
        self._stop_thread()
        self._up.reset(state)
        self._state = self._up.state_dict()
        self._done = False

    def _start_thread(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(self._depth)
        self._thread = threading.Thread(
            target=self._produce,
            args=(self._up, self._queue, self._stop),
            name="datapipes-prefetch",
            daemon=True,
        )
        self._thread.start()

    @staticmethod
    def _produce(up: Node, out: queue.Queue[Any], stop: threading.Event) -> None:
        def put(entry: Any) -> bool:
            while not stop.is_set():
                try:
                    out.put(entry, timeout=_POLL_SECONDS)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for item in up:
                if not put((item, up.state_dict())):
                    return
            put(_END)
        except BaseException as error:  # noqa: BLE001 - re-raised in the consumer
            put(_Failure(error))

    def begin_conversion(self) -> None:
        self._inline = True

    def origin_reader(self) -> OriginReader:
        raise reads_ahead(self)

    def plain_origins(self) -> bool:
        return False  # its last_origin is its input's last, read ahead of the item it returned

    def __iter__(self) -> Any:
        return iter(self._up) if self._inline else self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if self._thread is None:
            self._start_thread()
        entry = self._queue.get()
        if type(entry) is tuple:
            item, self._state = entry
            return item
        self._done = True
        self._thread = None
        if entry is _END:
            raise StopIteration
        raise entry.error

    def state_dict(self) -> State:
        assert self._state is not None, "reset() the node before asking for its state"
        return self._state

    @classmethod
    def upstream_states(cls, state: State) -> list[tuple[int, State]]:
        return [(0, state)]  # its state is its input's

    def validate_state(self, state: Any, path: str = "node") -> None:
        self._up.validate_state(state, path)  # its state is its input's, whatever it holds

    def _stop_thread(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        while thread.is_alive():
            try:
                self._queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                pass
        thread.join()
        self._thread = None

    def close(self) -> None:
        self._stop_thread()
        super().close()
