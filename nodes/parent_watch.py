"""DataLoader workers that exit when the main process dies, however early it dies.

torchdata's workers watch the main process by comparing ``os.getppid()``
against the parent they saw at setup; a worker whose main process died
before that (within ~100 ms of forking) sees its new parent at setup and
waits forever, holding its memory. :class:`WatchMainProcess` runs first in
every worker: it asks Linux to kill the worker when the main process dies
(``PR_SET_PDEATHSIG``), exits at once if the main process is already gone,
and makes torchdata's watch compare against the pid recorded before forking.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from nodes import torchdata_adapter

#: prctl(2) option: the signal the kernel sends this process when its parent thread exits.
PR_SET_PDEATHSIG = 1


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
