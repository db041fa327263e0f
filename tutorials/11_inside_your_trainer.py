# %% [markdown]
# # Inside your trainer: Lightning, Accelerate and the Hugging Face Trainer
#
# Most training runs go through a trainer, and a trainer saves and loads its
# own checkpoints. This tutorial hands a datapipes Loader to three of them,
# stops each run mid-epoch right after a checkpoint, resumes from that
# checkpoint with fresh objects, and checks that the batches trained on
# before and after the stop are exactly the uninterrupted run's.
#
# `dp.TrainerLoader` is the one piece of glue: it gives the trainer the state
# of the batches it *used* (Lightning fetches one ahead), starts nothing when
# the trainer only looks at it, and under several ranks gathers every rank's
# state so that rank 0's checkpoint resumes them all. The Hugging Face
# `Trainer` also needs `dp.use_in_hf_trainer`, which hands it the Loader and
# keeps the Loader's state in each checkpoint folder. At the end,
# torchtitan's data-loader protocol through `dp.TorchTitanLoader`.
# Run `python tutorials/11_inside_your_trainer.py`; it asserts what it shows.

# %%
import json
import logging
import tempfile
import warnings
from pathlib import Path

import lightning as L
import torch
from accelerate import Accelerator
from transformers import Trainer, TrainerCallback, TrainingArguments

import datapipes as dp

warnings.filterwarnings("ignore", category=UserWarning)  # trainers' advice for big machines
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

ITEMS, BATCH, EPOCHS, STOP = 48, 4, 2, 7
folder = Path(tempfile.mkdtemp())


def as_x(i: int) -> torch.Tensor:
    return torch.tensor([float(i)])


def recipe() -> dp.DataPipe:
    """The same data for every trainer: 48 numbers, shuffled each epoch, in batches of 4."""
    return dp.range(ITEMS).shuffle().map(as_x).batch(BATCH)


def uninterrupted() -> list[list[float]]:
    loader = dp.Loader(recipe(), seed=3)
    return [batch.flatten().tolist() for _ in range(EPOCHS) for batch in loader]


expected = uninterrupted()
print(f"{len(expected)} batches over {EPOCHS} epochs; the runs stop after step {STOP}")

# %% [markdown]
# ## PyTorch Lightning
#
# Return a `TrainerLoader` with `fetched_ahead=1` from `train_dataloader()`.
# Lightning keeps its state in the checkpoint (`trainer.save_checkpoint`, or
# `ModelCheckpoint`), and `fit(..., ckpt_path=...)` loads it.

# %%


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list[float]] = []

    def train_dataloader(self):
        return dp.TrainerLoader(dp.Loader(recipe(), seed=3), fetched_ahead=1)

    def training_step(self, batch, batch_idx):
        self.seen.append(batch.flatten().tolist())
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StopAt(L.Callback):
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == STOP:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True  # as if the job were killed here


def lightning_run(callbacks: list, ckpt_path: Path | None = None) -> list[list[float]]:
    model = Tiny()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=EPOCHS, callbacks=callbacks, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, ckpt_path=ckpt_path)
    return model.seen


checkpoint = folder / "lightning.ckpt"
before = lightning_run([StopAt(checkpoint)])
after = lightning_run([], ckpt_path=checkpoint)
print(f"Lightning: {len(before)} batches, stop, {len(after)} after the resume")
assert before + after == expected

# %% [markdown]
# A plain Loader would have lost a batch here: when Lightning saved the
# checkpoint after step 7, its fetcher already held batch 8, and the Loader's
# own position counted it.

# %%
plain = dp.Loader(recipe(), seed=3)
batches = iter(plain)
for _ in range(STOP + 1):  # 7 trained on, 1 fetched ahead
    next(batches)
resumed = dp.Loader(recipe(), seed=3)
resumed.load_state_dict(plain.state_dict())
first = next(iter(resumed)).flatten().tolist()
print("a plain Loader would resume at batch", expected.index(first) + 1, "instead of", STOP + 1)
assert first == expected[STOP + 1]

# %% [markdown]
# ## Hugging Face Accelerate
#
# `prepare` leaves the `TrainerLoader` as it is (each process reads its own
# share); `register_for_checkpointing` puts its state into `save_state` and
# `load_state`. Nothing is fetched ahead: `fetched_ahead=0`.

# %%


def accelerate_run(resume_from: Path | None, save_to: Path | None) -> list[list[float]]:
    accelerator = Accelerator(cpu=True)
    data = dp.TrainerLoader(dp.Loader(recipe(), seed=3))
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    accelerator.register_for_checkpointing(data)
    if resume_from is not None:
        accelerator.load_state(str(resume_from))
    seen, step = [], 0
    for _ in data.loader.epochs(EPOCHS):  # after load_state: the saved epoch, mid-way
        for batch in data:
            seen.append(batch.flatten().tolist())
            accelerator.backward(model(batch).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if save_to is not None and step == STOP:
                accelerator.save_state(str(save_to))
                return seen  # as if the job were killed here
    return seen


state = folder / "accelerate"
before = accelerate_run(None, state)
after = accelerate_run(state, None)
print(f"Accelerate: {len(before)} batches, stop, {len(after)} after the resume")
assert before + after == expected

# %% [markdown]
# ## The Hugging Face Trainer
#
# The `Trainer` makes its own DataLoader and, resuming, reads the trained
# batches again to skip them. `dp.use_in_hf_trainer` hands it the Loader
# instead and writes the Loader's state into every checkpoint folder;
# `ignore_data_skip=True` tells the Trainer not to skip (the Loader resumes
# by itself), and `max_steps` stands for the length a Loader does not have.

# %%


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list[float]] = []

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        self.seen.append(x.flatten().tolist())
        return {"loss": self.layer(x).pow(2).mean()}


def as_record(i: int) -> dict[str, torch.Tensor]:
    return {"x": torch.tensor([float(i)])}


class StopAfterSave(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        control.should_training_stop = True  # as if the job were killed here


def hf_run(callbacks: list, resume_from: str | None = None) -> list[list[float]]:
    args = TrainingArguments(
        output_dir=str(folder / "hf"), max_steps=EPOCHS * ITEMS // BATCH, save_steps=STOP,
        ignore_data_skip=True, use_cpu=True, report_to=[], logging_strategy="no",
        disable_tqdm=True,
    )  # fmt: skip
    model = Model()
    trainer = Trainer(model=model, args=args, callbacks=callbacks)
    pipe = dp.range(ITEMS).shuffle().map(as_record).batch(BATCH)
    dp.use_in_hf_trainer(trainer, dp.TrainerLoader(dp.Loader(pipe, seed=3)))
    trainer.train(resume_from_checkpoint=resume_from)
    return model.seen


before = hf_run([StopAfterSave()])
saved = folder / "hf" / f"checkpoint-{STOP}"
print("the checkpoint folder:", sorted(p.name for p in saved.iterdir()))
after = hf_run([], resume_from=str(saved))
print(f"HF Trainer: {len(before)} batches, stop, {len(after)} after the resume")
assert before + after == expected
steps = json.loads((saved / "datapipes_loader_state.json").read_text())["steps"]
print("the Loader state in the folder names its recipe:", steps)

# %% [markdown]
# Several ranks work the same way: under a process group `state_dict()`
# gathers every rank's state (all ranks call it at the same step, as the
# trainers do), rank 0's checkpoint holds them all, and every rank takes its
# own position from it. `tests/integrations/test_trainers.py` runs each trainer with 2
# ranks (gloo) and 2 DataLoader workers each.

# %% [markdown]
# ## torchtitan
#
# torchtitan saves its data loader with `torch.distributed.checkpoint` (DCP)
# as `{"dataloader": loader}` and wants batches as `(input_dict, labels)`.
# `dp.TorchTitanLoader` gives both: a `pack()`-style batch becomes
# `({"input": input_ids}, labels)`, and the state is one JSON entry, the same
# on every rank, so DCP writes it once and a resume on another number of
# data-parallel ranks deals the rest (torchtitan's own loader refuses that).
# Here, in one process, the DCP calls its checkpointer makes:

# %%
import torch.distributed.checkpoint as dcp  # noqa: E402


def as_tokens(i: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.tensor([i, i]), "labels": torch.tensor([i, -100])}


def titan_data() -> dp.TorchTitanLoader:
    pipe = dp.range(ITEMS).shuffle().map(as_tokens).batch(BATCH)
    return dp.TorchTitanLoader(dp.Loader(pipe, seed=3))


def ids(batches: list) -> list[list[int]]:
    return [inputs["input"][:, 0].tolist() for inputs, _labels in batches]


data = titan_data()
batches = iter(data)
before = [next(batches) for _ in range(STOP)]
dcp.save({"dataloader": data}, checkpoint_id=str(folder / "titan"))
resumed = titan_data()
dcp.load({"dataloader": resumed}, checkpoint_id=str(folder / "titan"))
after = list(resumed)
print(f"torchtitan protocol: {len(before)} batches, DCP checkpoint, {len(after)} after")
assert ids(before) + ids(after) == ids(list(titan_data()))
