"""The figure of :meth:`datapipes.PipelineStats.figure`: an epoch over time, its bottleneck
marked (matplotlib, the optional ``plots`` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def pyplot(path: str | None, caller: str) -> Any:
    """``matplotlib.pyplot``, drawing off screen when the figure goes to a file; a missing
    matplotlib is an ImportError naming ``caller`` and the extra that brings it."""
    try:
        import matplotlib

        if path is not None:
            matplotlib.use("Agg", force=False)  # no display needed to write a file
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            f"{caller} draws with matplotlib: pip install 'datapipes-torch[plots]'"
        ) from None
    return plt


def draw(
    *,
    timeline: Sequence[dict[str, Any]],
    steps: Sequence[str],
    slowest: str | None,
    epoch: int,
    delivered: int,
    elapsed_seconds: float,
    path: str | None = None,
) -> Any:
    """Two panels over the epoch's time: outputs per second with the share of each interval
    the training loop waited for data, then each step's share of the pipeline's own time
    per interval, the slowest step drawn bold and named in the title.

    The figure takes the statistics' plain parts (:class:`~datapipes.PipelineStats`'s
    ``timeline``, its step names, the slowest step's name, the epoch and its totals), not
    the statistics themselves: the stats import the figure, never the other way."""
    plt = pyplot(path, "PipelineStats.figure()")
    points = [{"seconds": 0.0, "delivered": 0, "waited": 0.0, "steps": {}}]
    for point in timeline:  # a point within 10 ms of the one before replaces it
        if point["seconds"] - points[-1]["seconds"] < 0.01 and len(points) > 1:
            points[-1] = point
        else:
            points.append(point)
    figure, (rate_axes, share_axes) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    times, rates, waits = [], [], []
    for before, after in zip(points, points[1:]):
        span = after["seconds"] - before["seconds"]
        if span <= 0:
            continue
        times.append(after["seconds"])
        rates.append((after["delivered"] - before["delivered"]) / span)
        waits.append(100 * (after["waited"] - before["waited"]) / span)
    rate_axes.plot(times, rates, marker="o", label="outputs/s")
    rate_axes.set_ylabel("outputs per second")
    wait_axes = rate_axes.twinx()
    wait_axes.plot(times, waits, color="tab:red", linestyle="--", label="loop waited (%)")
    wait_axes.set_ylabel("training loop waited (%)")
    rate_axes.legend(loc="upper left")
    wait_axes.legend(loc="upper right")
    for name in steps:
        shares = []
        for before, after in zip(points, points[1:]):
            own = sum(after["steps"].values()) - sum(before["steps"].values())
            # sampled times are estimates that can step back a little: no negative share
            mine = max(0.0, after["steps"].get(name, 0.0) - before["steps"].get(name, 0.0))
            if after["seconds"] > before["seconds"]:
                shares.append(100 * mine / own if own > 0 else 0.0)
        bold = name == slowest
        share_axes.plot(times, shares, linewidth=3 if bold else 1, label=name)
    share_axes.set_ylabel("share of the steps' own time (%)")
    share_axes.set_xlabel("seconds into the epoch")
    share_axes.legend(loc="best", fontsize="small")
    rate = delivered / elapsed_seconds if elapsed_seconds else 0.0
    figure.suptitle(
        f"epoch {epoch}: {delivered:,} outputs, {rate:,.1f}/s"
        + ("" if slowest is None else f"; slowest step: {slowest}")
    )
    figure.tight_layout()
    if path is not None:
        figure.savefig(path)
    return figure
