"""A training loop that test_saving.py kills with SIGKILL and restarts (see there).

``python preempted_training.py train WORKDIR`` trains a small model on a Loader
over ``dp.range(SAMPLES)``, saves model, optimizer, Loader state and the ids
consumed so far with ``dp.save_checkpoint`` every ``SAVE_EVERY`` steps (padded
with ``PAD_MB`` of tensors so that a kill often lands inside a save), and
resumes from the checkpoint when one exists. It appends ``ready``,
``save-start N``, ``save-end N`` and ``done`` to ``WORKDIR/events.log`` so the
killer can wait for it and tell where each kill landed.

``python preempted_training.py die-at POINT PATH`` saves version 1 of a
checkpoint at PATH, then dies by SIGKILL at POINT while saving version 2:
``write`` (halfway through writing the temporary file), ``replace`` (the
temporary file complete, before the rename), ``dirsync`` (after the rename,
before the directory fsync), or ``plain-torch-save`` (halfway through a plain
``torch.save`` into PATH: the control that shows the failure is real).
"""

from __future__ import annotations

import io
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

import datapipes as dp
import datapipes.checkpoint.saving

SAMPLES = 1_600
BATCH = 8
STEPS = SAMPLES // BATCH  # 200: one epoch
SAVE_EVERY = 2
PAD_MB = 8


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, dp.Loader]:
    """The model, optimizer and Loader, seeded so every run computes the same thing."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = dp.Loader(dp.range(SAMPLES).shuffle().batch(BATCH), seed=0)
    return model, optimizer, loader


def train(workdir: Path, save: bool = True) -> dict[str, Any]:
    """Train to the end of the epoch, resuming from ``workdir/ckpt.pt``; return the last state.

    ``save=False`` is the uninterrupted reference: the same arithmetic, no checkpoints.
    """
    checkpoint = workdir / "ckpt.pt"
    events = os.open(workdir / "events.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    model, optimizer, loader = build()
    step, consumed = 0, []
    if checkpoint.exists():
        state = dp.load_checkpoint(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["data"])
        step, consumed = state["step"], state["consumed"].tolist()
    os.write(events, b"ready\n")
    pad = torch.zeros(PAD_MB << 18)  # float32: PAD_MB MiB
    state = {"step": step}
    if step < STEPS:
        for batch in loader:
            x = batch.float().unsqueeze(1) / SAMPLES
            loss = ((model(x) - torch.sin(6 * x)) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            consumed.extend(batch.tolist())
            step += 1
            if step % SAVE_EVERY == 0 or step == STEPS:
                state = {
                    "step": step,
                    "consumed": torch.tensor(consumed),
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "data": loader.state_dict(),
                    "pad": pad,
                }
                if save:
                    os.write(events, f"save-start {step}\n".encode())
                    dp.save_checkpoint(state, checkpoint)
                    os.write(events, f"save-end {step}\n".encode())
            if step == STEPS:
                break
    os.write(events, b"done\n")
    os.close(events)
    return state


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def die_at(point: str, path: str) -> None:
    """Save version 1 at ``path``, then die by SIGKILL at ``point`` while saving version 2."""
    dp.save_checkpoint({"version": 1, "pad": torch.ones(1 << 20)}, path)
    new = {"version": 2, "pad": torch.full((1 << 20,), 2.0)}
    real_save = torch.save

    def half_then_die(obj: Any, file: Any) -> None:
        buffer = io.BytesIO()
        real_save(obj, buffer)
        file.write(buffer.getvalue()[: buffer.tell() // 2])
        file.flush()
        _die()

    if point == "plain-torch-save":
        with open(path, "wb") as file:  # what torch.save(obj, path) does: truncate, then write
            half_then_die(new, file)
    if point == "write":
        datapipes.checkpoint.saving.torch.save = half_then_die
    elif point == "replace":
        datapipes.checkpoint.saving.os.replace = lambda *args: _die()
    elif point == "dirsync":
        datapipes.checkpoint.saving._fsync_directory = lambda folder: _die()
    dp.save_checkpoint(new, path)
    raise SystemExit(f"unknown point {point!r}: the save finished")


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(Path(sys.argv[2]))
    else:
        die_at(sys.argv[2], sys.argv[3])
