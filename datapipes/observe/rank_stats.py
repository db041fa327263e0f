"""Every rank's statistics side by side: which rank feeds its training loop slowest, and why.

:meth:`datapipes.Loader.stats_by_rank` gathers them (one collective, at the user's call,
never on the hot path) into a :class:`RankStats`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from datapipes.observe.stats import PipelineStats, StepStats, aligned


@dataclass
class RankStats:
    """The statistics of every rank (``ranks[r]`` is rank ``r``'s), with a table naming the
    slowest rank, the one whose pipeline spent the most time per output in its own steps,
    and that rank's slowest step. (Not the longest wait for data: in a job whose ranks meet
    in collectives, the others wait for the slow one too, and ``even_batches`` makes them
    wait for it inside the Loader.)

    >>> from datapipes.observe.stats import PipelineStats, StepStats
    >>> def rank(wait, own):
    ...     step = StepStats("map(decode)", "main", 1, 10, own, 0.0, 0)
    ...     return PipelineStats([step], 0, 10, 1.0, wait)
    >>> view = RankStats([rank(0.9, 0.1), rank(0.9, 0.8)])
    >>> view.slowest_rank(), view.slowest_step(1).step
    (1, 'map(decode)')
    """

    ranks: list[PipelineStats]

    def slowest_rank(self) -> int:
        """The rank whose steps spent the most time per output (ties: the longest wait)."""
        return max(
            range(len(self.ranks)),
            key=lambda r: (_per_output(self.ranks[r]), self.ranks[r].loader_wait_seconds),
        )

    def slowest_step(self, rank: int) -> StepStats | None:
        """The step with the most own time on ``rank``."""
        return self.ranks[rank].slowest()

    def as_dict(self) -> dict[str, Any]:
        """Plain data (json-friendly): every rank's statistics and the slowest rank."""
        return {
            "ranks": [stats.as_dict() for stats in self.ranks],
            "slowest_rank": self.slowest_rank() if self.ranks else None,
        }

    def table(self) -> str:
        """One row per rank, then the slowest rank and its slowest step."""
        header = ("rank", "outputs", "elapsed s", "waited s", "waited", "steps' own s", "slowest")
        rows = []
        for rank, stats in enumerate(self.ranks):
            slowest = stats.slowest()
            elapsed = stats.elapsed_seconds
            rows.append(
                (
                    str(rank),
                    f"{stats.delivered:,}",
                    f"{elapsed:.2f}",
                    f"{stats.loader_wait_seconds:.2f}",
                    f"{100 * stats.loader_wait_seconds / elapsed if elapsed else 0:.0f}%",
                    f"{stats.own_seconds:.2f}",
                    "-" if slowest is None else slowest.step,
                )
            )
        lines = aligned([header, *rows])
        if self.ranks:
            rank = self.slowest_rank()
            stats = self.ranks[rank]
            step = self.slowest_step(rank)
            share = 100 * step.self_seconds / (stats.own_seconds or 1.0) if step else 0.0
            lines.append(
                f"slowest rank: {rank} ({1000 * _per_output(stats):.2f} ms of its steps' "
                "own time per output); its slowest step: "
                + ("none ran" if step is None else f"{step.step} ({share:.0f}% of its steps' time)")
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _per_output(stats: PipelineStats) -> float:
    return stats.own_seconds / max(stats.delivered, 1)


def gather(stats: PipelineStats) -> RankStats:
    """Every rank's ``stats``, gathered through ``torch.distributed`` (a collective)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "stats_by_rank() gathers every rank's statistics through torch.distributed, which "
            "is not initialized; in one process, use stats()"
        )
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, stats)  # the dataclasses themselves: nothing to rebuild
    return RankStats(gathered)
