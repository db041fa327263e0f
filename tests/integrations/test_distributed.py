"""Real torch.distributed jobs (gloo, CPU) started by torchrun: DDP training over a Loader.

Each job runs ``tests/distributed_job.py`` under ``python -m torch.distributed.run
--standalone`` (torchrun picks a free port) in a new process group; a job that does
not finish in time is killed and fails its test, so a hang never blocks the suite.
Every rank writes the sample ids it consumed, per epoch and per step, and the tests
check them against the data written here:

* within an epoch no sample reaches two ranks or one rank twice;
* every rank takes the same number of steps (even_batches, on by default under
  torch.distributed), the extra batches of the fuller ranks are dropped, and the
  UnevenDataWarning on stderr names exactly those; dropped + consumed = the data;
* without even_batches the same ranks get different numbers of batches (the data
  is uneven) and together read every sample once;
* a job stopped mid-epoch and resumed from its checkpoint in a new job consumes
  the same stream, rank by rank and step by step, as an uninterrupted job, and
  ends with the same model; so does one resumed from a torch.distributed.checkpoint
  (DCP) that all ranks saved together with the Loader as an entry, which holds every
  rank's position under its own key and gives each rank its own back;
* with a DeviceMesh, tensor-parallel peers read identical data and the
  data-parallel ranks split it.

The last section forks two gloo ranks itself (no torchrun) to check when a Loader made
before ``init_process_group`` decides even_batches, and that it makes one gloo group.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from subprocess_helpers import run_forked_ranks
from torchrun_jobs import (
    COLLECTIVE_S,
    TEARDOWN_ABORT,
    Job,
    Steps,
    aborted_in_teardown,
    assert_no_sample_twice,
    flat,
    reported_drops,
    torchrun,
    write_data,
)

import datapipes as dp

pytestmark = pytest.mark.slow  # every test runs a torchrun job or forks gloo ranks

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "distributed_job.py"


def run_job(root: Path, name: str, nproc: int, config: dict[str, Any]) -> Job:
    """Run distributed_job.py under torchrun with ``nproc`` ranks in ``root``; fail on error
    or hang. Paths in ``config`` are relative to ``root``: the file-shuffle order depends on
    the glob as written, so a relative one makes every run of the tests see the same orders.
    """
    folder = root / name
    out = folder / "out"
    out.mkdir(parents=True)
    config_path = folder / "config.json"
    config_path.write_text(json.dumps({"collective_s": COLLECTIVE_S, **config, "out": str(out)}))
    stdout, stderr = torchrun(
        JOB, config_path, nproc, root, f"the {nproc}-rank job ({config['mode']})"
    )
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    assert [r["rank"] for r in ranks] == list(range(nproc))
    assert all(r["world_size"] == nproc for r in ranks)
    return Job(ranks, stdout + stderr)


# ----- DDP training: full, stopped, resumed -----------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    nproc: int  # ranks
    workers: int  # DataLoader worker processes per rank
    sizes: tuple[int, ...]  # records per file
    batch: int
    stop: tuple[int, int]  # (epoch, steps): the stopped job stops after `steps` of `epoch`
    dcp: bool = True  # also save a DCP checkpoint there and resume from it (same jobs)


CASES = [
    # One big file: whichever rank gets it has more batches than the others in every
    # file order, and every rank has more batches than the stop step (files are dealt
    # whole, round robin, so each rank gets at least 3 of the small ones).
    Case("2 ranks, in process", 2, 0, (8, 9, 70, 10, 11, 12, 13), 4, stop=(0, 3)),
    Case("3 ranks, 1 worker", 3, 1, (7, 60, 8, 9, 10, 11, 12, 13, 14), 3, stop=(1, 2)),
]
EPOCHS = 2


@dataclass
class Runs:
    case: Case
    dataset: list[int]
    full: list[dict[str, Any]]  # per rank: the uninterrupted run (first half of one job)
    stop: list[dict[str, Any]]  # per rank: the run stopped mid-epoch (second half)
    resume: list[dict[str, Any]]  # per rank: the run resumed from the checkpoint (a new job)
    # per rank: resumed from the DCP checkpoint (second half of the resume job); [] without
    dcp_resume: list[dict[str, Any]]
    stderr: str  # of the full+stop job
    resume_stderr: str
    root: Path  # ckpt/ckpt-rank<R>.pt, dcp/ (the DCP checkpoint)


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    case: Case = request.param
    root = tmp_path_factory.mktemp("ddp")
    dataset = write_data(root / "data", list(case.sizes))
    config = {
        "data": "data/*.jsonl",
        "ckpt": "ckpt",
        "seed": 7,
        "batch": case.batch,
        "workers": case.workers,
        "epochs": EPOCHS,
        "stop_epoch": case.stop[0],
        "stop_step": case.stop[1],
        **({"dcp": "dcp"} if case.dcp else {}),
    }
    first = run_job(root, "full+stop", case.nproc, {**config, "mode": "full+stop"})
    assert sorted(p.name for p in (root / "ckpt").iterdir()) == [
        f"ckpt-rank{r}.pt" for r in range(case.nproc)
    ]
    second = run_job(root, "resume", case.nproc, {**config, "mode": "resume"})
    return Runs(
        case,
        dataset,
        full=[r["full"] for r in first.ranks],
        stop=[r["stop"] for r in first.ranks],
        resume=[r["resume"] for r in second.ranks],
        dcp_resume=[r["dcp_resume"] for r in second.ranks] if case.dcp else [],
        stderr=first.stderr,
        resume_stderr=second.stderr,
        root=root,
    )


def epoch_steps(run: list[dict[str, Any]], epoch: int) -> list[Steps]:
    return [r["epochs"].get(str(epoch), []) for r in run]


def test_ranks_come_from_torch_distributed(runs: Runs):
    n = runs.case.nproc
    for run in (runs.full, runs.stop, runs.resume):
        assert [r["loader_topology"] for r in run] == [[r, n] for r in range(n)]


def test_no_sample_reaches_two_ranks_or_one_rank_twice(runs: Runs):
    for epoch in range(EPOCHS):
        assert_no_sample_twice(epoch_steps(runs.full, epoch), runs.dataset)
        combined = [
            a + b for a, b in zip(epoch_steps(runs.stop, epoch), epoch_steps(runs.resume, epoch))
        ]
        assert_no_sample_twice(combined, runs.dataset)


def test_every_rank_takes_the_same_number_of_steps(runs: Runs):
    for name, run in [("full", runs.full), ("stop", runs.stop), ("resume", runs.resume)]:
        for epoch in range(EPOCHS):
            steps = [len(s) for s in epoch_steps(run, epoch)]
            assert len(set(steps)) == 1, f"{name}, epoch {epoch}: steps per rank {steps}"
    assert all(len(s) > 0 for e in range(EPOCHS) for s in epoch_steps(runs.full, e))


def test_without_even_batches_ranks_get_different_numbers_of_batches(runs: Runs):
    """The data really is uneven: read without even_batches, the ranks' batch counts differ."""
    counts = []
    for epoch in range(EPOCHS):
        per_rank = [r["uneven"][str(epoch)] for r in runs.full]
        seen = assert_no_sample_twice(per_rank, runs.dataset)
        assert sorted(seen) == runs.dataset  # together, every sample once
        counts.append([len(steps) for steps in per_rank])
    assert any(len(set(c)) > 1 for c in counts), f"batches per rank and epoch: {counts}"
    assert "[uneven]" not in runs.stderr  # nothing dropped, nothing warned


def test_dropped_samples_are_the_ones_the_warning_reports(runs: Runs):
    """Each rank's even stream is the start of its uneven one; the warning names the rest."""
    expected_warnings = {}
    total_dropped = 0
    for epoch in range(EPOCHS):
        even = epoch_steps(runs.full, epoch)
        uneven = [r["uneven"][str(epoch)] for r in runs.full]
        fewest = min(len(steps) for steps in uneven)
        consumed = dropped = 0
        for rank in range(runs.case.nproc):
            assert even[rank] == uneven[rank][:fewest], f"rank {rank}, epoch {epoch}"
            extra = uneven[rank][fewest:]
            if extra:
                expected_warnings[(rank, epoch)] = (len(extra), fewest)
            consumed += len(flat(even[rank]))
            dropped += len(flat(extra))
        assert consumed + dropped == len(runs.dataset), f"epoch {epoch}"
        total_dropped += dropped
    assert reported_drops(runs.stderr, "full") == expected_warnings
    assert total_dropped > 0  # the case is uneven enough to drop something
    # a stopped and resumed epoch drops, and reports, the same batches at its end
    stop_epoch = runs.case.stop[0]
    stop = reported_drops(runs.stderr, "stop")
    resume = reported_drops(runs.resume_stderr, "resume")
    assert stop == {k: v for k, v in expected_warnings.items() if k[1] < stop_epoch}
    assert resume == {k: v for k, v in expected_warnings.items() if k[1] >= stop_epoch}


def test_stop_and_resume_consume_the_uninterrupted_stream(runs: Runs):
    stop_epoch, stop_step = runs.case.stop
    for epoch in range(EPOCHS):
        full = epoch_steps(runs.full, epoch)
        stopped = epoch_steps(runs.stop, epoch)
        resumed = epoch_steps(runs.resume, epoch)
        for rank in range(runs.case.nproc):
            if epoch < stop_epoch:
                assert stopped[rank] == full[rank] and resumed[rank] == []
            elif epoch == stop_epoch:
                # really stopped mid-epoch, and the resumed job went on from there
                assert len(stopped[rank]) == stop_step < len(full[rank])
                assert stopped[rank] + resumed[rank] == full[rank], f"rank {rank}, epoch {epoch}"
            else:
                assert stopped[rank] == [] and resumed[rank] == full[rank]


def test_resumed_training_ends_with_the_uninterrupted_model(runs: Runs):
    for full, resumed in zip(runs.full, runs.resume):
        for a, b in zip(full["params"], resumed["params"], strict=True):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-6)
    # DDP kept the replicas identical, and training moved them
    assert all(r["params"] == runs.full[0]["params"] for r in runs.full)
    assert runs.full[0]["params"] != runs.stop[0]["params"]


# ----- torch.distributed.checkpoint ---------------------------------------------------------


@pytest.fixture
def dcp_runs(runs: Runs) -> Runs:
    if not runs.case.dcp:
        pytest.skip("this case saves no DCP checkpoint")
    return runs


def test_dcp_checkpoint_holds_every_ranks_position_under_its_own_key(dcp_runs: Runs):
    from torch.distributed.checkpoint import FileSystemReader

    keys = set(FileSystemReader(dcp_runs.root / "dcp").read_metadata().state_dict_metadata)
    n = dcp_runs.case.nproc
    for rank in range(n):
        assert {f"data.ranks.{rank}.node", f"data.ranks.{rank}.epoch"} <= keys, sorted(keys)
    assert {k.split(".")[2] for k in keys if k.startswith("data.ranks.")} == set(map(str, range(n)))
    # the shared fields once, and the model and optimizer next to the data
    shared = {"version", "fingerprint", "steps", "seed", "topology.world_size"}
    assert {f"data.{k}" for k in shared} <= keys
    assert {"model.module.weight", "model.module.bias"} <= keys
    assert any(k.startswith("optim.param_groups.") for k in keys)


def test_dcp_checkpoint_holds_the_same_positions_as_the_per_rank_ones(dcp_runs: Runs):
    """Written out as one torch.save file, the DCP checkpoint's ``data`` is every rank's
    Loader state merged into one ``ranks`` dict: rank R's entry is what rank R saved."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    merged_path = dcp_runs.root / "dcp-merged.pt"
    if not merged_path.exists():
        dcp_to_torch_save(dcp_runs.root / "dcp", merged_path)
    merged = torch.load(merged_path, weights_only=False)
    per_rank = [
        torch.load(dcp_runs.root / "ckpt" / f"ckpt-rank{r}.pt", weights_only=True)["loader"]
        for r in range(dcp_runs.case.nproc)
    ]
    data = merged["data"]
    assert data["ranks"] == {str(r): s["ranks"][str(r)] for r, s in enumerate(per_rank)}
    for state in per_rank:
        assert {k: v for k, v in data.items() if k != "ranks"} == {
            k: v for k, v in state.items() if k != "ranks"
        }


def test_each_rank_gets_its_own_position_back_from_dcp(dcp_runs: Runs):
    n = dcp_runs.case.nproc
    saved = [
        torch.load(dcp_runs.root / "ckpt" / f"ckpt-rank{r}.pt", weights_only=True)["loader"]
        for r in range(n)
    ]
    positions = [s["ranks"][str(r)] for r, s in enumerate(saved)]
    # the ranks' positions differ, so getting another rank's would show
    assert len({json.dumps(p, sort_keys=True) for p in positions}) == n
    assert all(p["node"] is not None for p in positions)  # stopped mid-epoch
    for rank, run in enumerate(dcp_runs.dcp_resume):
        loaded = run["loaded_position"]
        assert list(loaded["ranks"]) == [str(rank)]
        mine = loaded["ranks"][str(rank)]
        assert mine["epoch"] == positions[rank]["epoch"] == dcp_runs.case.stop[0]
        assert json.loads(mine["node"]) == json.loads(positions[rank]["node"]), f"rank {rank}"


def test_dcp_stop_and_resume_consume_the_uninterrupted_stream(dcp_runs: Runs):
    stop_epoch, stop_step = dcp_runs.case.stop
    n = dcp_runs.case.nproc
    assert [r["loader_topology"] for r in dcp_runs.dcp_resume] == [[r, n] for r in range(n)]
    for epoch in range(EPOCHS):
        full = epoch_steps(dcp_runs.full, epoch)
        stopped = epoch_steps(dcp_runs.stop, epoch)
        resumed = epoch_steps(dcp_runs.dcp_resume, epoch)
        assert len({len(steps) for steps in resumed}) == 1  # even_batches still on
        for rank in range(n):
            where = f"rank {rank}, epoch {epoch}"
            if epoch < stop_epoch:
                assert resumed[rank] == [], where
            elif epoch == stop_epoch:
                assert len(stopped[rank]) == stop_step < len(full[rank]), where
                assert stopped[rank] + resumed[rank] == full[rank], where
            else:
                assert resumed[rank] == full[rank], where
    # its end-of-epoch drops are reported as the uninterrupted run reported them
    expected = {
        k: v for k, v in reported_drops(dcp_runs.stderr, "full").items() if k[1] >= stop_epoch
    }
    assert reported_drops(dcp_runs.resume_stderr, "dcp_resume") == expected


def test_dcp_resumed_training_ends_with_the_uninterrupted_model(dcp_runs: Runs):
    for full, resumed in zip(dcp_runs.full, dcp_runs.dcp_resume, strict=True):
        for a, b in zip(full["params"], resumed["params"], strict=True):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-6)


# ----- DeviceMesh ranks ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def mesh_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Job, list[int]]:
    root = tmp_path_factory.mktemp("mesh")
    dataset = write_data(root / "data", [5, 6, 50, 7, 8, 9])  # the dp group with 50 has more
    config = {
        "mode": "mesh",
        "data": "data/*.jsonl",
        "seed": 3,
        "batch": 4,
        "workers": 1,
        "epochs": EPOCHS,
    }
    return run_job(root, "job", 4, config), dataset


def test_tensor_parallel_peers_read_the_same_data_dp_groups_split_it(mesh_job):
    job, dataset = mesh_job
    groups: dict[int, list[dict[str, Any]]] = {}
    for r in job.ranks:
        coordinates = r["mesh_coordinates"]
        assert r["dp"]["topology"] == [coordinates["dp"], 2]
        groups.setdefault(coordinates["dp"], []).append(r)
    assert sorted(groups) == [0, 1] and all(len(g) == 2 for g in groups.values())
    for epoch in map(str, range(EPOCHS)):
        for peers in groups.values():  # the two ranks of one tp group: identical batches
            assert peers[0]["dp"]["epochs"][epoch] == peers[1]["dp"]["epochs"][epoch]
            assert peers[0]["dp"]["epochs"][epoch] != []
        per_group = [groups[g][0]["dp"]["epochs"][epoch] for g in (0, 1)]
        assert sorted(assert_no_sample_twice(per_group, dataset)) == dataset


@pytest.mark.parametrize("dims", ["replicate,shard", "shard,replicate"])
def test_two_data_parallel_mesh_dims_make_four_disjoint_ranks(mesh_job, dims: str):
    job, dataset = mesh_job
    first, second = dims.split(",")
    by_dp_rank = {}
    for r in job.ranks:
        coordinates = r["mesh_coordinates"]
        expected_rank = coordinates[first] * 2 + coordinates[second]  # row-major, as given
        assert r[dims]["topology"] == [expected_rank, 4]
        by_dp_rank[expected_rank] = r[dims]["epochs"]
    assert sorted(by_dp_rank) == [0, 1, 2, 3]
    for epoch in map(str, range(EPOCHS)):
        per_rank = [by_dp_rank[k][epoch] for k in range(4)]
        assert sorted(assert_no_sample_twice(per_rank, dataset)) == dataset
        # the data-parallel rank alone decides the data, however the mesh dims map to it
        other = "shard,replicate" if dims == "replicate,shard" else "replicate,shard"
        for r in job.ranks:
            assert r[other]["epochs"][epoch] == by_dp_rank[r[other]["topology"][0]][epoch]


def test_even_batches_over_a_mesh_stop_all_ranks_together(mesh_job):
    job, dataset = mesh_job
    even = [r["dp even"]["epochs"]["0"] for r in job.ranks]
    assert len({len(steps) for steps in even}) == 1
    for r, steps in zip(job.ranks, even):
        uneven = r["dp"]["epochs"]["0"]
        assert steps == uneven[: len(steps)]  # the start of the same stream
    uneven_counts = {len(r["dp"]["epochs"]["0"]) for r in job.ranks}
    assert len(even[0]) == min(uneven_counts) and len(uneven_counts) > 1


# ----- even_batches decided lazily (gloo ranks forked by the test, no torchrun) --------------


def _rank_job(rank: int, store: str, mode: str, answers) -> None:
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE="2")  # what torchrun sets
    try:
        pipe = dp.range(13).batch(2)  # rank 0 has 4 batches, rank 1 has 3
        loader = dp.Loader(pipe)  # before init_process_group
        if mode == "state_dict_before_init":
            loader.state_dict()  # e.g. logged or saved during setup
        elif mode == "load_before_init":
            saved = dp.Loader(pipe, rank=rank, world_size=2, even_batches=True)
            loader.load_state_dict(saved.state_dict())
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        try:
            if mode == "state_dict_on_rank_0_only" and rank == 0:
                loader.state_dict()  # after init, before the first epoch: no collective
            answers.put((rank, loader.even_batches, len(list(loader))))
        finally:
            dist.destroy_process_group()
    except Exception as error:  # noqa: BLE001 - reported to the test
        answers.put((rank, "error", f"{type(error).__name__}: {error}"[:400]))


def _run_ranks(tmp_path: Path, mode: str) -> list[tuple[Any, ...]]:
    return run_forked_ranks(_rank_job, tmp_path / "store", mode)


@pytest.mark.timeout(120)
def test_a_state_dict_taken_before_init_process_group_does_not_fix_uneven_epochs(tmp_path):
    """A checkpoint/log before init must not decide even_batches=False (DDP would hang)."""
    assert _run_ranks(tmp_path, "state_dict_before_init") == [(0, True, 3), (1, True, 3)]


@pytest.mark.timeout(120)
def test_an_even_checkpoint_loads_into_a_loader_made_before_init_process_group(tmp_path):
    """load_state_dict of an even_batches=True checkpoint before init is accepted, and evens."""
    assert _run_ranks(tmp_path, "load_before_init") == [(0, True, 3), (1, True, 3)]


@pytest.mark.timeout(120)
def test_a_state_dict_on_one_rank_before_the_first_epoch_runs_no_collective(tmp_path):
    """Checked, holds: only rank 0 asks for a state before the first epoch; nothing hangs."""
    assert _run_ranks(tmp_path, "state_dict_on_rank_0_only") == [(0, True, 3), (1, True, 3)]


def _close_each_epoch_job(rank: int, store: str, answers) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
        made = []
        real_new_group = dist.new_group

        def counting_new_group(*args: Any, **kwargs: Any) -> Any:
            made.append(kwargs.get("backend"))
            return real_new_group(*args, **kwargs)

        dist.new_group = counting_new_group
        dist.get_backend = lambda group=None: "nccl"  # as in a job training with NCCL
        loader = dp.Loader(dp.range(12).batch(2))
        for _ in range(3):
            with loader:  # closes the Loader after each epoch (frees workers, files)
                count = len(list(loader))
        answers.put((rank, count, len(made)))
        dist.destroy_process_group()
    except Exception as error:  # noqa: BLE001 - reported to the test
        answers.put((rank, "error", f"{type(error).__name__}: {error}"[:400]))


@pytest.mark.timeout(120)
def test_even_batches_makes_one_gloo_group_per_loader_not_one_per_rebuild(tmp_path):
    """Under NCCL the agreement's gloo group is made once per Loader; close() must not leak one."""
    results = run_forked_ranks(_close_each_epoch_job, tmp_path / "s")
    assert results == [(0, 3, 1), (1, 3, 1)]  # 3 epochs, each rank made 1 gloo group


def test_only_a_teardown_abort_after_every_rank_wrote_its_results_is_tolerated(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"out": str(out)}))
    (out / "rank0.json").write_text("{}")
    abort = f"... {TEARDOWN_ABORT}\n... exitcode: -6"
    assert not aborted_in_teardown(abort, config, 2)  # rank 1 wrote nothing: a real failure
    (out / "rank1.json").write_text("{}")
    assert aborted_in_teardown(abort, config, 2)
    assert not aborted_in_teardown("RuntimeError: Timed out waiting", config, 2)
