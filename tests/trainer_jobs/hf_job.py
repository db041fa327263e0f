"""A tiny Hugging Face Trainer job over a datapipes Loader (dp.use_in_hf_trainer): train,
or stop mid-epoch right after a checkpoint, or resume from one; writes the batches it
trained on (tests/integrations/test_trainers.py).

python hf_job.py OUT_DIR --workers 0|2 [--stop STEP] [--resume CHECKPOINT_DIR]
"""

from __future__ import annotations

import os
import sys

import torch
from common import BATCH, EPOCHS, ITEMS, SEED, arguments, recipe, write_seen
from transformers import Trainer, TrainerCallback, TrainingArguments

import datapipes as dp
from datapipes.integrations.hf_trainer import use_in_hf_trainer


def record(x: int) -> dict[str, torch.Tensor]:
    return {"x": torch.tensor([float(x)])}


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list[float]] = []

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.training:
            self.seen.append(x.flatten().tolist())
        return {"loss": self.layer(x).pow(2).mean()}


class StopAfterSave(TrainerCallback):
    """Stop right after the checkpoint of step ``step``, as a job killed there."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def main() -> None:
    args, out = arguments()
    training = TrainingArguments(
        output_dir=str(out),
        # the Loader has no length: steps, each rank a batch a step, a pass an epoch
        max_steps=EPOCHS * ITEMS // BATCH // int(os.environ.get("WORLD_SIZE", "1")),
        save_strategy="steps",
        save_steps=args.stop or 10_000,
        ignore_data_skip=True,  # the Loader resumes where the checkpoint was
        report_to=[],
        logging_strategy="no",
        use_cpu=True,
        learning_rate=0.01,
        disable_tqdm=True,
    )
    model = Tiny()
    callbacks = [] if args.stop is None else [StopAfterSave(args.stop)]
    trainer = Trainer(model=model, args=training, callbacks=callbacks)
    data = dp.TrainerLoader(dp.Loader(recipe(record), seed=SEED, num_workers=args.workers))
    use_in_hf_trainer(trainer, data)
    trainer.train(resume_from_checkpoint=args.resume)
    write_seen(out, trainer.args.process_index, model.seen)
    data.close()
    if torch.distributed.is_initialized():  # gloo's threads left at exit can abort it
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
