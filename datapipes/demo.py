"""``python -m datapipes demo``: a real pipeline, a mid-epoch checkpoint, an exact resume.

1. Generates a small dataset on disk: features and labels as ``.npy`` files,
   and "hard examples" as four JSON-lines shards.
2. Builds a pipeline: global shuffle -> augment -> filter, mixed with the
   JSONL shards (file order shuffled, read with ``dp.files().read_jsonl()``),
   then buffer shuffle -> batch -> prefetch.
3. Runs the uninterrupted reference: epochs 0, 1 and 2.
4. Runs again, stops in the middle of epoch 1, and saves the Loader state
   with ``dp.save_checkpoint`` (``torch.save`` through a temporary file and an
   atomic rename, so a crash during the save keeps the previous checkpoint).
5. Starts a *new Python process* that rebuilds the recipe, loads the file
   with ``dp.load_checkpoint`` (``torch.load(weights_only=True)``) and finishes
   epoch 1 and epoch 2.
6. Checks that interrupted + resumed equals the reference, batch for batch.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import datapipes as dp

SAMPLES = 6_000
FEATURES = 16
BATCH = 64
SEED = 1234


class SampleTable:
    """Random access over the generated ``.npy`` files (memory-mapped, nothing loaded up front)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._features: np.ndarray | None = None
        self._labels: np.ndarray | None = None

    def _open(self) -> None:
        self._features = np.load(Path(self.folder) / "features.npy", mmap_mode="r")
        self._labels = np.load(Path(self.folder) / "labels.npy", mmap_mode="r")

    def __len__(self) -> int:
        if self._labels is None:
            self._open()
        return len(self._labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self._features is None:
            self._open()
        return {
            "id": index,
            "features": np.array(self._features[index]),
            "label": int(self._labels[index]),
        }


def augment(sample: dict[str, Any]) -> dict[str, Any]:
    """Deterministic per-sample noise (seeded by the sample id, not a global RNG)."""
    noise = np.random.default_rng(sample["id"]).normal(0, 0.01, FEATURES).astype(np.float32)
    return {**sample, "features": sample["features"] + noise}


def keep(sample: dict[str, Any]) -> bool:
    """Drop a few samples, so the stream is no longer random access."""
    return sample["id"] % 17 != 0


HARD_SHARDS = 4
HARD_PER_SHARD = 125


def hard_example(record: dict[str, Any]) -> dict[str, Any]:
    """A 'hard example' from the JSONL shards, shaped like the main samples."""
    features = np.asarray(record["features"], dtype=np.float32)
    return {"id": record["id"], "features": features, "label": record["label"]}


def build_pipe(folder: str) -> dp.DataPipe[Any]:
    """The demo recipe: what a training script would import."""
    main = dp.from_sequence(SampleTable(folder)).shuffle().map(augment).filter(keep)
    hard = dp.files(str(Path(folder) / "hard-*.jsonl")).shuffle().read_jsonl().map(hard_example)
    mixed = dp.mix([main, hard], weights=[0.9, 0.1])
    return mixed.shuffle(buffer_size=256).batch(BATCH).prefetch(2)


def generate(folder: Path) -> None:
    rng = np.random.default_rng(0)
    np.save(folder / "features.npy", rng.normal(size=(SAMPLES, FEATURES)).astype(np.float32))
    np.save(folder / "labels.npy", rng.integers(0, 10, SAMPLES))
    for shard in range(HARD_SHARDS):
        with open(folder / f"hard-{shard:02d}.jsonl", "w") as f:
            for i in range(shard * HARD_PER_SHARD, (shard + 1) * HARD_PER_SHARD):
                record = {"id": SAMPLES + i, "features": [i % 7] * FEATURES, "label": i % 10}
                f.write(json.dumps(record) + "\n")


def batch_ids(batch: dict[str, Any]) -> list[int]:
    return batch["id"].tolist()


def resume_phase(folder: str, checkpoint: str, out: str, workers: int) -> None:
    """Runs in a fresh process: load the checkpoint and finish epochs 1 and 2."""
    loader = dp.Loader(build_pipe(folder), seed=SEED, num_workers=workers)
    loader.load_state_dict(dp.load_checkpoint(checkpoint))
    rest_of_epoch_1 = [batch_ids(b) for b in loader]
    epoch_2 = [batch_ids(b) for b in loader]
    loader.close()
    Path(out).write_text(json.dumps({"epoch1": rest_of_epoch_1, "epoch2": epoch_2}))


def run_demo(workdir: str | None = None, stop_after: int = 37, workers: int = 2) -> bool:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(workdir or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        generate(folder)
        pipe = build_pipe(str(folder))
        print(
            f"dataset: {SAMPLES} samples x {FEATURES} features, and "
            f"{HARD_SHARDS * HARD_PER_SHARD} hard examples in {HARD_SHARDS} JSONL shards, "
            f"in {folder}"
        )
        print(f"pipeline: {pipe!r}")
        print(f"running in {workers} DataLoader worker process(es)" if workers else "in-process")

        with dp.Loader(pipe, seed=SEED, num_workers=workers) as reference:
            epochs = [[batch_ids(b) for b in reference] for _ in range(3)]
        counts = ", ".join(f"epoch {e}: {len(b)} batches" for e, b in enumerate(epochs))
        print(f"reference run: {counts}")

        with dp.Loader(build_pipe(str(folder)), seed=SEED, num_workers=workers) as loader:
            for _ in loader:  # epoch 0
                pass
            seen = []
            for batch in loader:  # epoch 1, interrupted
                seen.append(batch_ids(batch))
                if len(seen) == stop_after:
                    break
            checkpoint = folder / "loader.pt"
            dp.save_checkpoint(loader.state_dict(), checkpoint)  # atomic: never half-written
        size = checkpoint.stat().st_size
        print(f"interrupted epoch 1 after {stop_after} batches; saved {checkpoint} ({size} bytes)")

        result = folder / "resumed.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "datapipes",
                "demo",
                "--resume",
                str(checkpoint),
                "--data",
                str(folder),
                "--out",
                str(result),
                "--workers",
                str(workers),
            ],
            check=True,
        )
        resumed = json.loads(result.read_text())
        print(
            f"a new process resumed: {len(resumed['epoch1'])} more batches in epoch 1, "
            f"{len(resumed['epoch2'])} in epoch 2"
        )

        epoch_1_ok = seen + resumed["epoch1"] == epochs[1]
        epoch_2_ok = resumed["epoch2"] == epochs[2]
        ids = [i for b in epochs[1] for i in b]
        print(f"epoch 1: interrupted + resumed == uninterrupted: {epoch_1_ok}")
        print(f"epoch 2 after the resume == uninterrupted epoch 2: {epoch_2_ok}")
        print(
            f"epoch 1 delivered {len(ids)} samples, {len(set(ids))} distinct "
            f"(nothing lost or repeated: {len(ids) == len(set(ids))})"
        )
        print(f"epochs 1 and 2 differ in order: {epochs[1] != epochs[2]}")
        ok = epoch_1_ok and epoch_2_ok and len(ids) == len(set(ids))
        print("RESULT: exact resume " + ("verified" if ok else "FAILED"))
        return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="datapipes demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="keep the generated data and checkpoint here")
    parser.add_argument(
        "--workers", type=int, default=2, help="DataLoader worker processes (0: in-process)"
    )
    parser.add_argument("--resume", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.resume:
        resume_phase(args.data, args.resume, args.out, args.workers)
        return 0
    return 0 if run_demo(args.workdir, workers=args.workers) else 1
