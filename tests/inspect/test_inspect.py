"""``python -m datapipes inspect``: reading Loader states out of real checkpoints."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import warnings
from itertools import islice
from pathlib import Path

import pytest
import torch
from file_fixtures import write_id_files

import datapipes as dp
from datapipes.inspect import (
    check_recipe,
    describe_checkpoint,
    find_loader_states,
    load_recipe,
    main,
)
from tests.subprocess_helpers import ROOT

RECIPE = """
import datapipes as dp

DATA = {data!r}


def to_pair(record):
    return {{"id": record["id"], "x": record["x"] * 2}}


pipe = dp.files(DATA + "/part-*.jsonl").read_jsonl().map(to_pair).shuffle(buffer_size=16).batch(4)
changed = dp.files(DATA + "/part-*.jsonl").read_jsonl().map(to_pair).shuffle(buffer_size=8).batch(4)


def other_seed():
    return dp.Loader(pipe, seed=99)
"""


def write_data(folder: Path, files: int = 3, records: int = 2500) -> None:
    """JSONL files of ~125 KB each, so that readers get past their first 64 KiB block."""
    folder.mkdir(exist_ok=True)
    for f in range(files):
        with open(folder / f"part-{f}.jsonl", "w") as out:
            for i in range(records):
                out.write(json.dumps({"id": f * records + i, "x": i, "pad": "x" * 20}) + "\n")


@pytest.fixture
def recipe(tmp_path):
    """(path of a recipe file, its module) over real JSONL files in tmp_path."""
    write_data(tmp_path / "data")
    path = tmp_path / "recipe.py"
    path.write_text(RECIPE.format(data=str(tmp_path / "data")))
    return path, load_recipe(f"{path}:pipe")[0]


def mid_epoch_state(pipe, items: int, *, epochs_before: int = 0, **options) -> dict:
    loader = dp.Loader(pipe, seed=7, **options)
    for _ in range(epochs_before):
        list(loader)  # a whole epoch
    list(islice(loader, items))
    state = loader.state_dict()
    loader.close()
    return state


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "datapipes", "inspect", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def node_of(state: dict, rank: str = "0") -> dict:
    return json.loads(state["ranks"][rank]["node"])


# ----- the CLI in a real process -------------------------------------------------------


@pytest.mark.slow
def test_torch_save_checkpoint_mid_epoch_shows_epoch_fingerprint_and_reader(recipe, tmp_path):
    path, pipe = recipe
    state = mid_epoch_state(pipe, 500, epochs_before=1)  # epoch 1, 2,000 records in
    model = torch.nn.Linear(4, 2)
    torch.save({"model": model.state_dict(), "data": state}, tmp_path / "ckpt.pt")

    done = run_cli(str(tmp_path / "ckpt.pt"))

    assert done.returncode == 0, done.stderr
    out = done.stdout
    node = node_of(state)
    reader = node["upstream"]
    assert "Loader state at 'data'" in out
    assert f"fingerprint  {pipe.fingerprint()}" in out
    assert f"rank 0: epoch {state['ranks']['0']['epoch']}" in out
    assert state["ranks"]["0"]["epoch"] == 1
    assert "topology     world size 1, 0 workers, even_batches off" in out
    for step in pipe.steps():
        assert f"\n    {step}\n" in out  # the steps, indented as stored
    assert reader["cursor"] is not None  # past the first block: a real byte offset
    assert f"file={reader['file']}" in out and f"cursor={reader['cursor']!r}" in out
    assert f"index={reader['index']}" in out and f"skipped={reader['skipped']}" in out
    assert f"seq={node['seq']}" in out
    # the buffer's positions are summarised, never dumped
    assert f"slots={len(node['slots'])} positions" in out
    assert str(node["slots"]) not in out
    # levels: the shuffle, then its anchor (the reader, its upstream) one level deeper
    lines = out.splitlines()
    shuffle_line = next(line for line in lines if "(buffer shuffle)" in line)
    reader_line = next(line for line in lines if "(reader)" in line)
    indent = len(shuffle_line) - len(shuffle_line.lstrip())
    assert reader_line.startswith(" " * (indent + 2) + "upstream: ")


@pytest.mark.slow
def test_recipe_with_the_same_recipe_labels_and_exits_0(recipe, tmp_path):
    path, pipe = recipe
    torch.save({"data": mid_epoch_state(pipe, 100)}, tmp_path / "ckpt.pt")

    same = run_cli(str(tmp_path / "ckpt.pt"), "--recipe", f"{path}:pipe")

    assert same.returncode == 0, same.stdout + same.stderr
    assert f"recipe check ({path}:pipe): OK" in same.stdout
    assert ".shuffle(buffer_size=16).batch(4) (buffer shuffle)" in same.stdout
    assert ".read_jsonl().map(to_pair) (reader)" in same.stdout


# ----- the CLI in-process --------------------------------------------------------------


def test_missing_file_is_a_usage_error_naming_the_path(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "ckpt.pt"
    code, out, err = run_main(capsys, str(missing))
    assert code == 2
    assert str(missing) in err
    assert out == ""
    with pytest.raises(SystemExit) as exited:  # no checkpoint named at all
        main([])
    assert exited.value.code == 2


@pytest.mark.slow
def test_two_workers_show_each_worker_and_the_next_one(recipe, tmp_path, capsys):
    path, pipe = recipe
    # past the first snapshot (32 items, at one item a transfer)
    state = mid_epoch_state(pipe, 45, num_workers=2, items_per_transfer=1)
    torch.save({"data": state}, tmp_path / "ckpt.pt")

    code, out, _ = run_main(capsys, str(tmp_path / "ckpt.pt"), "--recipe", f"{path}:pipe")

    assert code == 0, out
    loader_state = node_of(state)["dataloader"]
    snapshot = loader_state["_snapshot"]
    since = loader_state["_steps_since_snapshot"]
    assert snapshot["_snapshot_step"] > 0
    assert f"snapshot after item {snapshot['_snapshot_step']} of the epoch" in out
    assert f"{since} items returned since" in out
    following = (snapshot["_last_yielded_worker_id"] + 1 + since) % 2
    assert f"from worker {following}" in out
    assert "topology     world size 1, 2 workers" in out
    for worker in (0, 1):
        dataset = snapshot["_worker_snapshots"][f"worker_{worker}"]["dataset_state"]
        header = f"worker {worker} (consumer {worker} of 2): epoch 0, skipped: none"
        assert header in out
        block = out.split(header, 1)[1]
        reader = dataset["node"]["upstream"]
        assert f"file={reader['file']}" in block.split("\n      worker", 1)[0]
    # with the recipe, each worker's levels carry its steps
    assert out.count(".shuffle(buffer_size=16).batch(4) (buffer shuffle)") == 2


@pytest.mark.slow
def test_transfers_of_several_items_are_counted_as_transfers(recipe, tmp_path, capsys):
    path, pipe = recipe
    state = mid_epoch_state(pipe, 21, num_workers=2)  # items_per_transfer="auto"
    torch.save({"data": state}, tmp_path / "ckpt.pt")
    code, out, _ = run_main(capsys, str(tmp_path / "ckpt.pt"), "--recipe", f"{path}:pipe")
    assert code == 0, out
    node = node_of(state)
    assert "transfers returned since" in out and "items returned since" not in out
    taken = node["taken"]
    assert f"{taken} item(s) of that transfer returned already (items_per_transfer=auto)" in out


def test_json_file_and_nested_paths(recipe, tmp_path, capsys):
    _, pipe = recipe
    first = mid_epoch_state(pipe, 10)
    second = mid_epoch_state(dp.range(50).shuffle().batch(5), 3)
    (tmp_path / "run.json").write_text(json.dumps({"run": {"loaders": [first, second]}}))

    code, out, _ = run_main(capsys, str(tmp_path / "run.json"))

    assert code == 0
    assert "Loader state at 'run.loaders[0]'" in out
    assert "Loader state at 'run.loaders[1]'" in out
    assert f"position={node_of(second)['position']}" in out
    assert [path for path, _ in find_loader_states({"a": [{"b": first}]})] == ["a[0].b"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_directory(tmp_path, capsys):
    import torch.distributed.checkpoint as dcp

    pipe = dp.range(100).shuffle().batch(4)
    loader = dp.Loader(pipe, seed=5)
    list(islice(loader, 6))
    model = torch.nn.Linear(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model.state_dict(), "data": loader}, checkpoint_id=str(tmp_path / "c"))
    state = loader.state_dict()
    loader.close()

    code, out, _ = run_main(capsys, str(tmp_path / "c"), "--json")

    assert code == 0
    [found] = json.loads(out)["loader_states"]
    assert found["path"] == "data"
    assert found["state"]["fingerprint"] == pipe.fingerprint()
    assert found["state"]["ranks"]["0"]["node"] == node_of(state)
    code, out, _ = run_main(capsys, str(tmp_path / "c"), "--recipe", _recipe_file(tmp_path))
    assert code == 0, out
    assert "dp.range(100).shuffle().batch(4) (sequence source)" in out
    assert "covers rank 0 of 1: can resume on any topology" in out
    assert "dp.range(100).shuffle() (positions): 76 items" in out  # 100 - 6 batches of 4
    code, out, _ = run_main(capsys, str(tmp_path / "c"), "--json")
    assert json.loads(out)["loader_states"][0]["job"]["covers_job"] is True


def _recipe_file(tmp_path: Path) -> str:
    path = tmp_path / "range_recipe.py"
    path.write_text("import datapipes as dp\npipe = dp.range(100).shuffle().batch(4)\n")
    return f"{path}:pipe"


def test_dcp_metadata_with_other_globals_is_refused_not_unpickled(tmp_path, capsys):
    marker = tmp_path / "was-unpickled"

    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    folder = tmp_path / "c"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(Evil()))
    torch.save(Evil(), tmp_path / "evil.pt")

    for path in (folder, tmp_path / "evil.pt"):
        code, _, err = run_main(capsys, str(path))
        assert code == 2
        assert str(path) in err
    assert not marker.exists()


def test_json_output_has_the_decoded_node_state(recipe, tmp_path, capsys):
    path, pipe = recipe
    state = mid_epoch_state(pipe, 20)
    torch.save({"model": {}, "data": state}, tmp_path / "ckpt.pt")

    code, out, _ = run_main(capsys, str(tmp_path / "ckpt.pt"), "--json", "--recipe", f"{path}:pipe")

    assert code == 0
    parsed = json.loads(out)
    node = parsed["loader_states"][0]["state"]["ranks"]["0"]["node"]
    assert isinstance(node, dict) and node == node_of(state)
    assert parsed["recipe_check"] == [{"path": "data", "ok": True, "problems": []}]


def test_no_loader_state_exits_1_naming_the_top_level_keys(tmp_path, capsys):
    torch.save({"model": {"w": torch.zeros(2)}, "step": 3}, tmp_path / "model.pt")
    code, out, err = run_main(capsys, str(tmp_path / "model.pt"))
    assert code == 1
    assert out == ""
    assert "['model', 'step']" in err


def test_changed_files_fail_the_recipe_check(recipe, tmp_path, capsys):
    path, pipe = recipe
    state = mid_epoch_state(pipe, 20)
    assert check_recipe(state, pipe) == []
    write_data(tmp_path / "data", files=4, records=10)  # one more file, others rewritten

    problems = check_recipe(state, pipe)

    assert len(problems) == 1 and "the files changed" in problems[0]


def test_in_process_description_with_and_without_recipe():
    def double(x):
        return 2 * x

    pipe = dp.mix([dp.range(30).map(double), dp.range(20).shuffle().repeat(2)], [1, 3]).batch(2)
    state = mid_epoch_state(pipe, 6)
    node = node_of(state)

    plain = describe_checkpoint({"data": state})
    labelled = describe_checkpoint(state, pipe)

    assert "(mix)" in plain and f"draws={node['draws']}" in plain
    assert f"round={node['upstream'][1]['round']}" in plain
    assert "repeat(2) (repeat)" in plain  # the one saved step of that kind
    assert "dp.mix(2 pipes, weights=[1.0, 3.0], stop='all_exhausted').batch(2) (mix)" in labelled
    assert f"upstream[0]: {pipe.inputs[0].inputs[0]!r} (sequence source)" in labelled
    assert "recipe check (recipe): OK" in labelled
    with pytest.raises(ValueError, match="top-level keys"):
        describe_checkpoint({"model": {}})


def test_a_finished_epoch_has_no_position():
    loader = dp.Loader(dp.range(4).batch(2), seed=0)
    list(loader)
    text = describe_checkpoint(loader.state_dict())
    assert "rank 0: epoch 1" in text
    assert "no position: the next iteration runs epoch 1 from its start" in text


def test_recipe_changed_or_with_another_seed_exits_1(recipe, tmp_path, capsys):
    path, pipe = recipe
    torch.save({"data": mid_epoch_state(pipe, 100)}, tmp_path / "ckpt.pt")
    ckpt = str(tmp_path / "ckpt.pt")

    code, out, _ = run_main(capsys, ckpt, "--recipe", f"{path}:changed")
    assert code == 1
    assert "FAILED" in out
    assert "-shuffle(buffer_size=16)" in out and "+shuffle(buffer_size=8)" in out

    code, out, _ = run_main(capsys, ckpt, "--recipe", f"{path}:other_seed")
    assert code == 1
    assert "seed=7" in out and "seed=99" in out

    code, _, err = run_main(capsys, ckpt, "--recipe", f"{path}:DATA")
    assert code == 2 and "expected a DataPipe" in err


@pytest.mark.slow
def test_a_worker_that_has_not_read_yet_is_at_the_start_of_the_epoch():
    from datapipes.inspect import describe_checkpoint

    loader = dp.Loader(dp.range(100).shuffle().batch(8), num_workers=2)
    it = iter(loader)
    for _ in range(3):  # before the first snapshot: the workers' states are the epoch start
        next(it)
    text = describe_checkpoint({"data": loader.state_dict()})
    loader.close()
    assert text.count("at the start of the epoch") == 2, text
    assert "None" not in text, text


# ----- a job of several ranks: merged, what remains, how it is dealt ---------------------------

JOB_RECIPE = """
import datapipes as dp

DATA = {data!r}


def ident(record):
    return record["id"]


ranged = dp.range(100).shuffle(buffer_size=8).batch(4)
records = dp.files(DATA + "/p*.jsonl").read_jsonl().map(ident).shuffle(buffer_size=8).batch(4)
taken = dp.range(100).take(60).batch(4)
"""

#: Batches of 4 each rank of the 3-rank job returned before its checkpoint.
BATCHES = [2, 3, 1]


@pytest.fixture
def job(tmp_path):
    """A recipe file (ranged/records/taken) over 4 JSONL files of 50 records each."""
    data = tmp_path / "data"
    write_id_files(data, 4, 50, name="p{}")
    path = tmp_path / "job_recipe.py"
    path.write_text(JOB_RECIPE.format(data=str(data)))
    return path


def job_loaders(pipe, world_size: int) -> list:
    return [
        dp.Loader(pipe, seed=3, rank=r, world_size=world_size, even_batches=False)
        for r in range(world_size)
    ]


def save_ranks(tmp_path: Path, name: str, loaders, batches) -> list[str]:
    """Each rank takes its batches, then saves its own state (as a training job would)."""
    for loader, count in zip(loaders, batches):
        if not count:
            continue  # iter() would start its next epoch
        it = iter(loader)
        for _ in range(count):
            next(it)
    paths = []
    for rank, loader in enumerate(loaders):
        paths.append(str(tmp_path / f"{name}-rank{rank}.pt"))
        torch.save({"model": {"w": torch.ones(2)}, "data": loader.state_dict()}, paths[-1])
    return paths


def three_rank_job(job, tmp_path, name: str = "ranged") -> tuple[object, list[str]]:
    pipe = load_recipe(f"{job}:{name}")[0]
    return pipe, save_ranks(tmp_path, name, job_loaders(pipe, 3), BATCHES)


def delivered(loader) -> list[int]:
    return [int(x) for batch in loader for x in batch.tolist()]


def test_three_rank_files_merge_into_one_state_that_covers_the_job(job, tmp_path, capsys):
    _, paths = three_rank_job(job, tmp_path)

    code, out, err = run_main(capsys, paths[2], paths[0], paths[1])  # any order

    assert code == 0, err
    assert out.startswith("Loader state merged from 3 states (dp.merge_states)")
    assert all(f"from '{path}:data'" in out for path in paths)
    assert "covers ranks 0-2 of 3: can resume on any topology" in out
    assert "epoch 0: ranks 0-2 mid-epoch" in out
    for rank in range(3):  # each rank's position, once, under the merged state
        assert out.count(f"rank {rank}: epoch 0") == 1
    # without the recipe, what remains is not told, and the report says why
    assert "need the recipe (--recipe MODULE:NAME)" in out
    assert "(positions)" not in out
    # the merged state keeps one graph record: every rank's levels are still labelled
    assert out.count("upstream: dp.range(100) (sequence source)") == 3


def test_remaining_work_and_its_deal_to_two_ranks_match_a_real_resume(job, tmp_path, capsys):
    pipe, paths = three_rank_job(job, tmp_path)

    code, out, err = run_main(capsys, *paths, "--recipe", f"{job}:ranged", "--world-size", "2")

    assert code == 0, out + err
    left = 100 - 4 * sum(BATCHES)  # 76: every item not returned to the training loop
    assert f"dp.range(100) (positions): {left} items" in out
    assert "dealt to world size 2, 0 workers per rank" in out
    # what the report deals is what two resumed ranks then deliver, each item once
    merged = dp.merge_states([torch.load(p, weights_only=True)["data"] for p in paths])
    rest = []
    for rank, loader in enumerate(job_loaders(pipe, 2)):
        loader.load_state_dict(merged)
        mine = delivered(loader)
        assert f"rank {rank}: dp.range(100): {len(mine)} items" in out
        rest += mine
    assert len(rest) == len(set(rest)) == left

    code, out, _ = run_main(
        capsys, *paths, "--recipe", f"{job}:ranged", "--world-size", "1", "--num-workers", "4"
    )
    assert code == 0
    shares = [f"rank 0 worker {w}: dp.range(100): 19 items" for w in range(4)]  # 76 / 4
    assert all(share in out for share in shares), out


def test_records_read_but_not_delivered_are_counted_apart(job, tmp_path, capsys):
    _, paths = three_rank_job(job, tmp_path, "records")

    code, out, _ = run_main(capsys, *paths, "--recipe", f"{job}:records", "--world-size", "2")

    assert code == 0, out
    # each rank's shuffle buffer holds 8 records read but not returned; each rank is
    # inside its first file (at most 8 + 12 of its 50 records read), the 4th file untouched
    expected = (
        "(records): 24 records read but not delivered, "
        "then the rest of 4 files/parts (1 untouched, 3 started)"
    )
    assert expected in out
    dealt = [
        line for line in out.splitlines() if line.strip().startswith("rank ") and ": dp." in line
    ]
    held = [int(line.split(": ")[-1].split(" records")[0]) for line in dealt]
    assert len(dealt) == 2 and sum(held) == 24


def test_the_saved_topology_resumes_each_rank_where_it_stopped(job, tmp_path, capsys):
    _, paths = three_rank_job(job, tmp_path)

    code, out, _ = run_main(capsys, *paths, "--recipe", f"{job}:ranged", "--world-size", "3")

    assert code == 0
    assert "(the saved topology): each rank resumes exactly where it stopped" in out
    for rank, count in enumerate(BATCHES):  # 100 items dealt 34/33/33 by the shuffle's ranks
        share = len(range(rank, 100, 3))
        assert f"rank {rank}: dp.range(100): {share - 4 * count} items" in out


def test_a_rank_that_finished_its_share_is_told_apart(job, tmp_path, capsys):
    pipe = load_recipe(f"{job}:ranged")[0]
    loaders = job_loaders(pipe, 3)
    list(loaders[2])  # rank 2 ends epoch 0: its state is at the start of epoch 1
    paths = save_ranks(tmp_path, "finished", loaders, [1, 2, 0])

    code, out, _ = run_main(capsys, *paths, "--recipe", f"{job}:ranged", "--json")

    assert code == 0
    report = json.loads(out)["loader_states"][0]["job"]
    assert report["epoch"] == 0
    assert report["rank_status"]["2"] == {"epoch": 1, "status": "finished", "plans": None}
    [source] = report["remaining"]["sources"]
    assert source["items"] == 100 - 33 - 4 * 3  # rank 2's 33 items, and 3 batches of 4
    text = describe_checkpoint(torch.load(paths[0], weights_only=True))
    assert "holds rank 0 of 3 only" in text


def test_a_single_rank_file_resumes_only_on_its_topology(job, tmp_path, capsys):
    _, paths = three_rank_job(job, tmp_path)

    code, out, _ = run_main(capsys, paths[1])
    assert code == 0
    assert (
        "holds rank 1 of 3 only: resumes on the saved topology; "
        "merge every rank's state to resume elsewhere"
    ) in out

    code, out, _ = run_main(capsys, paths[1], "--recipe", f"{job}:ranged", "--world-size", "2")
    assert code == 1  # the deal asked for cannot be told
    assert "cannot be dealt to world size 2, 0 workers" in out
    assert "(positions)" not in out

    code, out, _ = run_main(capsys, paths[1], paths[2])  # two ranks of three: not merged
    assert code == 1
    assert "Loader states from 2 places, shown together (not merged)" in out
    assert "rank(s) [0] are missing" in out
    assert "holds ranks 1-2 of 3 only" in out


def test_an_elastic_refusal_is_a_reason_not_a_traceback(job, tmp_path, capsys):
    _, paths = three_rank_job(job, tmp_path, "taken")

    code, out, err = run_main(capsys, *paths, "--recipe", f"{job}:taken", "--world-size", "2")

    assert code == 1
    assert "! cannot resume elsewhere: this checkpoint cannot resume on another topology" in out
    assert "step 'take'" in out
    assert "Traceback" not in out + err
    code, out, _ = run_main(capsys, *paths, "--recipe", f"{job}:taken")
    assert code == 0  # no other topology asked for: the state resumes where it was saved
    assert "step 'take'" in out
    code, out, _ = run_main(capsys, *paths, "--recipe", f"{job}:taken", "--json")
    report = json.loads(out)["loader_states"][0]["job"]
    assert report["refused"] is True and "step 'take'" in report["problem"]


def test_a_state_after_an_elastic_resume_shows_its_plans(job, tmp_path, capsys):
    pipe, paths = three_rank_job(job, tmp_path)
    merged = dp.merge_states([torch.load(p, weights_only=True)["data"] for p in paths])
    resumed = job_loaders(pipe, 2)
    for loader in resumed:
        loader.load_state_dict(merged)
    before = resumed[0].state_dict()
    plan = json.loads(before["ranks"]["0"]["plans"]["text"])["consumers"]
    pieces = sum(len(p) for p in plan[0].values())
    torch.save({"data": before}, tmp_path / "before.pt")

    code, out, _ = run_main(capsys, str(tmp_path / "before.pt"))

    assert code == 0
    expected = f"dealt by a resume from another topology: its consumer's plan holds {pieces} pieces"
    assert expected in out
    assert "no position: the next iteration reads its plan for epoch 0" in out
    assert "rank 0 holds plans dealt by an elastic resume" in out
    assert "holds rank 0 of 2 only" in out

    mid = save_ranks(tmp_path, "mid", resumed, [2, 1])  # mid-way through the dealt shares
    code, out, _ = run_main(capsys, *mid, "--recipe", f"{job}:ranged", "--world-size", "3")
    assert code == 0, out
    assert "covers ranks 0-1 of 2: can resume on any topology" in out
    assert "ranks 0-1 hold plans dealt by an elastic resume" in out
    left = 100 - 4 * sum(BATCHES) - 4 * 3
    assert f"dp.range(100) (positions): {left} items" in out
    dealt = [
        int(line.rsplit(": ", 1)[1].split()[0])
        for line in out.splitlines()
        if line.strip().startswith("rank ") and "dp.range(100):" in line
    ]
    assert len(dealt) == 3 and sum(dealt) == left and max(dealt) - min(dealt) <= 1

    code, out, _ = run_main(capsys, *mid, "--json")
    status = json.loads(out)["loader_states"][0]["job"]["rank_status"]
    assert status["0"]["status"] == "mid-epoch"
    assert status["0"]["plans"]["current"] is True
    assert status["0"]["plans"]["pieces"] == pieces


def test_json_has_the_job_its_remaining_work_and_the_deal(job, tmp_path, capsys):
    _, paths = three_rank_job(job, tmp_path)

    code, out, _ = run_main(
        capsys, *paths, "--recipe", f"{job}:ranged", "--world-size", "2", "--json"
    )

    assert code == 0
    parsed = json.loads(out)
    assert parsed["checkpoint"] == paths
    [found] = parsed["loader_states"]
    report = found["job"]
    assert report["merged_from"] == [f"{p}:data" for p in paths]
    assert report["covers_job"] is True and report["ranks"] == [0, 1, 2]
    assert sorted(found["state"]["ranks"]) == ["0", "1", "2"]
    [source] = report["remaining"]["sources"]
    assert (source["kind"], source["items"], source["label"]) == ("positions", 76, "dp.range(100)")
    shares = [c["sources"][0]["items"] for c in report["deal"]["consumers"]]
    assert shares == [38, 38]
    assert report["deal"]["exact_resume"] is False
    assert parsed["recipe_check"][0]["ok"] is True


def test_a_state_that_does_not_parse_is_shown_alone_and_its_job_merged(job, tmp_path, capsys):
    _, paths = three_rank_job(job, tmp_path)
    damaged = torch.load(paths[1], weights_only=True)
    damaged["data"]["ranks"]["1"]["digest"] = "0" * 16  # as if the file had been edited
    torch.save(damaged, tmp_path / "damaged.pt")

    code, out, err = run_main(capsys, *paths, str(tmp_path / "damaged.pt"))

    assert code == 1, out + err  # the damaged state fails its check
    assert "Traceback" not in out + err
    merged, alone = out.split("\n\n")
    assert merged.startswith("Loader state merged from 3 states (dp.merge_states)")
    assert "state check (shape only): OK" in merged
    assert alone.startswith(f"Loader state at '{tmp_path / 'damaged.pt'}:data'")
    assert 'state check (shape only): FAILED\n    invalid state at ranks["1"].digest' in alone
    assert "job: ! this state cannot be read for a resume" in alone
    assert "rank 1: epoch 0\n" in alone  # shown as found: its position, level by level
    assert "(buffer shuffle)" in alone


def test_ranks_at_their_epochs_start_are_one_line_per_epoch(job, tmp_path, capsys):
    pipe = load_recipe(f"{job}:ranged")[0]
    paths = save_ranks(tmp_path, "idle", job_loaders(pipe, 6), [2, 1, 0, 0, 0, 0])

    code, out, _ = run_main(capsys, *paths)

    assert code == 0
    assert "ranks 2-5: epoch 0, no position (at the epoch's start)" in out
    assert "rank 2: epoch 0\n" not in out
    assert "epoch 0: ranks 0-1 mid-epoch, ranks 2-5 not started" in out
