"""The Loader's arguments checked, and the warning it gives when a step cannot resume exactly."""

from __future__ import annotations

from typing import Any

from datapipes.pipe import DataPipe

_DATALOADER_OPTIONS = frozenset(
    {
        "prefetch_factor",
        "timeout",
        "multiprocessing_context",
        "worker_init_fn",
        "snapshot_every_n_steps",
        "persistent_workers",
    }
)


def check_arguments(pipe: Any, num_workers: Any, dataloader_options: dict[str, Any]) -> None:
    """Refuse, saying what to pass instead, arguments a Loader cannot run with."""
    if not isinstance(pipe, DataPipe):
        raise TypeError(
            f"Loader takes a DataPipe recipe, got {type(pipe).__name__}; build one with "
            "dp.from_sequence(...), dp.range(...) or dp.from_iterable(...)"
        )
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
    unknown = set(dataloader_options) - _DATALOADER_OPTIONS
    if unknown:
        raise TypeError(
            f"Loader got unexpected arguments {sorted(unknown)}; DataLoader options it "
            f"passes on are {sorted(_DATALOADER_OPTIONS)}"
        )
    if dataloader_options and num_workers == 0:
        raise ValueError(
            f"{sorted(dataloader_options)} configure worker processes: set num_workers > 0"
        )
    prefetch_factor = dataloader_options.get("prefetch_factor", 2)
    if not isinstance(prefetch_factor, int) or prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be an int >= 1, got {prefetch_factor!r}")


class InexactResumeWarning(UserWarning):
    """A step of the recipe cannot resume exactly (said when the Loader is made, with the fix)."""
