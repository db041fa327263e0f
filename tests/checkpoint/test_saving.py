"""dp.save_checkpoint / dp.load_checkpoint: a crash at any moment leaves a complete checkpoint.

The slow tests kill real processes with SIGKILL: at fixed points inside a save
(and inside a plain ``torch.save``, the control that shows the failure is real),
and at random moments in a training loop that is restarted from its checkpoint
until it finishes, which must then equal the uninterrupted run exactly.
"""

from __future__ import annotations

import fractions
import io
import multiprocessing
import os
import pickle
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import fsspec
import preempted_training as job
import pytest
import torch

import datapipes as dp
from datapipes.checkpoint.saving import _HOST

KILLS = 12


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def _loader() -> dp.Loader:
    return dp.Loader(dp.range(100).shuffle().batch(10), seed=3)


# --- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("as_path", [False, True], ids=["str", "Path"])
def test_round_trip_resumes_the_loader_exactly(tmp_path: Path, as_path: bool) -> None:
    reference = [b.tolist() for b in _loader()]
    loader = _loader()
    stream = iter(loader)
    seen = [next(stream).tolist() for _ in range(4)]
    target = tmp_path / "ckpt.pt"
    weights = torch.arange(6.0).reshape(2, 3)
    dp.save_checkpoint(
        {"data": loader.state_dict(), "w": weights}, target if as_path else str(target)
    )
    state = dp.load_checkpoint(target if as_path else str(target))
    assert torch.equal(state["w"], weights)
    resumed = _loader()
    resumed.load_state_dict(state["data"])
    assert seen + [b.tolist() for b in resumed] == reference
    assert _temporaries(tmp_path) == []


def test_save_replaces_an_existing_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.pt"
    for version in range(3):
        dp.save_checkpoint({"version": version}, target)
        assert dp.load_checkpoint(target) == {"version": version}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_memory_url_round_trip_and_replace() -> None:
    fs = fsspec.filesystem("memory")
    folder = "/save-checkpoint-test"
    try:
        for version in range(2):
            dp.save_checkpoint(
                {"version": version, "t": torch.ones(3) * version}, f"memory://{folder}/ckpt.pt"
            )
            state = dp.load_checkpoint(f"memory://{folder}/ckpt.pt")
            assert state["version"] == version and torch.equal(state["t"], torch.ones(3) * version)
        assert [Path(p).name for p in fs.ls(folder, detail=False)] == ["ckpt.pt"]
    finally:
        fs.rm(folder, recursive=True)


def test_file_url_is_saved_like_a_local_path(tmp_path: Path) -> None:
    dp.save_checkpoint({"a": 1}, f"file://{tmp_path}/ckpt.pt")
    assert dp.load_checkpoint(tmp_path / "ckpt.pt") == {"a": 1}
    assert dp.load_checkpoint(f"file://{tmp_path}/ckpt.pt") == {"a": 1}
    assert _temporaries(tmp_path) == []


def test_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    dp.save_checkpoint({"where": "here"}, "ckpt.pt")
    dp.save_checkpoint({"where": "sub"}, os.path.join("sub", "ckpt.pt"))
    assert dp.load_checkpoint("ckpt.pt") == {"where": "here"}
    assert dp.load_checkpoint(Path("sub") / "ckpt.pt") == {"where": "sub"}
    assert _temporaries(tmp_path) == [] and _temporaries(tmp_path / "sub") == []


def test_a_symlink_is_written_through(tmp_path: Path) -> None:
    real = tmp_path / "step-100.pt"
    dp.save_checkpoint({"step": 100}, real)
    link = tmp_path / "latest.pt"
    link.symlink_to(real.name)
    dp.save_checkpoint({"step": 101}, link)
    assert link.is_symlink() and dp.load_checkpoint(real) == {"step": 101}


def test_the_target_keeps_its_permissions(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.pt"
    dp.save_checkpoint({"version": 1}, target)
    target.chmod(0o600)  # a private checkpoint must not become world-readable on the next save
    dp.save_checkpoint({"version": 2}, target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert dp.load_checkpoint(target) == {"version": 2}


def test_a_long_file_name_still_saves(tmp_path: Path) -> None:
    target = tmp_path / ("c" * 240 + ".pt")  # near NAME_MAX: the temporary name is cut
    dp.save_checkpoint({"a": 1}, target)
    assert dp.load_checkpoint(target) == {"a": 1} and _temporaries(tmp_path) == []


def test_concurrent_saves_of_one_target_leave_one_complete_file(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.pt"
    errors: list[BaseException] = []

    def save(worker: int) -> None:
        try:
            for i in range(10):
                dp.save_checkpoint({"worker": worker, "i": i, "t": torch.full((1000,), i)}, target)
        except BaseException as error:  # noqa: BLE001 - reported by the assert below
            errors.append(error)

    threads = [threading.Thread(target=save, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not [t.name for t in threads if t.is_alive()], "a save hung"
    assert errors == []
    state = dp.load_checkpoint(target)
    assert state["i"] == 9 and torch.equal(state["t"], torch.full((1000,), 9))
    assert _temporaries(tmp_path) == []


# --- failures ----------------------------------------------------------------------------------


def test_a_failing_save_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.pt"
    dp.save_checkpoint({"version": 1}, target)
    before = target.read_bytes()
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        dp.save_checkpoint({"version": 2, "fn": lambda x: x}, target)  # a lambda cannot pickle
    assert target.read_bytes() == before
    assert _temporaries(tmp_path) == []


def test_a_failing_save_to_memory_leaves_the_old_object_and_no_temporary() -> None:
    fs = fsspec.filesystem("memory")
    folder = "/save-checkpoint-failing"
    try:
        dp.save_checkpoint({"version": 1}, f"memory://{folder}/ckpt.pt")
        with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
            dp.save_checkpoint({"fn": lambda x: x}, f"memory://{folder}/ckpt.pt")
        assert dp.load_checkpoint(f"memory://{folder}/ckpt.pt") == {"version": 1}
        assert [Path(p).name for p in fs.ls(folder, detail=False)] == ["ckpt.pt"]
    finally:
        fs.rm(folder, recursive=True)


def test_a_missing_directory_or_a_directory_target_is_explained(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="directory .*nope does not exist; create it"):
        dp.save_checkpoint({}, tmp_path / "nope" / "ckpt.pt")
    with pytest.raises(IsADirectoryError, match="it is a directory; pass a file name"):
        dp.save_checkpoint({}, tmp_path)


def _saved_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(1000), "step": 3}, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("cut", ["empty", "10 bytes", "half", "all but 10", "garbage"])
def test_a_truncated_or_foreign_file_gives_a_clear_error(tmp_path: Path, cut: str) -> None:
    data = _saved_bytes()
    content = {
        "empty": b"",
        "10 bytes": data[:10],
        "half": data[: len(data) // 2],
        "all but 10": data[:-10],
        "garbage": b"not a checkpoint at all " * 20,
    }[cut]
    target = tmp_path / "ckpt.pt"
    target.write_bytes(content)
    with pytest.raises(RuntimeError, match="is not a complete checkpoint") as caught:
        dp.load_checkpoint(target)
    message = str(caught.value)
    assert str(target) in message
    assert "cut by a crash during a save that did not use save_checkpoint" in message
    assert "\n" not in message  # the first sentence of torch's reason, not its whole essay


def test_a_truncated_memory_object_gives_a_clear_error() -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe("/save-checkpoint-cut/ckpt.pt", _saved_bytes()[:100])
    try:
        with pytest.raises(RuntimeError, match="memory://.*ckpt.pt is not a complete checkpoint"):
            dp.load_checkpoint("memory://save-checkpoint-cut/ckpt.pt")
    finally:
        fs.rm("/save-checkpoint-cut", recursive=True)


def test_objects_outside_weights_only_are_refused_not_called_incomplete(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.pt"
    torch.save({"ratio": fractions.Fraction(1, 3)}, target)
    refused = r"weights_only=True\) refuses to load \(Unsupported global"
    with pytest.raises(pickle.UnpicklingError, match=refused) as caught:
        dp.load_checkpoint(target)
    assert str(target) in str(caught.value) and "weights_only=False" in str(caught.value)
    assert "not a complete checkpoint" not in str(caught.value)


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        dp.load_checkpoint(tmp_path / "none.pt")


def test_temporaries_of_dead_processes_of_this_host_are_removed(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead = int(done.stdout)
    names = {
        "dead": f".ckpt.pt.tmp-{_HOST}-{dead}-0000aaaa",
        "alive": f".ckpt.pt.tmp-{_HOST}-{os.getppid()}-0000bbbb",
        "other host": f".ckpt.pt.tmp-{_HOST}x-{dead}-0000cccc",
        "other target": f".other.pt.tmp-{_HOST}-{dead}-0000dddd",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"partial")
    dp.save_checkpoint({"a": 1}, tmp_path / "ckpt.pt")
    left = set(_temporaries(tmp_path))
    assert left == {names["alive"], names["other host"], names["other target"]}


# --- killed processes --------------------------------------------------------------------------
# The processes are forked from this one (torch already imported), so a restart costs
# milliseconds instead of an interpreter start; SIGKILL is as real as for any process.

FORK = multiprocessing.get_context("fork")


def _single_threaded(target: Any, *args: Any) -> None:
    # An OpenMP pool this process used before the fork hangs the child's first parallel op;
    # DataLoader workers do the same for the same reason.
    torch.set_num_threads(1)
    target(*args)


def _fork(target: Any, *args: Any) -> Any:
    process = FORK.Process(target=_single_threaded, args=(target, *args), daemon=True)
    process.start()
    return process


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "survivor"),
    [("write", 1), ("replace", 1), ("dirsync", 2), ("plain-torch-save", None)],
)
def test_sigkill_inside_a_save_leaves_a_complete_checkpoint(
    tmp_path: Path, point: str, survivor: int | None
) -> None:
    target = tmp_path / "ckpt.pt"
    process = _fork(job.die_at, point, str(target))
    process.join(timeout=60)
    assert process.exitcode == -signal.SIGKILL
    if survivor is None:  # the control: a plain torch.save killed halfway loses the checkpoint
        with pytest.raises(RuntimeError, match="is not a complete checkpoint"):
            dp.load_checkpoint(target)
        return
    state = dp.load_checkpoint(target)
    assert state["version"] == survivor
    assert torch.equal(state["pad"], torch.full((1 << 20,), float(survivor)))


def _events(workdir: Path) -> list[str]:
    path = workdir / "events.log"
    return path.read_text().splitlines() if path.exists() else []


def _start_until_ready(workdir: Path, deadline: float) -> Any:
    ready = _events(workdir).count("ready")
    process = _fork(job.train, workdir)
    while _events(workdir).count("ready") == ready and process.is_alive():
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the training process did not start in time")
        time.sleep(0.002)
    return process


@pytest.mark.slow
def test_training_killed_at_random_moments_resumes_exactly(tmp_path: Path) -> None:
    started = time.monotonic()
    deadline = started + 240  # a hang fails the test instead of stalling the suite
    reference_dir, workdir = tmp_path / "reference", tmp_path / "preempted"
    reference_dir.mkdir()
    workdir.mkdir()
    with torch.random.fork_rng():  # the uninterrupted run, in this process, saving nothing
        reference = job.train(reference_dir, save=False)
    order = reference["consumed"].tolist()
    assert sorted(order) == list(range(job.SAMPLES))

    rng = random.Random(14)
    kills, in_save, loads = 0, 0, 0
    while kills < KILLS:
        process = _start_until_ready(workdir, deadline)
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(process.pid, signal.SIGKILL)
        process.join(timeout=30)
        if process.exitcode == 0:  # the steps left took less than the wait: training is done
            break
        assert process.exitcode == -signal.SIGKILL, f"it ended with {process.exitcode}"
        kills += 1
        in_save += _events(workdir)[-1].startswith("save-start")
        if (workdir / "ckpt.pt").exists():  # every checkpoint a kill leaves loads, consistently
            state = dp.load_checkpoint(workdir / "ckpt.pt")
            consumed = state["consumed"].tolist()
            assert consumed == order[: len(consumed)] and len(consumed) == state["step"] * job.BATCH
            loads += 1
    final = _fork(job.train, workdir)
    final.join(timeout=max(1.0, deadline - time.monotonic()))
    assert final.exitcode == 0
    elapsed = time.monotonic() - started

    state = dp.load_checkpoint(workdir / "ckpt.pt")
    assert state["step"] == job.STEPS
    assert state["consumed"].tolist() == order  # every sample exactly once, in the same order
    for name, tensor in reference["model"].items():
        assert torch.equal(state["model"][name], tensor), name  # bit for bit the same training
    assert state["optimizer"]["state"][0]["step"] == reference["optimizer"]["state"][0]["step"]
    assert _temporaries(workdir) == []  # the killed saves' leftovers were cleaned up
    restarts = _events(workdir).count("ready")
    print(
        f"\npreemption: {kills} SIGKILLs, {in_save} inside a save, {loads} checkpoints "
        f"loaded after a kill, {restarts} starts, {elapsed:.1f} s"
    )
    assert in_save >= 1  # the interesting case happened (saves take most of the loop's time)
