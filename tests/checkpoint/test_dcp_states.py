"""load_dcp_states: a DCP checkpoint's Loader positions, merged over every rank that saved them.

A real multi-rank ``dcp.save`` needs a process group; here the ranks are simulated in one
process by :func:`save_as_ranks`, which takes the steps ``dcp.save`` takes on each rank
and on the coordinator with torch's own planner and writer (every rank plans, the
coordinator makes the global plan and the metadata, every rank writes, the coordinator
finishes), so the folder is the one a real job of that many ranks writes. The real
torchrun jobs (tests/resume/test_elastic_distributed.py) read folders that gloo ranks saved.
"""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.stateful import Stateful

import datapipes as dp
from datapipes.checkpoint.dcp import load_dcp_states
from datapipes.checkpoint.reading import CheckpointError, read_dcp_metadata

# ----- a multi-rank DCP save, simulated in one process -----------------------------------------


def save_as_ranks(per_rank: list[dict[str, Any]], path: Path, *, flatten: bool = True) -> None:
    """What ``dcp.save(per_rank[r], checkpoint_id=path)`` on ranks ``0..n-1`` of a job writes.

    Stateful entries (a Loader) are asked for their ``state_dict()`` first, as dcp.save does.
    ``flatten=False``: with ``DefaultSavePlanner(flatten_state_dict=False)``.
    """
    planners, writers, local_plans = [], [], []
    for rank, entries in enumerate(per_rank):
        state = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in entries.items()}
        planner = DefaultSavePlanner(flatten_state_dict=flatten)
        writer = FileSystemWriter(path)
        coordinator = rank == 0
        writer.set_up_storage_writer(coordinator, rank=rank, use_collectives=True)
        planner.set_up_planner(
            state_dict=state, storage_meta=writer.storage_meta(), is_coordinator=coordinator
        )
        local_plans.append(writer.prepare_local_plan(planner.create_local_plan()))
        planners.append(planner)
        writers.append(writer)
    plans, metadata = planners[0].create_global_plan(local_plans)  # on the coordinator
    plans = writers[0].prepare_global_plan(plans)
    results = []
    for planner, writer, plan in zip(planners, writers, plans, strict=True):
        written = writer.write_data(planner.finish_plan(plan), planner)
        written.wait()
        results.append(written.value())
    writers[0].finish(metadata=metadata, results=results)


def recipe() -> dp.DataPipe[Any]:
    return dp.range(60).shuffle().batch(4)


def loaders(world: int, **options: Any) -> list[dp.Loader]:
    return [
        dp.Loader(recipe(), seed=5, rank=r, world_size=world, even_batches=False, **options)
        for r in range(world)
    ]


def stopped(world: int, steps: list[int]) -> tuple[list[dp.Loader], list[int]]:
    """Loaders of ``world`` ranks, rank r stopped after ``steps[r]`` batches; the ids read."""
    made = loaders(world)
    seen: list[int] = []
    for loader, count in zip(made, steps, strict=True):
        batches = iter(loader)
        for _ in range(count):
            seen += next(batches).tolist()
    return made, seen


def model_entries(rank: int) -> dict[str, Any]:
    return {"model": {"weight": torch.full((3,), float(rank))}, "step": 11}


# ----- merging what the ranks saved ------------------------------------------------------------


def test_the_ranks_positions_come_back_merged(tmp_path: Path):
    made, _ = stopped(2, [2, 5])
    save_as_ranks([{**model_entries(r), "data": lo} for r, lo in enumerate(made)], tmp_path)
    expected = dp.merge_states([lo.state_dict() for lo in made])
    assert load_dcp_states(tmp_path) == expected
    assert load_dcp_states(tmp_path, key="data") == expected
    assert load_dcp_states(str(tmp_path)) == expected  # a str as well as a Path


def test_the_merged_state_is_plain_data(tmp_path: Path):
    made, _ = stopped(2, [3, 1])
    save_as_ranks([{"data": lo} for lo in made], tmp_path)
    state = load_dcp_states(tmp_path)
    assert json.loads(json.dumps(state)) == state
    torch.save(state, tmp_path / "merged.pt")
    assert torch.load(tmp_path / "merged.pt", weights_only=True) == state


def test_reads_no_tensor_and_no_other_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Only the Loader's entries are read: a checkpoint's model may be large."""
    made, _ = stopped(2, [1, 1])
    entries = [{**model_entries(r), "optim": {"lr": 0.1}, "data": lo} for r, lo in enumerate(made)]
    save_as_ranks(entries, tmp_path)
    read: list[str] = []
    real = torch.load

    def counting_load(*args: Any, **kwargs: Any) -> Any:
        read.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    load_dcp_states(tmp_path, key="data")
    keys = FileSystemReader(tmp_path).read_metadata().state_dict_metadata
    loader_keys = [k for k in keys if k.startswith("data.")]
    assert len(read) == len(loader_keys) < len(keys) - 1  # the optimizer and step not read
    assert set(read) == {True}  # every entry as plain data


@pytest.mark.parametrize(("world", "steps", "new_world"), [(2, [2, 5], 3), (3, [0, 4, 2], 2)])
def test_a_resume_on_another_world_size_reads_every_remaining_item_once(
    tmp_path: Path, world: int, steps: list[int], new_world: int
):
    made, before = stopped(world, steps)
    save_as_ranks([{"data": lo} for lo in made], tmp_path)
    state = load_dcp_states(tmp_path, key="data")
    after = []
    for loader in loaders(new_world):
        loader.load_state_dict(state)
        after.append([i for batch in loader for i in batch.tolist()])
    every = before + [i for rest in after for i in rest]
    assert sorted(every) == list(range(60)), "an item lost or read twice"
    assert all(after), "a new rank got nothing: the remaining work was not dealt"


def test_a_resume_on_the_same_topology_continues_each_ranks_stream(tmp_path: Path):
    made, _ = stopped(2, [2, 5])
    uninterrupted = [[b.tolist() for b in lo] for lo in loaders(2)]
    save_as_ranks([{"data": lo} for lo in made], tmp_path)
    state = load_dcp_states(tmp_path)
    for rank, loader in enumerate(loaders(2)):
        loader.load_state_dict(state)
        assert [b.tolist() for b in loader] == uninterrupted[rank][[2, 5][rank] :]


def test_a_one_rank_job_saved_with_the_public_dcp_save(tmp_path: Path):
    (loader,) = loaders(1)
    batches = iter(loader)
    before = next(batches).tolist() + next(batches).tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"data": loader, **model_entries(0)}, checkpoint_id=tmp_path, no_dist=True)
    state = load_dcp_states(tmp_path)
    assert state == dp.merge_states([loader.state_dict()])
    rest = []
    for new in loaders(2):
        new.load_state_dict(state)
        rest += [i for b in new for i in b.tolist()]
    assert sorted(before + rest) == list(range(60))


def test_states_taken_before_the_first_epoch(tmp_path: Path):
    made = loaders(2)  # never iterated: each rank's position is the start of epoch 0
    save_as_ranks([{"data": lo} for lo in made], tmp_path)
    state = load_dcp_states(tmp_path)
    assert state == dp.merge_states([lo.state_dict() for lo in made])
    got = []
    for new in loaders(3):
        new.load_state_dict(state)
        got += [i for b in new for i in b.tolist()]
    assert sorted(got) == list(range(60))


# ----- where the Loader sits ----------------------------------------------------------------


def test_a_nested_loader_is_found_and_can_be_named(tmp_path: Path):
    made, _ = stopped(2, [1, 2])
    save_as_ranks([{"extra": {"loader": lo.state_dict(), "n": 1}} for lo in made], tmp_path)
    expected = dp.merge_states([lo.state_dict() for lo in made])
    assert load_dcp_states(tmp_path) == expected
    assert load_dcp_states(tmp_path, key="extra.loader") == expected


def test_two_loaders_need_a_key(tmp_path: Path):
    train, _ = stopped(2, [1, 2])
    evaluation, _ = stopped(2, [3, 0])
    save_as_ranks(
        [{"train": a, "eval": b} for a, b in zip(train, evaluation, strict=True)], tmp_path
    )
    with pytest.raises(ValueError, match=r"several Loader states, at \['eval', 'train'\]"):
        load_dcp_states(tmp_path)
    assert load_dcp_states(tmp_path, key="eval") == dp.merge_states(
        [lo.state_dict() for lo in evaluation]
    )
    assert load_dcp_states(tmp_path, key="train") == dp.merge_states(
        [lo.state_dict() for lo in train]
    )


# ----- errors ---------------------------------------------------------------------------------


def test_a_missing_path(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="no DCP checkpoint at .*nowhere"):
        load_dcp_states(tmp_path / "nowhere")


def test_a_file_is_no_dcp_folder(tmp_path: Path):
    (loader,) = loaders(1)
    dp.save_checkpoint({"loader": loader.state_dict()}, tmp_path / "rank0.pt")
    with pytest.raises(ValueError, match="is a file, not a torch.distributed.checkpoint.*merge"):
        load_dcp_states(tmp_path / "rank0.pt")


def test_a_folder_without_metadata(tmp_path: Path):
    (tmp_path / "__0_0.distcp").write_bytes(b"half a save")
    with pytest.raises(ValueError, match="no .metadata file"):
        load_dcp_states(tmp_path)


def test_a_checkpoint_without_a_loader(tmp_path: Path):
    save_as_ranks([model_entries(0), model_entries(1)], tmp_path)
    with pytest.raises(ValueError, match=r"no Loader state in .*\['model', 'step'\]"):
        load_dcp_states(tmp_path)


def test_a_key_that_holds_no_loader(tmp_path: Path):
    made, _ = stopped(2, [1, 1])
    save_as_ranks([{**model_entries(r), "data": lo} for r, lo in enumerate(made)], tmp_path)
    with pytest.raises(ValueError, match=r"no Loader state at key='step'.*at \['data'\]"):
        load_dcp_states(tmp_path, key="step")
    with pytest.raises(ValueError, match=r"key='loader'.*holds nothing there.*at \['data'\]"):
        load_dcp_states(tmp_path, key="loader")


def test_a_rank_missing_from_the_checkpoint(tmp_path: Path):
    """Rank 1's position alone (as if saved by a sub-group) is no state of the whole job."""
    made, _ = stopped(2, [1, 1])
    save_as_ranks([{"data": made[1]}], tmp_path)
    with pytest.raises(dp.StateMismatchError):
        load_dcp_states(tmp_path)


def test_a_loader_saved_as_one_entry_is_found(tmp_path: Path):
    """Saved without flattening (one entry for the whole state), a one-rank job still reads."""
    (loader,) = loaders(1)
    next(iter(loader))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        planner = DefaultSavePlanner(flatten_state_dict=False)
        dcp.save({"data": loader, "m": torch.ones(2)}, checkpoint_id=tmp_path, planner=planner)
    assert load_dcp_states(tmp_path) == dp.merge_states([loader.state_dict()])


def test_unflattened_states_of_two_ranks_are_refused(tmp_path: Path):
    """Unflattened, every rank writes the same key ``data``: DCP keeps one rank's, and the
    other rank's position is lost; merging says so instead of resuming half the job."""
    made, _ = stopped(2, [1, 2])
    save_as_ranks([{"data": lo} for lo in made], tmp_path, flatten=False)
    with pytest.raises(dp.StateMismatchError):
        load_dcp_states(tmp_path)


def test_chained_resumes_through_dcp(tmp_path: Path):
    """2 ranks -> DCP -> 3 ranks, stopped again mid-epoch -> DCP -> 2 ranks: exactly once.

    The second checkpoint's ranks hold the plans they were dealt; DCP keeps them per rank.
    """
    made, seen = stopped(2, [2, 5])
    save_as_ranks([{"data": lo} for lo in made], tmp_path / "first")
    state = load_dcp_states(tmp_path / "first")
    middle = loaders(3)
    for loader, count in zip(middle, [1, 0, 3], strict=True):
        loader.load_state_dict(state)
        batches = iter(loader)
        for _ in range(count):
            seen += next(batches).tolist()
    save_as_ranks([{"data": lo} for lo in middle], tmp_path / "second")
    state = load_dcp_states(tmp_path / "second", key="data")
    assert state == dp.merge_states([lo.state_dict() for lo in middle])
    for loader in loaders(2):
        loader.load_state_dict(state)
        seen += [i for b in loader for i in b.tolist()]
    assert sorted(seen) == list(range(60))


#: How the GLOBAL opcode of a protocol-2 pickle names PurePosixPath on this Python.
HERE = f"c{PurePosixPath.__module__}\nPurePosixPath\n".encode()


def metadata_naming(tmp_path: Path, named: bytes) -> Path:
    """A ``.metadata`` whose one storage path names its class as ``named``."""
    written = pickle.dumps({"path": PurePosixPath("shard/0.distcp")}, protocol=2)
    assert HERE in written
    (tmp_path / ".metadata").write_bytes(written.replace(HERE, named))
    return tmp_path


@pytest.mark.parametrize("module", ["pathlib", "pathlib._local"])
def test_storage_paths_read_as_any_python_writes_them(tmp_path: Path, module: str):
    """Python 3.12 and older pickle ``pathlib.PosixPath``; 3.13 ``pathlib._local.PosixPath``."""
    folder = metadata_naming(tmp_path, f"c{module}\nPurePosixPath\n".encode())
    assert read_dcp_metadata(folder) == {"path": PurePosixPath("shard/0.distcp")}


@pytest.mark.parametrize(
    "named", [b"cpathlib._local\nPath\n", b"cos\nsystem\n", b"cpathlib\nPath.__new__\n"]
)
def test_a_metadata_pickle_naming_anything_else_is_refused(tmp_path: Path, named: bytes):
    with pytest.raises(CheckpointError, match="refusing to unpickle .* checkpoint's .metadata"):
        read_dcp_metadata(metadata_naming(tmp_path, named))
