"""Real torchrun jobs (gloo, CPU) that stop mid-epoch and resume on another topology.

Three jobs run ``tests/elastic_job.py`` one after the other (see its doc for the phases):

1. 2 ranks: a run stopped in epoch 0 (no workers), and one stopped in epoch 0 with
   1 DataLoader worker per rank; each saves per-rank ``dp.save_checkpoint`` files and a
   DCP checkpoint with the Loader as ``"data"``.
2. 3 ranks: resumes the first (2 -> 3 ranks), from the files and from DCP; then a run
   of its own stopped in epoch 1.
3. 2 ranks: resumes that (3 -> 2 ranks), and the worker run with 2 workers per rank
   (1 -> 2 workers), each from the files and from DCP.

A job that does not end in time is killed and fails its test (no hang). The checks:
what the old ranks consumed before the stop plus what the new ranks consumed after it is
every sample of the epoch exactly once, minus what even_batches dropped at the end (each
new rank's stream without even_batches, read from the same state, starts with its even
stream; the rest is what the UnevenDataWarning reports); no sample on two ranks; every
rank takes the same number of steps; the epoch after the resumed one is a fresh epoch of
the new topology; the DCP checkpoint and the files merge into the same state, here, in a
process with no process group, and the two resumes of one stop consume the same streams
and end with the same model.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torchrun_jobs import COLLECTIVE_S, flat, reported_drops, torchrun, write_data

import datapipes as dp
from datapipes.checkpoint.dcp import load_dcp_states

pytestmark = pytest.mark.slow  # every test reads what torchrun jobs wrote

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "elastic_job.py"
SIZES = [23, 61, 17, 35, 48, 29, 52, 19, 41, 30]  # records per file: uneven ranks
EPOCHS = 2
SHARED = {"data": "data/*.jsonl", "seed": 7, "batch": 4, "buffer": 8, "epochs": EPOCHS}

Steps = list[list[int]]  # the sample ids of each step (batch) of one epoch on one rank


@dataclass(frozen=True)
class Stop:
    name: str  # the phase
    nproc: int
    workers: int
    epoch: int
    step: int


STOPS = {
    s.name: s
    for s in [
        Stop("stop2", nproc=2, workers=0, epoch=0, step=9),
        Stop("stop2w1", nproc=2, workers=1, epoch=0, step=7),
        Stop("stop3", nproc=3, workers=0, epoch=1, step=5),
    ]
}


@dataclass(frozen=True)
class Case:
    name: str  # the resume phase
    stop: str  # the phase it resumes
    nproc: int
    workers: int
    via: str  # "files" or "dcp"


CASES = [
    Case("from2_files", "stop2", 3, 0, "files"),
    Case("from2_dcp", "stop2", 3, 0, "dcp"),
    Case("from3_files", "stop3", 2, 0, "files"),
    Case("from3_dcp", "stop3", 2, 0, "dcp"),
    Case("from2w1_files", "stop2w1", 2, 2, "files"),
    Case("from2w1_dcp", "stop2w1", 2, 2, "dcp"),
]
CASE_IDS = {
    "from2_files": "2->3 ranks, torch.save files",
    "from2_dcp": "2->3 ranks, DCP",
    "from3_files": "3->2 ranks, torch.save files",
    "from3_dcp": "3->2 ranks, DCP",
    "from2w1_files": "1->2 workers, torch.save files",
    "from2w1_dcp": "1->2 workers, DCP",
}


def stop_phase(stop: Stop) -> dict[str, Any]:
    return {
        "name": stop.name,
        "mode": "stop",
        "workers": stop.workers,
        "stop_epoch": stop.epoch,
        "stop_step": stop.step,
        "ckpt": f"{stop.name}/ckpt",
        "dcp": f"{stop.name}/dcp",
    }


def resume_phase(case: Case) -> dict[str, Any]:
    return {
        "name": case.name,
        "mode": f"resume_{case.via}",
        "workers": case.workers,
        "ckpt": f"{case.stop}/ckpt",
        "dcp": f"{case.stop}/dcp",
    }


# ----- running the jobs -----------------------------------------------------------------------


@dataclass
class Job:
    ranks: list[dict[str, Any]]  # rank<R>.json of each rank, in rank order
    stderr: str


def run_job(root: Path, name: str, nproc: int, phases: list[dict[str, Any]]) -> Job:
    """elastic_job.py under torchrun with ``nproc`` ranks in ``root``; fails on error or hang.

    The paths in the config are relative to ``root`` (as test_distributed's jobs do).
    """
    out = root / name
    out.mkdir(parents=True)
    config_path = out / "config.json"
    config = {"collective_s": COLLECTIVE_S, **SHARED, "phases": phases, "out": str(out)}
    config_path.write_text(json.dumps(config))
    stdout, stderr = torchrun(JOB, config_path, nproc, root, f"the {nproc}-rank job {name}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    assert [r["world_size"] for r in ranks] == [nproc] * nproc
    return Job(ranks, stdout + stderr)


@dataclass
class Runs:
    root: Path
    dataset: list[int]
    phases: dict[str, list[dict[str, Any]]]  # phase name -> each rank's result
    stderr: dict[str, str]  # phase name -> the stderr of the job that ran it


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("elastic")
    dataset = write_data(root / "data", SIZES)
    plan = [
        ("first", 2, [STOPS["stop2"], STOPS["stop2w1"]]),
        ("second", 3, [*(c for c in CASES if c.stop == "stop2"), STOPS["stop3"]]),
        ("third", 2, [c for c in CASES if c.stop in ("stop3", "stop2w1")]),
    ]
    phases: dict[str, list[dict[str, Any]]] = {}
    stderr: dict[str, str] = {}
    for name, nproc, steps in plan:
        configs = [stop_phase(s) if isinstance(s, Stop) else resume_phase(s) for s in steps]
        job = run_job(root, name, nproc, configs)
        for step in steps:
            phases[step.name] = [r[step.name] for r in job.ranks]
            stderr[step.name] = job.stderr
    return Runs(root, dataset, phases, stderr)


def epoch_steps(run: list[dict[str, Any]], epoch: int) -> list[Steps]:
    return [r["epochs"].get(str(epoch), []) for r in run]


def uneven_steps(runs: Runs, case: Case, epoch: int) -> list[Steps]:
    found = []
    for rank, result in enumerate(runs.phases[case.name]):
        uneven = result["uneven"]
        assert "refused" not in uneven, (
            f"rank {rank}: the merged state was refused by a Loader with even_batches=False: "
            f"{uneven['refused']}"
        )
        found.append(uneven[str(epoch)])
    return found


def assert_once(per_rank: list[Steps], what: str) -> list[int]:
    """No id twice (on one rank or on two); returns them all."""
    seen = [i for steps in per_rank for i in flat(steps)]
    twice = sorted(i for i, n in Counter(seen).items() if n > 1)
    assert twice == [], f"{what}: samples consumed twice: {twice[:20]}"
    return seen


case_params = pytest.mark.parametrize("case", CASES, ids=[CASE_IDS[c.name] for c in CASES])


# ----- the jobs ran as asked ------------------------------------------------------------------


@case_params
def test_the_new_job_runs_on_the_new_topology(runs: Runs, case: Case):
    stop = STOPS[case.stop]
    resumed = runs.phases[case.name]
    assert [r["topology"] for r in resumed] == [[r, case.nproc] for r in range(case.nproc)]
    assert all(r["even_batches"] for r in resumed)
    assert {r["first_epoch"] for r in resumed} == {stop.epoch}  # resumed the stopped epoch
    stopped = runs.phases[case.stop]
    assert [len(s) for s in epoch_steps(stopped, stop.epoch)] == [stop.step] * stop.nproc


def test_a_state_taken_on_rank_0_alone_does_not_hang_the_others(runs: Runs):
    for stop in STOPS.values():
        took = [r.get("rank_0_alone_took_a_state") for r in runs.phases[stop.name]]
        assert took == [stop.epoch] + [None] * (stop.nproc - 1)  # and the job went on


# ----- exactly once -----------------------------------------------------------------------


@case_params
def test_before_and_after_without_even_batches_is_the_epoch_exactly_once(runs: Runs, case: Case):
    """Read without even_batches (nothing dropped), the new ranks deliver the rest exactly."""
    epoch = STOPS[case.stop].epoch
    before = epoch_steps(runs.phases[case.stop], epoch)
    after = uneven_steps(runs, case, epoch)
    seen = assert_once(before + after, case.name)
    missing = sorted(set(runs.dataset) - set(seen))
    assert missing == [], f"{len(missing)} samples lost: {missing[:20]}"
    assert all(after), "a new rank got nothing to read"


@case_params
def test_even_batches_drops_only_what_its_warning_reports(runs: Runs, case: Case):
    """Before + after with even_batches = the epoch minus each new rank's reported tail."""
    epoch = STOPS[case.stop].epoch
    before = epoch_steps(runs.phases[case.stop], epoch)
    even = epoch_steps(runs.phases[case.name], epoch)
    uneven = uneven_steps(runs, case, epoch)
    seen = assert_once(before + even, case.name)
    expected_drops = {}
    dropped_ids: list[int] = []
    for rank in range(case.nproc):
        # the same deal with and without even_batches: the even stream is its start
        assert even[rank] == uneven[rank][: len(even[rank])], f"rank {rank}"
        tail = uneven[rank][len(even[rank]) :]
        if tail:
            expected_drops[rank] = len(tail)
        dropped_ids += flat(tail)
    assert sorted(set(runs.dataset) - set(seen)) == sorted(dropped_ids)
    reported = reported_drops(runs.stderr[case.name], case.name)
    assert {rank: n for (rank, e), (n, _) in reported.items() if e == epoch} == expected_drops


def test_the_data_is_uneven_enough_that_even_batches_drops(runs: Runs):
    """So the drop checks above are not vacuous: resumed epochs did drop batches."""
    dropping = []
    for case in CASES:
        reported = reported_drops(runs.stderr[case.name], case.name)
        if any(epoch == STOPS[case.stop].epoch for _, epoch in reported):
            dropping.append(case.name)
    assert len(dropping) >= 2, dropping


@case_params
def test_every_new_rank_takes_the_same_number_of_steps(runs: Runs, case: Case):
    for epoch in range(STOPS[case.stop].epoch, EPOCHS):
        counts = [len(s) for s in epoch_steps(runs.phases[case.name], epoch)]
        assert len(set(counts)) == 1, f"epoch {epoch}: steps per rank {counts}"
        assert counts[0] > 0


@case_params
def test_the_epoch_after_is_a_fresh_epoch_of_the_new_topology(runs: Runs, case: Case):
    epoch = STOPS[case.stop].epoch + 1
    if epoch >= EPOCHS:
        pytest.skip("stopped in the last epoch")
    even = epoch_steps(runs.phases[case.name], epoch)
    fresh = uneven_steps(runs, case, epoch)  # a new Loader's epoch, without even_batches
    assert sorted(assert_once(fresh, case.name)) == runs.dataset
    shortest = min(len(steps) for steps in fresh)
    assert even == [steps[:shortest] for steps in fresh]
    reported = reported_drops(runs.stderr[case.name], case.name)
    expected = {r: len(s) - shortest for r, s in enumerate(fresh) if len(s) > shortest}
    assert {rank: n for (rank, e), (n, _) in reported.items() if e == epoch} == expected


@case_params
def test_the_new_ranks_train_one_model(runs: Runs, case: Case):
    resumed = runs.phases[case.name]
    assert all(r["params"] == resumed[0]["params"] for r in resumed)  # DDP kept them in step
    assert resumed[0]["params"] != runs.phases[case.stop][0]["params"]  # and trained on


# ----- the checkpoints ----------------------------------------------------------------------


@pytest.mark.parametrize("stop", list(STOPS))
def test_dcp_and_the_files_merge_into_the_same_state(runs: Runs, stop: str):
    """Here, without a process group: DCP's entries and every rank's file say the same."""
    folder = runs.root / stop
    files = sorted((folder / "ckpt").glob("rank*.pt"))
    assert len(files) == STOPS[stop].nproc
    from_files = dp.merge_states([dp.load_checkpoint(f)["loader"] for f in files])
    assert load_dcp_states(folder / "dcp") == from_files
    assert load_dcp_states(folder / "dcp", key="data") == from_files


@pytest.mark.parametrize("stop", list(STOPS))
def test_the_files_and_dcp_resumes_train_alike(runs: Runs, stop: str):
    """Both resumes of one stop get the same merged state: the same deal, the same model."""
    files, via_dcp = (
        next(c.name for c in CASES if c.stop == stop and c.via == v) for v in ("files", "dcp")
    )
    for a, b in zip(runs.phases[files], runs.phases[via_dcp], strict=True):
        assert a["epochs"] == b["epochs"]
        for x, y in zip(a["params"], b["params"], strict=True):
            assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-6)
