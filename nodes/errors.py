"""Bad input: the error that names where it happened, and the raise-or-skip policy."""

from __future__ import annotations

import warnings
from typing import Any

from nodes.base import walk_graph

ON_ERROR_CHOICES = ("raise", "skip")


class BadRecordError(ValueError):
    """A record could not be read or decoded.

    ``url`` is the file, ``where`` the place in it (``"line 17"``,
    ``"byte offset 4096"``, ``"member 'a.jpg' at byte offset 1024"``) and
    ``reason`` what was wrong. Pass ``on_error="skip"`` to the reader or
    decoder to skip such records instead; they are counted.
    """

    def __init__(self, url: str, where: str, reason: str) -> None:
        self.url, self.where, self.reason = url, where, reason
        super().__init__(f"{url}, {where}: {reason}")


#: ``found`` of an :class:`InvalidStateError` where the state has nothing (a missing key).
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<missing>"})()


class StateMismatchError(ValueError):
    """A checkpoint does not belong to this Loader's recipe or topology."""


class InvalidStateError(StateMismatchError):
    """A state is malformed or out of range: it cannot resume this graph exactly.

    ``path`` is where inside the state (``ranks["0"].node.upstream.slots[3]``)
    and ``expected`` what a valid state holds there. It is a
    :class:`StateMismatchError`, so code that catches that catches this too.
    """

    def __init__(self, path: str, expected: str, found: Any = MISSING, *, note: str = "") -> None:
        self.path, self.expected = path, expected
        shown = "nothing (the key is missing)" if found is MISSING else repr(found)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        message = f"invalid state at {path or 'the top level'}: expected {expected}, found {shown}"
        super().__init__(message + (f"; {note}" if note else "") + _HOW_TO_FIX)


_HOW_TO_FIX = (
    ". The checkpoint is corrupt, was edited, or belongs to another recipe or version: "
    "resume from another checkpoint, or start the epoch afresh (set_epoch)"
)


def check_on_error(value: str) -> str:
    """Validate an ``on_error`` argument."""
    if value not in ON_ERROR_CHOICES:
        raise ValueError(f"on_error must be one of {ON_ERROR_CHOICES}, got {value!r}")
    return value


class ErrorPolicy:
    """What a reader or decoder does with a bad record: raise it, or skip and count it.

    Skips are never silent: the first one of a step is reported with
    :func:`warnings.warn`, every one is counted in ``count`` (which is part of
    the step's state, so it survives a resume), and the first few messages
    are kept in ``examples``.
    """

    MAX_EXAMPLES = 5

    def __init__(self, on_error: str, step: str) -> None:
        self.skip = check_on_error(on_error) == "skip"
        self.step = step
        self.count = 0
        self.examples: list[str] = []

    def handle(self, error: Exception) -> None:
        """Raise ``error`` (a bad record, a missing file), or count it and warn about the first."""
        if not self.skip:
            raise error
        self.count += 1
        if len(self.examples) < self.MAX_EXAMPLES:
            self.examples.append(str(error))
        if self.count == 1:
            warnings.warn(
                f"{self.step}: skipping a bad record ({error}); further skips are counted "
                "silently, see Loader.skipped()",
                BadRecordWarning,
                stacklevel=2,
            )


class BadRecordWarning(UserWarning):
    """The first bad record a step skipped under ``on_error="skip"``."""


def skip_counts(root: Any) -> dict[str, int]:
    """Bad records skipped so far by each step of a built graph, keyed by the step's recipe."""
    counts: dict[str, int] = {}
    for node in walk_graph(root):
        policy = node.errors
        if isinstance(policy, ErrorPolicy) and policy.skip:
            counts[policy.step] = counts.get(policy.step, 0) + policy.count
    return counts
