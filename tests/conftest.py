"""Shared test setup.

``DATAPIPES_TEST_START_METHOD=spawn`` (or ``forkserver``) makes that Python's default start
method for the whole run, standing in for macOS (``spawn``) and Python 3.14 on Linux
(``forkserver``); tests that need ``fork`` are marked ``needs_fork`` and left out then.
"""

from __future__ import annotations

import multiprocessing
import os

import pytest

#: The start method the run forces as the default, or None to keep the platform's.
FORCED_START_METHOD = os.environ.get("DATAPIPES_TEST_START_METHOD") or None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_fork: relies on fork being the default start method")
    if FORCED_START_METHOD is not None:
        if FORCED_START_METHOD not in multiprocessing.get_all_start_methods():
            raise pytest.UsageError(
                f"DATAPIPES_TEST_START_METHOD={FORCED_START_METHOD!r}: this Python offers "
                f"{multiprocessing.get_all_start_methods()}"
            )
        multiprocessing.set_start_method(FORCED_START_METHOD, force=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if FORCED_START_METHOD in (None, "fork"):
        return
    skip = pytest.mark.skip(reason=f"needs fork; the run forces {FORCED_START_METHOD}")
    for item in items:
        if "needs_fork" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> str:
    return f"default start method: {multiprocessing.get_start_method()}"


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
