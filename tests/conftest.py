"""Shared test setup."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_rank_from_the_environment(monkeypatch):
    """Tests choose their ranks; a RANK/WORLD_SIZE left in the shell must not pick for them."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    """A real HTTP server on 127.0.0.1 (with Range support) serving a fresh folder."""
    import fsspec.asyn
    from http_server import serve

    # fsspec's HTTP filesystem runs on one shared, process-wide event-loop thread. Start it
    # here, or check_node would count it as a thread left behind by the first node to use HTTP.
    fsspec.asyn.get_loop()
    with serve(tmp_path_factory.mktemp("served")) as server:
        yield server


@pytest.fixture(scope="module")
def http_server_without_ranges(tmp_path_factory):
    """The same, answering every request with the whole file (no Range support)."""
    import fsspec.asyn
    from http_server import serve

    fsspec.asyn.get_loop()
    with serve(tmp_path_factory.mktemp("served-whole"), ranges=False) as server:
        yield server
