# %% [markdown]
# # Files and formats: JSONL, CSV, npy and tar shards from any fsspec URL
#
# `dp.files(...)` names files by path, glob or brace range on any filesystem
# fsspec knows (local disk, `memory://`, HTTP, object stores). A `read_*` step
# turns them into records; `.decode()` turns tar fields into objects. Files are
# dealt to ranks and workers; a checkpoint holds a byte offset, so a resume
# seeks instead of re-reading. Run `python tutorials/files_and_formats.py`;
# it asserts what it shows. (Image decoding needs Pillow:
# `pip install -e ".[images]"`; the test extra includes it.)

# %%
import io
import json
import tarfile
import tempfile
import warnings
from pathlib import Path

import fsspec
import numpy as np
from PIL import Image

import datapipes as dp

workdir = Path(tempfile.mkdtemp(prefix="datapipes-files-"))

# %% [markdown]
# ## JSON lines, sharded over files
#
# Four shards of 250 records each. The listing is sorted, so every process
# sees the same files in the same order.

# %%
for shard in range(4):
    with open(workdir / f"train-{shard:02d}.jsonl", "w") as f:
        for i in range(shard * 250, (shard + 1) * 250):
            f.write(json.dumps({"id": i, "text": f"record {i}", "label": i % 10}) + "\n")

records = dp.files(str(workdir / "train-{00..03}.jsonl")).read_jsonl()
ids = [r["id"] for r in dp.Loader(records)]
assert ids == list(range(1000))

# Two ranks: each reads two of the four files; together they read everything once.
per_rank = [[r["id"] for r in dp.Loader(records, rank=r, world_size=2)] for r in range(2)]
print("rank sizes:", [len(ids) for ids in per_rank])
assert sorted(per_rank[0] + per_rank[1]) == list(range(1000))

# With fewer files than consumers, files are split at line boundaries instead.
one_file = dp.files(str(workdir / "train-00.jsonl")).read_jsonl()
split = [[r["id"] for r in dp.Loader(one_file, rank=r, world_size=3)] for r in range(3)]
print("one file over 3 ranks:", [len(part) for part in split])
assert sorted(sum(split, [])) == list(range(250))

# %% [markdown]
# ## A training-style pipeline, checkpointed in the middle of a file
#
# `.shuffle()` on the file list reorders files every epoch (the same order on
# every rank); `.shuffle(1000)` after reading mixes records in a buffer.

# %%
pipe = (
    dp.files(str(workdir / "train-*.jsonl"))
    .shuffle()
    .read_jsonl()
    .map(lambda r: {"label": r["label"], "length": len(r["text"])})
    .shuffle(1000)
    .batch(64)
)
loader = dp.Loader(pipe, seed=7)
batches = iter(loader)
for _ in range(5):
    next(batches)
state = json.loads(json.dumps(loader.state_dict()))  # plain data
rest = [b["label"].tolist() for b in batches]

resumed = dp.Loader(pipe, seed=7)
resumed.load_state_dict(state)
assert [b["label"].tolist() for b in resumed] == rest
print("resumed mid-file: identical stream of", len(rest), "batches")

# %% [markdown]
# ## CSV on an in-memory filesystem, and NumPy rows

# %%
with fsspec.open("memory://tutorial/table.csv", "w") as f:
    f.write('name,comment\nada,"likes, commas"\nbob,"two\nlines"\n')
rows = list(dp.Loader(dp.files("memory://tutorial/table.csv").read_csv()))
print(rows)
assert rows[1] == {"name": "bob", "comment": "two\nlines"}

np.save(workdir / "features.npy", np.arange(30, dtype=np.float32).reshape(10, 3))
features = list(dp.Loader(dp.files(str(workdir / "features.npy")).read_npy()))
assert len(features) == 10 and features[2].tolist() == [6.0, 7.0, 8.0]

# %% [markdown]
# ## Webdataset-style tar shards with images
#
# Members that share a key (`sample0001.png`, `sample0001.cls`) form one
# sample; `.decode()` turns `png` into a uint8 CHW tensor and `cls` into an int.

# %%
with tarfile.open(workdir / "images-0.tar", "w") as tar:
    for i in range(8):
        pixels = np.full((4, 6, 3), i * 10, dtype=np.uint8)
        png = io.BytesIO()
        Image.fromarray(pixels).save(png, format="PNG")
        for field, data in (("png", png.getvalue()), ("cls", str(i % 2).encode())):
            info = tarfile.TarInfo(f"sample{i:04d}.{field}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

images = dp.files(str(workdir / "images-*.tar")).read_tar().decode().batch(4)
first = next(iter(dp.Loader(images)))
print(first["__key__"], first["png"].shape, first["cls"])
assert tuple(first["png"].shape) == (4, 3, 4, 6) and first["cls"].tolist() == [0, 1, 0, 1]

# Loose files work the same way: `read_bytes()` gives one sample per file,
# named like a tar sample, so `.decode()` applies unchanged (here HWC layout).
(workdir / "loose").mkdir()
Image.fromarray(np.zeros((2, 3, 3), dtype=np.uint8)).save(workdir / "loose" / "a.png")
(workdir / "loose" / "a.txt").write_text("a caption\nsecond line\n")
loose = list(dp.Loader(dp.files(str(workdir / "loose" / "*")).read_bytes().decode(image="hwc")))
print([(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in loose])
assert tuple(loose[0]["png"].shape) == (2, 3, 3) and loose[1]["txt"].startswith("a caption")

# `read_lines()` gives the raw text lines, one `str` each.
caption_lines = list(dp.Loader(dp.files(str(workdir / "loose" / "*.txt")).read_lines()))
assert caption_lines == ["a caption", "second line"]

# %% [markdown]
# ## Bad records: an error that says where, or skip and count
#
# By default a malformed line stops the pipeline with an error naming the
# file and line. `on_error="skip"` skips it instead, warns once, and counts it
# in `loader.skipped()`.

# %%
with open(workdir / "dirty.jsonl", "w") as f:
    f.write('{"id": 1}\n{"id": 2, oops\n{"id": 3}\n')

try:
    list(dp.Loader(dp.files(str(workdir / "dirty.jsonl")).read_jsonl()))
except dp.BadRecordError as error:
    print("error:", error)
    assert "dirty.jsonl" in str(error) and "line 2" in str(error)

lenient = dp.Loader(dp.files(str(workdir / "dirty.jsonl")).read_jsonl(on_error="skip"))
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    kept = [r["id"] for r in lenient]
print("kept", kept, "skipped", lenient.skipped())
assert kept == [1, 3] and list(lenient.skipped().values()) == [1]

# %%
import shutil  # noqa: E402

shutil.rmtree(workdir)
