"""Shared test setup."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_rank_from_the_environment(monkeypatch):
    """Tests choose their ranks; a RANK/WORLD_SIZE left in the shell must not pick for them."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
