"""A tiny HF Accelerate job over a datapipes Loader: train, or stop mid-epoch after
``save_state``, or resume with ``load_state``; each process writes the batches it trained
on (tests/integrations/test_trainers.py). Several processes: run it under torchrun.

python accelerate_job.py OUT_DIR --workers 0|2 [--stop STEP] [--resume STATE_DIR]
"""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator
from common import EPOCHS, SEED, arguments, recipe, write_seen

import datapipes as dp


def main() -> None:
    args, out = arguments()
    accelerator = Accelerator(cpu=True)  # starts the process group under torchrun
    data = dp.TrainerLoader(dp.Loader(recipe(), seed=SEED, num_workers=args.workers))
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)  # data: unchanged
    accelerator.register_for_checkpointing(data)  # its state in save_state / load_state
    if args.resume:
        accelerator.load_state(args.resume)
    seen: list[list[float]] = []
    step = 0
    for _ in data.loader.epochs(EPOCHS):  # after load_state: the saved epoch, mid-way
        for batch in data:
            seen.append(batch.flatten().tolist())
            loss = model(batch).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step == args.stop:
                accelerator.save_state(str(out / "state"))
                break
        if step == args.stop:
            break
    rank = accelerator.process_index
    write_seen(out, rank, seen)
    data.close()
    accelerator.end_training()
    if torch.distributed.is_initialized():  # gloo's threads left at exit can abort it
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
