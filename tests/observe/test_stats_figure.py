"""The epoch over time: PipelineStats.timeline, .figure() (matplotlib) and .log_to() (a
TensorBoard SummaryWriter's add_scalar)."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

import datapipes as dp
from datapipes.loader import epoch_stats


def nap(x: int) -> int:
    time.sleep(0.002)
    return x


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> dp.PipelineStats:
    monkeypatch.setattr(epoch_stats, "TIMELINE_SECONDS", 0.02)  # the clock it reads
    loader = dp.Loader(dp.range(120).map(nap).batch(4), stats=True)
    assert len(list(loader)) == 30
    return loader.stats()


def test_the_timeline_runs_from_the_start_to_the_totals(stats: dp.PipelineStats) -> None:
    points = stats.timeline
    assert len(points) >= 4  # about 0.25 s of epoch, a point every 0.02 s, and the last
    seconds = [p["seconds"] for p in points]
    delivered = [p["delivered"] for p in points]
    assert seconds == sorted(seconds) and delivered == sorted(delivered)
    last = points[-1]
    assert last["delivered"] == stats.delivered == 30
    assert last["steps"] == {step.step: step.self_seconds for step in stats.steps}
    assert stats.as_dict()["timeline"] == points


def test_the_figure_is_written_with_data_in_both_panels(stats, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "epoch.png"
    figure = stats.figure(str(path))
    assert path.stat().st_size > 10_000
    rate, shares = figure.axes[0], figure.axes[1]
    assert rate.lines and len(rate.lines[0].get_xdata()) >= 3
    assert {line.get_label() for line in shares.lines} >= {"map(nap)", "batch(4)"}
    assert "slowest step: map(nap)" in figure._suptitle.get_text()
    bold = max(shares.lines, key=lambda line: line.get_linewidth())
    assert bold.get_label() == "map(nap)"  # the bottleneck, marked


def test_without_matplotlib_the_figure_says_how_to_get_it(stats, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(ImportError, match=r"\[plots\]"):
        stats.figure()


class Scalars:
    """What a torch.utils.tensorboard SummaryWriter is asked: add_scalar(tag, value, step)."""

    def __init__(self) -> None:
        self.logged: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, value: Any, global_step: int) -> None:
        self.logged.append((tag, float(value), global_step))


def test_tensorboard_scalars_name_every_step(stats: dp.PipelineStats) -> None:
    writer = Scalars()
    stats.log_to(writer, global_step=7)
    tags = {tag: value for tag, value, step in writer.logged if step == 7}
    assert tags["datapipes/outputs_per_second"] > 0
    assert 0 <= tags["datapipes/wait_share"] <= 1
    assert tags["datapipes/us_per_item/map(nap)"] >= 2000  # it sleeps 2 ms an item
    assert len(writer.logged) == 2 + len(stats.steps)


def test_a_long_epoch_keeps_a_bounded_timeline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(epoch_stats, "TIMELINE_SECONDS", 0.0)  # a point after every output
    monkeypatch.setattr(epoch_stats, "TIMELINE_POINTS", 16)
    loader = dp.Loader(dp.range(500), stats=True)
    assert len(list(loader)) == 500
    points = loader.stats().timeline
    assert 8 <= len(points) <= 17  # halved whenever 16 were reached, plus the last
    assert [p["delivered"] for p in points] == sorted(p["delivered"] for p in points)
    assert points[-1]["delivered"] == 500
