"""Finding the Loader states in a checkpoint: see :mod:`datapipes.checkpoint`, which owns them."""

from __future__ import annotations

from datapipes.checkpoint import decode_state, find_loader_states, saved_setup, top_level

__all__ = ["decode_state", "find_loader_states", "saved_setup", "top_level"]
