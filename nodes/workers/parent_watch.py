"""Workers that exit when the main process dies, however early it dies.

torchdata's workers watch the main process by comparing ``os.getppid()``
against the parent they saw at setup; a worker whose main process died
before that (within ~100 ms of forking) sees its new parent at setup and
waits forever, holding its memory. :class:`WatchMainProcess` runs first in
every worker: it asks Linux to kill the worker when the main process dies
(``PR_SET_PDEATHSIG``), exits at once if the main process is already gone,
and makes torchdata's watch compare against the pid recorded before forking.

The workers of ``map(..., method="process")`` (a process pool) block reading
a task queue whose write end they hold themselves, so they never see the end
of a killed main process: :func:`exit_with_parent`, the pool's
``initializer``, sets the same death signal and starts a thread that ends
the worker once its parent is gone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from nodes.adapters import torchdata as torchdata_adapter

#: prctl(2) option: the signal the kernel sends this process when its parent thread exits.
PR_SET_PDEATHSIG = 1

#: How often a pool worker's watch thread looks for its parent (where no death signal came).
PARENT_POLL_SECONDS = 0.5


class WatchMainProcess:
    """A DataLoader ``worker_init_fn``: watch the main process, then run the user's one.

    Made in the main process just before the workers start (it records the
    main process's pid then). Under ``forkserver`` the workers' parent is the
    fork server, so only the user's function runs.
    """

    def __init__(self, user_init: Callable[[int], Any] | None, start_method: str) -> None:
        self.user_init = user_init
        self.main_pid = os.getpid()
        self.watch = start_method in ("fork", "spawn")
        # The kernel sends the death signal when the *thread* that forked exits; only the
        # main thread lives as long as the process.
        self.die_with_parent = threading.current_thread() is threading.main_thread()

    def __call__(self, worker_id: int) -> None:
        if self.watch:
            if self.die_with_parent:
                set_parent_death_signal(signal.SIGKILL)
            if os.getppid() != self.main_pid:  # the main process died before we got here
                os._exit(0)
            torchdata_adapter.the_main_process_is(self.main_pid)
        if self.user_init is not None:
            self.user_init(worker_id)


def set_parent_death_signal(signum: int) -> bool:
    """Have the kernel send ``signum`` to this process when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no prctl in this libc
        return False


def exit_with_parent(parent_pid: int | None, die_with_parent: bool) -> None:
    """A process pool's ``initializer``: end this worker when its parent process dies.

    ``parent_pid`` is the pool's parent (the process that made the pool; None
    under ``forkserver``, whose fork server is the parent); ``die_with_parent``
    asks for the kernel's death signal, right only where the forking thread
    lives as long as the process (the main thread). A thread polling
    ``os.getppid()`` covers the other cases and other platforms.
    """
    if die_with_parent:
        set_parent_death_signal(signal.SIGKILL)
    parent = os.getppid() if parent_pid is None else parent_pid
    if os.getppid() != parent:  # the parent died before we got here
        os._exit(0)
    watch = threading.Thread(
        target=_exit_when_orphaned, args=(parent,), name="datapipes-parent-watch", daemon=True
    )
    watch.start()


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(0)  # no cleanup: the tasks' results have nobody to go to
