"""Process-map workers die with their main process, even when it is SIGKILLed.

A ``map(..., method="process")`` pool's workers block reading their task
queue, whose write end they hold themselves: without a watch of their own
they outlive a killed main process forever. Each trial runs a real main
process in its own process group, kills it, and waits (generously) for the
group to empty.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from subprocess_helpers import processes_in_group

from tests.subprocess_helpers import ROOT

MAIN = """
import sys, time
import datapipes as dp

loader = dp.Loader(dp.range(10**6).map(abs, num_workers=2, method="process"))
it = iter(loader)
for _ in range(int(sys.argv[1])):
    next(it)
print("ready", flush=True)
time.sleep(120)  # killed long before
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the workers through /proc")
@pytest.mark.parametrize("items", [1, 500])
def test_process_map_workers_die_with_their_killed_main_process(items: int):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    main = subprocess.Popen(
        [sys.executable, "-c", MAIN, str(items)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=ROOT,
        start_new_session=True,  # its own process group: its pool's workers join it
    )
    try:
        assert main.stdout is not None
        assert main.stdout.readline().strip() == b"ready"
        workers = [pid for pid in processes_in_group(main.pid) if pid != main.pid]
        assert len(workers) >= 2, workers  # the pool is up
        os.kill(main.pid, signal.SIGKILL)
        main.wait(30)
        deadline = time.monotonic() + 30  # a loaded machine: far more than they need
        while processes_in_group(main.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = processes_in_group(main.pid)
        assert left == [], f"process-map workers outlived their main process: {left}"
    finally:
        for pid in processes_in_group(main.pid):  # never leave one behind, even failing
            os.kill(pid, signal.SIGKILL)
        if main.poll() is None:
            main.kill()
        main.wait(30)
