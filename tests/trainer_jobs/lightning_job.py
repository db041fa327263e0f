"""A tiny Lightning job over a datapipes Loader: train, or stop mid-epoch with a checkpoint,
or resume from one; each rank writes the batches it trained on
(tests/integrations/test_trainers.py).

python lightning_job.py OUT_DIR --devices 1|2 --workers 0|2 [--stop STEP] [--resume CKPT]
"""

from __future__ import annotations

import sys

import lightning as L
import torch
from common import EPOCHS, SEED, arguments, recipe, write_seen

import datapipes as dp


class Tiny(L.LightningModule):
    def __init__(self, workers: int) -> None:
        super().__init__()
        self.workers = workers
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list[float]] = []

    def train_dataloader(self):  # made here: after the process group started
        loader = dp.Loader(recipe(), seed=SEED, num_workers=self.workers)
        return dp.TrainerLoader(loader, fetched_ahead=1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch.flatten().tolist())
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StopAt(L.Callback):
    """Save a checkpoint after training step ``step`` and stop, as a job killed there."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def main() -> None:
    args, out = arguments(devices=True)
    callbacks = [] if args.stop is None else [StopAt(args.stop, str(out / "stop.ckpt"))]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=EPOCHS,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    model = Tiny(args.workers)
    trainer.fit(model, ckpt_path=args.resume)
    write_seen(out, trainer.global_rank, model.seen)


if __name__ == "__main__":
    sys.exit(main())
