"""The error of ``datapipes inspect``: a checkpoint or a ``--recipe`` that cannot be read."""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint or recipe cannot be read; the command exits with ``exit_code`` (usage)."""

    exit_code = 2
