"""dp.TrainerLoader: a Loader inside a trainer, resumed through the trainer's own checkpoint.

The fast tests check the three answers (batches fetched ahead, ``iter()`` that starts
nothing, a state gathered from every rank) on the Loader alone; the slow ones run real
PyTorch Lightning, HF Accelerate and HF Trainer jobs (1 process, and 2 ranks over gloo; 0 and 2
DataLoader workers) that stop mid-epoch with a checkpoint and resume from it in new
processes, through the trainer's own checkpointing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers import run_gloo_ranks
from torchrun_jobs import TEARDOWN_ABORT

import datapipes as dp

JOBS = Path(__file__).resolve().parents[1] / "trainer_jobs"
ROOT = Path(__file__).resolve().parents[2]


def batches(pipe: dp.DataPipe[Any], **options: Any) -> dp.TrainerLoader:
    return dp.TrainerLoader(dp.Loader(pipe, seed=1, **options), fetched_ahead=1)


def as_lists(items: Any) -> list[Any]:
    return [b.tolist() for b in items]


# ----- fast: the answers, on the Loader alone --------------------------------------------


@pytest.mark.parametrize("ahead", [0, 1, 2])
@pytest.mark.parametrize("used", [0, 1, 3, 5])
def test_the_state_counts_the_batches_used_not_those_fetched_ahead(ahead, used):
    pipe = dp.range(24).shuffle().batch(4)
    whole = as_lists(dp.Loader(pipe, seed=1))
    data = dp.TrainerLoader(dp.Loader(pipe, seed=1), fetched_ahead=ahead)
    it = iter(data)
    if used + ahead <= 6:
        fetched, done = [next(it) for _ in range(used + ahead)], used  # the trainer's fetcher
    else:  # the fetcher met the end: the trainer uses every batch before it saves
        fetched, done = list(it), 6
    assert as_lists(fetched) == whole[: len(fetched)]
    state = json.loads(json.dumps(data.state_dict()))
    resumed = dp.TrainerLoader(dp.Loader(pipe, seed=1), fetched_ahead=ahead)
    resumed.load_state_dict(state)
    if done == 6:  # the next epoch, from its start
        assert resumed.loader.epoch == 1 and len(as_lists(resumed)) == 6
    else:
        assert as_lists(resumed) == whole[done:]


def test_iter_starts_nothing_until_a_batch_is_asked_for():
    loader = dp.Loader(dp.range(10).batch(5), seed=1)
    data = dp.TrainerLoader(loader, fetched_ahead=1)
    for _ in range(3):
        iter(data)  # Lightning looks at the loader this way, and throws the iterator away
    assert loader.epoch == 0 and loader._graph.root is None  # no epoch begun, no graph built
    assert as_lists(data) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert as_lists(data) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # the next epoch
    assert loader.epoch == 2


def test_a_state_loaded_before_iterating_is_the_state_given_back():
    pipe = dp.range(12).batch(3)
    data = batches(pipe)
    it = iter(data)
    next(it), next(it), next(it)
    state = data.state_dict()
    again = batches(pipe)
    again.load_state_dict(state)
    iter(again)  # looked at, nothing read
    assert again.state_dict() == state


def test_a_wrong_argument_is_refused_with_its_name():
    with pytest.raises(TypeError, match="dp.Loader"):
        dp.TrainerLoader(dp.range(3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fetched_ahead"):
        dp.TrainerLoader(dp.Loader(dp.range(3)), fetched_ahead=-1)
    with pytest.raises(TypeError, match="fetched_ahead"):
        dp.TrainerLoader(dp.Loader(dp.range(3)), fetched_ahead=True)


def test_one_rank_of_a_group_of_one_does_not_gather(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 's'}", rank=0, world_size=1)
    try:
        data = batches(dp.range(8).batch(2))
        it = iter(data)
        next(it), next(it)
        state = data.state_dict()
        assert state == data.loader.state_dict() or "ranks" in state
    finally:
        dist.destroy_process_group()


def _gather_rank(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    try:
        data = batches(dp.range(40).shuffle().batch(2))
        it = iter(data)
        for _ in range(3 + 2 * rank):  # the ranks stand at different places
            next(it)
        state = data.state_dict()  # collective: every rank's state, merged
        Path(out, f"{rank}.json").write_text(json.dumps(state))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two processes
def test_under_two_ranks_each_rank_saves_every_ranks_state(tmp_path):
    run_gloo_ranks(_gather_rank, 2, tmp_path, timeout=120)
    states = [json.loads(Path(tmp_path, f"{r}.json").read_text()) for r in range(2)]
    assert states[0] == states[1]  # rank 0's file alone resumes both ranks
    pipe = dp.range(40).shuffle().batch(2)
    for rank, used in ((0, 2), (1, 4)):  # fetched one more than used
        options = {"rank": rank, "world_size": 2, "even_batches": True}  # as under the group
        whole = as_lists(dp.Loader(pipe, seed=1, **options))
        resumed = dp.Loader(pipe, seed=1, **options)
        resumed.load_state_dict(states[0])
        assert as_lists(resumed) == whole[used:]


# ----- slow: real Lightning jobs ----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_job(script: str, out: Path, *args: str, processes: int = 1) -> None:
    """Run a job of ``tests/trainer_jobs`` in new processes (``processes`` under torchrun)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    launch = [sys.executable]
    if processes > 1:
        launch += ["-m", "torch.distributed.run", f"--nproc-per-node={processes}"]
        launch += [f"--master-port={free_port()}"]
    done = subprocess.run(
        [*launch, str(JOBS / script), str(out), *args],
        env=env, capture_output=True, text=True, timeout=300, cwd=out.parent,
    )  # fmt: skip
    written = all((out / f"rank{rank}.json").exists() for rank in range(processes))
    if done.returncode != 0 and written and TEARDOWN_ABORT in done.stderr:
        # torch's own thread aborting a rank's exit after the job's work (tests/test_distributed)
        warnings.warn(
            f"{script}: a rank aborted in torch's teardown, after its results", stacklevel=2
        )
        return
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def uninterrupted(devices: int, workers: int) -> list[list[list[float]]]:
    """Each rank's batches over the job's epochs, from the Loader itself (no trainer)."""
    sys.path.insert(0, str(JOBS))
    try:
        import common as job
    finally:
        sys.path.remove(str(JOBS))
    pipe = job.recipe()
    out = []
    for rank in range(devices):
        loader = dp.Loader(pipe, seed=job.SEED, rank=rank, world_size=devices, num_workers=workers)
        out.append([b.flatten().tolist() for _ in range(job.EPOCHS) for b in loader])
        loader.close()
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("devices", "workers", "stop"), [(1, 0, 7), (2, 2, 5)])
def test_lightning_resumes_mid_epoch_through_its_checkpoint(tmp_path, devices, workers, stop):
    pytest.importorskip("lightning")
    options = ["--devices", str(devices), "--workers", str(workers)]
    job = "lightning_job.py"
    run_job(job, tmp_path / "stop", *options, "--stop", str(stop))
    run_job(job, tmp_path / "resume", *options, "--resume", str(tmp_path / "stop" / "stop.ckpt"))
    check_resumed(tmp_path, devices, workers, stop)


@pytest.mark.slow
@pytest.mark.parametrize(("processes", "workers", "stop"), [(1, 0, 7), (2, 2, 5)])
def test_accelerate_resumes_mid_epoch_through_save_and_load_state(
    tmp_path, processes, workers, stop
):
    """The TrainerLoader through ``prepare`` (unchanged) and ``register_for_checkpointing``:
    ``save_state`` writes rank 0's gathered state, ``load_state`` gives it to every rank."""
    pytest.importorskip("accelerate")
    job, options = "accelerate_job.py", ["--workers", str(workers)]
    run_job(job, tmp_path / "stop", *options, "--stop", str(stop), processes=processes)
    state = str(tmp_path / "stop" / "state")
    run_job(job, tmp_path / "resume", *options, "--resume", state, processes=processes)
    check_resumed(tmp_path, processes, workers, stop)


@pytest.mark.slow
@pytest.mark.parametrize(("processes", "workers", "stop"), [(1, 0, 7), (2, 2, 5)])
def test_hf_trainer_resumes_mid_epoch_from_its_checkpoint_folder(
    tmp_path, processes, workers, stop
):
    """dp.use_in_hf_trainer: the Loader's state in every checkpoint folder, loaded by
    ``train(resume_from_checkpoint=folder)``; the Trainer neither re-reads nor skips."""
    pytest.importorskip("transformers")
    job, options = "hf_job.py", ["--workers", str(workers)]
    run_job(job, tmp_path / "stop", *options, "--stop", str(stop), processes=processes)
    folder = str(tmp_path / "stop" / f"checkpoint-{stop}")
    run_job(job, tmp_path / "resume", *options, "--resume", folder, processes=processes)
    check_resumed(tmp_path, processes, workers, stop)


def test_hf_trainer_glue_refuses_what_would_skip_or_lose_data(tmp_path):
    transformers = pytest.importorskip("transformers")
    from datapipes.integrations import hf_trainer

    def trainer(**options: Any) -> Any:
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to=[], **options
        )
        return transformers.Trainer(model=torch.nn.Linear(1, 1), args=args)

    data = dp.TrainerLoader(dp.Loader(dp.range(8).batch(2)))
    with pytest.raises(ValueError, match="ignore_data_skip=True"):
        hf_trainer.use_in_hf_trainer(trainer(), data)
    with pytest.raises(TypeError, match="dp.TrainerLoader"):
        hf_trainer.use_in_hf_trainer(trainer(ignore_data_skip=True), data.loader)
    with pytest.raises(FileNotFoundError, match="without the Loader's state"):
        hf_trainer.read_state(tmp_path)
    (tmp_path / hf_trainer.STATE_FILE).write_text('{"version": ')
    with pytest.raises(ValueError, match="damaged JSON"):
        hf_trainer.read_state(tmp_path)


def check_resumed(tmp_path: Path, ranks: int, workers: int, stop: int) -> None:
    """Each rank's batches before the stop and after the resume are the uninterrupted run's."""
    expected = uninterrupted(ranks, workers)
    for rank in range(ranks):
        before = json.loads((tmp_path / "stop" / f"rank{rank}.json").read_text())
        after = json.loads((tmp_path / "resume" / f"rank{rank}.json").read_text())
        assert len(before) == stop  # a step per batch
        assert before + after == expected[rank], f"rank {rank}"
    every = sorted(x for rank in expected for batch in rank for x in batch)
    assert every == sorted([float(i) for i in range(48)] * 2)  # each item once an epoch
