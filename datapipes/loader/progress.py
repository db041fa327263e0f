"""The Loader's epoch clock and its optional progress bar (``tqdm``)."""

from __future__ import annotations

from collections.abc import Iterator
from time import perf_counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datapipes.pipe import DataPipe

#: Steps that keep each output item what it was for the question "is it a batch?".
_KEEPS_ITEMS = frozenset(
    {"map", "filter", "shuffle", "prefetch", "pin_memory", "to_device", "take", "repeat", "shard"}
)
_REFRESH_SECONDS = 0.5


def progress_bar_class() -> Any:
    """``tqdm.auto.tqdm``, or an ImportError that says how to get it."""
    try:
        from tqdm.auto import tqdm
    except ImportError as error:
        raise ImportError(
            "Loader(progress=True) draws its bar with tqdm, which is not installed: "
            "pip install tqdm (or pip install 'datapipes-torch[progress]')"
        ) from error
    return tqdm


class EpochClock:
    """Wall-clock time since the current (or last) epoch started, until it ended."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._stopped: float | None = None

    def start(self) -> None:
        self._started, self._stopped = perf_counter(), None

    def stop(self) -> None:
        if self._started is not None and self._stopped is None:
            self._stopped = perf_counter()

    def seconds(self) -> float:
        if self._started is None:
            return 0.0
        return (self._stopped or perf_counter()) - self._started


def outputs_are_batches(pipe: DataPipe[Any]) -> bool:
    """Whether the recipe's outputs are batches (its last item-changing step is ``batch``)."""
    step = pipe
    while step.name in _KEEPS_ITEMS and len(step.inputs) == 1:
        step = step.inputs[0]
    return step.name == "batch"


def batch_length(batch: Any) -> int:
    """Samples in a batch: a tensor's first dimension, a list's length, a dict's first field."""
    while True:
        if hasattr(batch, "shape") and len(batch.shape):
            return int(batch.shape[0])
        if isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        elif isinstance(batch, tuple) and batch:  # a collated tuple of fields
            batch = batch[0]
        elif isinstance(batch, list):
            return len(batch)
        else:
            return 1


class ProgressBar:
    """A tqdm bar over one epoch: outputs per second, and samples per second for batches."""

    def __init__(self, epoch: int, pipe: DataPipe[Any], tqdm: Any) -> None:
        self._batches = outputs_are_batches(pipe)
        unit = "batch" if self._batches else "item"
        self._bar = tqdm(desc=f"epoch {epoch}", unit=unit, dynamic_ncols=True)

    def wrap(self, items: Iterator[Any]) -> Iterator[Any]:
        """``items`` unchanged, advancing the bar as they pass."""
        bar, batches = self._bar, self._batches
        start = last = perf_counter()
        samples = 0
        for item in items:
            bar.update(1)
            if batches:
                samples += batch_length(item)
                now = perf_counter()
                if now - last >= _REFRESH_SECONDS:
                    bar.set_postfix_str(f"{samples / (now - start):,.0f} items/s", refresh=False)
                    last = now
            yield item

    def close(self) -> None:
        self._bar.close()
