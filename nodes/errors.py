"""The errors of the node layer, and the raise-or-skip policy for bad input.

Bad records (named where they happened), states that cannot resume a graph,
and steps that cannot take part in a resume on another topology. It is the
floor of ``nodes``: it imports nothing of the package, so that the node
contract (:mod:`nodes.base`) can raise these errors.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any, Protocol

from nodes.credentials import scrubbed

ON_ERROR_CHOICES = ("raise", "skip")


#: The longest record a reader assembles or a decoder expands (its bytes after
#: decompression), unless the read step says otherwise (``max_record_bytes``): a record
#: past it is a ``BadRecordError`` (under ``on_error="skip"``: skipped and counted) before
#: it is held whole. Real data never has a 256 MiB line; a 600 KB gzip file can hold one
#: of 600 MB.
MAX_RECORD_BYTES = 256 << 20


def check_expanded_size(size: int, what: str) -> None:
    """Refuse (``ValueError``) ``what`` that would be ``size`` bytes once expanded, past
    :data:`MAX_RECORD_BYTES` (read when called, so a test or a user may lower it)."""
    if size > MAX_RECORD_BYTES:
        raise ValueError(
            f"{what} would expand to {size:,} bytes, past {MAX_RECORD_BYTES:,} "
            "(nodes.errors.MAX_RECORD_BYTES)"
        )


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``, on Python 3.10 too: there the note goes in ``__notes__``
    as 3.11 keeps it (3.10's tracebacks do not print it; ``__notes__`` has it).

    >>> error = ValueError("bad")
    >>> add_note(error, "while reading a.jsonl")
    >>> error.__notes__
    ['while reading a.jsonl']
    """
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:
        error.__notes__ = [*getattr(error, "__notes__", ()), note]  # type: ignore[attr-defined]


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


class ElasticResumeError(StateMismatchError):
    """A checkpoint cannot resume exactly on another topology: a step has no exact answer.

    The message names the step and what would work instead (resume on the
    saved topology, or a recipe whose steps can be re-dealt).
    """


class _Step(Protocol):
    """A step of a built graph, as a refusal names it (a :class:`nodes.Node`)."""

    @property
    def kind(self) -> str: ...


def refuse(node: _Step, why: str) -> ElasticResumeError:
    """The error for ``node`` that cannot take part in a resume on another topology."""
    return ElasticResumeError(
        f"this checkpoint cannot resume on another topology: step '{node.kind}' {why}. "
        "Resume it with the world size and num_workers it was saved with (that stays exact), "
        "or let the epoch end there and change the topology at the epoch boundary."
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
        self.count = 0  # skips: bad records, and lost files and ranges of files (one each)
        # What lost files and ranges held, apart from the bad records (see losses()).
        self.files = 0  # files lost whole (missing, unreadable from their start)
        self.ranges = 0  # ranges of files lost (a rest: truncated; damaged bytes read past)
        self.bytes = 0  # bytes of those files and ranges, where their size is known
        self.rows = 0  # records known to be in them (rows of a .npy, from its header)
        self.examples: list[str] = []

    def handle(self, error: Exception) -> None:
        """Raise ``error`` (a bad record), or count it and warn about the first skip."""
        if not self.skip:
            raise error  # scrubbed where it leaves: the Loader, a worker, a TorchDataset
        self._skipped(error, "a bad record")

    def lose(
        self,
        error: Exception,
        *,
        whole_file: bool,
        records: int | None = None,
        nbytes: int | None = None,
        what: str | None = None,
    ) -> None:
        """Raise ``error``, or count the loss of a whole file or of a range of one.

        ``records`` and ``nbytes`` are what the lost part held, where the
        format knows it (``None``: unknown); the loss counts one skip, and its
        file, range, records and bytes in :meth:`losses`. ``what`` names a
        range that is not the rest of the file (a damaged range read past).
        """
        if not self.skip:
            raise error  # scrubbed where it leaves: the Loader, a worker, a TorchDataset
        self.files += whole_file
        self.ranges += not whole_file
        self.rows += records or 0
        self.bytes += nbytes or 0
        held = [f"{records:,} records" if records is not None else "records: unknown"]
        held.append(f"{nbytes:,} bytes" if nbytes is not None else "bytes: unknown")
        what = what or ("the whole file" if whole_file else "the rest of the file")
        self._skipped(error, f"{what} ({', '.join(held)})")

    def _skipped(self, error: Exception, what: str) -> None:
        self.count += 1
        if len(self.examples) < self.MAX_EXAMPLES:
            self.examples.append(scrubbed(str(error)))
        if self.count == 1:
            warnings.warn(
                f"{self.step}: skipping {what} ({scrubbed(str(error))}); further skips are counted "
                "silently, see Loader.skipped() and Loader.losses()",
                BadRecordWarning,
                stacklevel=3,
            )

    def losses(self) -> dict[str, int]:
        """What the skips lost: records (a lower bound), files, ranges and bytes (where known).

        ``records`` counts the bad records and the records a lost file or range
        was known to hold; a lost file or range whose records cannot be counted
        (text; the samples wholly inside a tar's damaged bytes) adds to ``files``
        or ``ranges`` only. A tar counts the samples next to its damage that
        lost a member as bad records.
        """
        return {
            "records": self.count - self.files - self.ranges + self.rows,
            "files": self.files,
            "ranges": self.ranges,
            "bytes": self.bytes,
        }

    def tally(self) -> tuple[int, int, int, int, int]:
        """All counters, to restore with :meth:`restore` (a reader's resume point keeps one)."""
        return self.count, self.files, self.ranges, self.bytes, self.rows

    def restore(self, tally: tuple[int, int, int, int, int]) -> None:
        """Set the counters to a :meth:`tally`."""
        self.count, self.files, self.ranges, self.bytes, self.rows = tally

    @staticmethod
    def lost_state(tally: tuple[int, int, int, int, int]) -> list[int] | None:
        """The losses of a tally as state (``[files, ranges, bytes, rows]``); None: no loss."""
        lost = list(tally[1:])
        return lost if lost[0] or lost[1] else None

    def load_state(self, skipped: Any, lost: Any, path: str = "state") -> None:
        """Restore the counters from state (``skipped`` and the optional ``lost``), checked."""
        if type(skipped) is not int or skipped < 0:
            raise InvalidStateError(f"{path}.skipped", "a count of skips >= 0", skipped)
        values = [skipped, *([0, 0, 0, 0] if lost is None else lost)]
        if (
            not isinstance(lost, (list, type(None)))
            or len(values) != 5
            or not all(type(v) is int and v >= 0 for v in values)
            or values[1] + values[2] > skipped
        ):
            raise InvalidStateError(
                f"{path}.lost",
                "[files, ranges, bytes, rows] of integers >= 0, with files + ranges at most "
                f"the skip count ({skipped}), or no such key",
                lost,
            )
        self.restore((values[0], values[1], values[2], values[3], values[4]))


class BadRecordWarning(UserWarning):
    """The first bad record a step skipped under ``on_error="skip"``."""


def _skipping_policies(node: Any) -> Iterator[ErrorPolicy]:
    """The skipping policies of a built graph's steps, in :func:`nodes.base.walk_graph`'s
    order (walked here: this module sits below the node contract)."""
    if node is None:
        return
    policy = node.errors
    if isinstance(policy, ErrorPolicy) and policy.skip:
        yield policy
    for upstream in node.inputs:
        yield from _skipping_policies(upstream)


def loss_counts(root: Any) -> dict[str, dict[str, int]]:
    """What the skips of each step of a built graph lost (see :meth:`ErrorPolicy.losses`)."""
    counts: dict[str, dict[str, int]] = {}
    for policy in _skipping_policies(root):
        add_losses(counts.setdefault(policy.step, {}), policy.losses())
    return counts


def lost_files_and_ranges(losses: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The steps that lost files or ranges (the others' losses are their skip counts)."""
    return {step: lost for step, lost in losses.items() if lost["files"] or lost["ranges"]}


LOSS_KEYS = ("records", "files", "ranges", "bytes")


def check_losses(losses: Any, path: str) -> None:
    """Refuse losses by step that are not ``{step: {records, files, ranges, bytes}}`` counts."""
    if not isinstance(losses, dict) or not all(
        isinstance(lost, dict)
        and sorted(lost) == sorted(LOSS_KEYS)
        and all(type(n) is int and n >= 0 for n in lost.values())
        for lost in losses.values()
    ):
        raise InvalidStateError(
            path, "a dict by step of {'records', 'files', 'ranges', 'bytes'} counts >= 0", losses
        )


def add_losses(into: dict[str, int], losses: dict[str, int]) -> dict[str, int]:
    """Add one step's losses to another's (steps of several processes or nodes)."""
    for name, value in losses.items():
        into[name] = into.get(name, 0) + value
    return into


def skip_counts(root: Any) -> dict[str, int]:
    """Bad records skipped so far by each step of a built graph, keyed by the step's recipe."""
    counts: dict[str, int] = {}
    for policy in _skipping_policies(root):
        counts[policy.step] = counts.get(policy.step, 0) + policy.count
    return counts
