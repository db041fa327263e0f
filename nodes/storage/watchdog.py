"""A deadline for calls that may block forever: a stream's reads run on a helper thread.

A read over a network can stall with no error at all (a server that stops
sending mid-body, a mount that stops answering); a thread blocked in it cannot
be interrupted. :class:`Watchdog` runs each call on a helper thread of its own
and stops waiting after ``timeout`` seconds with a ``TimeoutError`` (which the
retry policy treats as transient). The stalled thread is abandoned: it is a
daemon, it exits when its call finally returns, and the file it was reading is
closed then, not under its feet. Only streams that can stall get one (see
:class:`nodes.storage.source.SourceFile`); local files are read directly.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# The helper running a call on this thread, for progress() (set on helper threads only).
_running = threading.local()


def progress() -> None:
    """Tell the watchdog running this call, if any, that it is making progress.

    A long call that moves data in steps (a stream skipped forward by reading)
    calls this after each step, so the timeout measures a stall, not its length.
    """
    helper = getattr(_running, "helper", None)
    if helper is not None:
        helper.beats += 1


class _Job:
    """One call handed to the helper: its outcome, and whether its caller gave up on it."""

    __slots__ = ("action", "done", "result", "error", "abandoned", "then_close", "lock")

    def __init__(self, action: Callable[[], Any]) -> None:
        self.action = action
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.abandoned = False
        self.then_close: Any = None  # a file to close once the call returns
        self.lock = threading.Lock()


class _Helper:
    """A daemon thread that runs jobs one at a time until told to stop or abandoned."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # a helper does not survive a fork: the child starts its own
        self.beats = 0  # progress() calls of its jobs: one that beats within each timeout goes on
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="datapipes-read", daemon=True).start()

    def _run(self) -> None:
        _running.helper = self
        while True:
            job = self.jobs.get()
            if job is None:
                return
            try:
                job.result = job.action()
            except BaseException as error:  # noqa: BLE001 - handed to the waiting caller
                job.error = error
            with job.lock:
                job.done.set()
                if not job.abandoned:
                    continue
            # The caller stopped waiting and uses another helper now: clean up and exit.
            job.result = job.error = None
            if job.then_close is not None:
                _close_quietly(job.then_close)
            return


class Watchdog:
    """Runs calls on a helper thread; a call still running after ``timeout`` s raises
    ``TimeoutError`` (naming the timeout) and is abandoned to finish on its own."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._helper: _Helper | None = None
        self._stuck: _Job | None = None  # the last call given up on, maybe still running

    def call(self, action: Callable[[], Any]) -> Any:
        """``action()``, or ``TimeoutError`` if it has not returned within the timeout."""
        helper = self._helper
        if helper is None or helper.pid != os.getpid():
            helper = self._helper = _Helper()
        job = _Job(action)
        helper.jobs.put(job)
        beats = helper.beats
        while not job.done.wait(self.timeout):
            if helper.beats != beats:  # slow but moving: wait for another timeout
                beats = helper.beats
                continue
            with job.lock:
                if not job.done.is_set():
                    job.abandoned = True
                    self._stuck, self._helper = job, None
                    raise TimeoutError(
                        f"no progress for {self.timeout:g} s (timeout={self.timeout:g})"
                    )
        if job.error is not None:
            error, job.error = job.error, None
            raise error
        return job.result

    def discard(self, file: Any) -> None:
        """Close ``file``, or, if a stalled call may still be using it, once that call returns."""
        stuck = self._stuck
        if stuck is not None:
            with stuck.lock:
                if not stuck.done.is_set():
                    stuck.then_close = file
                    return
        _close_quietly(file)

    def close(self) -> None:
        """Let the helper thread exit (a stalled one exits when its call returns)."""
        helper, self._helper = self._helper, None
        if helper is not None and helper.pid == os.getpid():
            helper.jobs.put(None)


# Filesystems whose reads cannot stall on a network: read directly, without a watchdog.
_LOCAL_PROTOCOLS = frozenset({"file", "local", "memory"})


def can_stall(fs: Any) -> bool:
    """Whether reads of ``fs`` may block with no error: every filesystem but local and memory."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
    return not _LOCAL_PROTOCOLS.intersection(protocols)


@contextmanager
def watchdog_for(fs: Any, timeout: float | None) -> Iterator[Watchdog | None]:
    """A watchdog for one-off calls on ``fs`` (a size query, a listing), or ``None`` when
    ``fs`` cannot stall or ``timeout`` is ``None``; its thread ends with the block."""
    if timeout is None or not can_stall(fs):
        yield None
        return
    watchdog = Watchdog(timeout)
    try:
        yield watchdog
    finally:
        watchdog.close()


def _close_quietly(file: Any) -> None:
    try:
        file.close()
    except Exception:  # noqa: BLE001 - the handle is being dropped because it is broken
        pass
