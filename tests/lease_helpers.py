"""Leases for in-process ranks in tests: how long, and a rank made to stall."""

from __future__ import annotations

import datapipes as dp

#: The lease of in-process ranks where one stalls: the others wait this long for it. No
#: live rank is taken for stalled: those tests hold at most one live rank at a time, or
#: assert what holds either way (every item once).
LEASE = 0.3
#: The lease where every rank lives and none may be taken over: no wait costs it, and a
#: rank thread starved this long on a loaded machine is beyond any test's margin.
LIVE_LEASE = 60.0


def stall(loader: dp.Loader) -> None:
    """Stand for a stalled rank: its heartbeat stops (and nobody iterates it). A rank that
    has not started its epoch has no lease yet: the others find it absent."""
    assert loader._takeovers is not None
    lease = loader._takeovers.lease
    if lease is not None:
        lease.close()
        if lease._thread is not None:  # its heartbeat has ended: no write after this
            lease._thread.join(10)
            assert not lease._thread.is_alive()
