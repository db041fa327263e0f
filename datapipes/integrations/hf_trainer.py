"""A :class:`datapipes.TrainerLoader` as a Hugging Face ``transformers.Trainer``'s training
data, resumed exactly by the Trainer's own checkpoints (``resume_from_checkpoint``).

The Trainer builds its own DataLoader and, on a resume, skips the batches it
had trained on by reading them again (or, with ``ignore_data_skip``, not at
all). :func:`use_in_hf_trainer` hands it the Loader instead and keeps the Loader's
state in every checkpoint folder, next to the Trainer's: the resume reads
nothing twice and skips nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from datapipes.integrations.trainers import TrainerLoader

#: The file of the Loader's state in each checkpoint folder.
STATE_FILE = "datapipes_loader_state.json"


def use_in_hf_trainer(trainer: Any, data: TrainerLoader) -> None:
    """Make ``data`` the training data of ``trainer`` (a ``transformers.Trainer``).

    Needs ``TrainingArguments(ignore_data_skip=True)``: the Loader resumes at
    the checkpoint's batch by itself. After this, ``trainer.train()`` and
    ``trainer.train(resume_from_checkpoint=...)`` (a folder, or ``True`` for the
    last one) work as usual; every checkpoint folder holds the Loader's state
    (every rank's, gathered: each rank calls the Trainer's ``on_save``).

    >>> # trainer = transformers.Trainer(model, args, ...)   # no train_dataset needed
    >>> # dp.use_in_hf_trainer(trainer, dp.TrainerLoader(dp.Loader(pipe)))
    >>> # trainer.train(resume_from_checkpoint=True)
    """
    if not isinstance(data, TrainerLoader):
        raise TypeError(f"use_in_hf_trainer takes a dp.TrainerLoader, got {type(data).__name__}")
    if not getattr(trainer.args, "ignore_data_skip", False):
        raise ValueError(
            "the Trainer would skip the batches of a resumed epoch by reading them again, and "
            "the Loader resumes at the checkpoint's batch by itself: pass "
            "TrainingArguments(..., ignore_data_skip=True)"
        )
    trainer.get_train_dataloader = lambda: data
    trainer.add_callback(_save_callback(data))
    train = trainer.train

    def train_resuming(resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        folder = resume_from_checkpoint
        if folder is True:
            from transformers.trainer_utils import get_last_checkpoint

            folder = get_last_checkpoint(trainer.args.output_dir)
        if folder:
            data.load_state_dict(read_state(Path(str(folder))))
        return train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    trainer.train = train_resuming


def read_state(folder: Path) -> dict[str, Any]:
    """The Loader's state in a checkpoint folder; a clear error where there is none."""
    path = folder / STATE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} does not exist: this checkpoint was saved without the Loader's state "
            "(use_in_hf_trainer() was not called on that Trainer), so its data position is unknown"
        ) from None
    try:
        state = json.loads(text)
    except ValueError as error:
        raise ValueError(f"{path} is not a Loader state (damaged JSON: {error})") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a Loader state (found a {type(state).__name__})")
    return state


def _save_callback(data: TrainerLoader) -> Any:
    from transformers import TrainerCallback

    class SaveLoaderState(TrainerCallback):  # type: ignore[misc]
        """Writes the Loader's state into each checkpoint folder the Trainer saves."""

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            loader_state = data.state_dict()  # every rank: a collective when it gathers
            if not state.is_world_process_zero:
                return
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / (STATE_FILE + ".partial")
            partial.write_text(json.dumps(loader_state), encoding="utf-8")
            os.replace(partial, folder / STATE_FILE)  # whole or not at all

    return SaveLoaderState()
