# %% [markdown]
# # Files and formats: JSONL, CSV, npy and tar shards, on disk, in memory, over HTTP
#
# `dp.files(...)` names files by path, list, glob or brace range on any
# filesystem fsspec knows: local disk, `memory://`, `http://`, object stores
# (`s3://`, `gs://`, ... with their fsspec packages). A `read_*` step turns
# files into records and `.decode()` turns the fields of tar samples (images,
# labels, JSON) into objects. Files are dealt to ranks and workers, and a
# reader's checkpoint holds a byte offset, so a resume seeks instead of
# re-reading the files before it.
#
# This tutorial writes one small dataset in four formats, serves the same
# files from a local folder, an in-memory filesystem and a real HTTP server
# on 127.0.0.1, and checks that every reader gives the same records from all
# three. Then: sharding, a checkpoint in the middle of a file read over HTTP,
# images, compressed files, and bad records. (HTTP needs `aiohttp` and images
# need Pillow: `pip install -e ".[http,images]"`; the test extra has both.)
#
# Run `python tutorials/02_files_and_formats.py`; it asserts what it shows.

# %%
import csv
import functools
import gzip
import http.server
import io
import json
import shutil
import tarfile
import tempfile
import threading
import warnings
from pathlib import Path

import fsspec
import numpy as np
from PIL import Image

import datapipes as dp

# %% [markdown]
# ## One dataset, four formats
#
# * `train-00.jsonl` ... `train-03.jsonl`: 2,500 JSON records each (115 KiB);
# * `table.csv`: a header and rows, with a quoted comma and a quoted line break;
# * `features.npy`: a 10 x 3 float32 array;
# * `images-0.tar`, `images-1.tar`: webdataset-style shards, where members that
#   share a key (`sample0003.png`, `sample0003.cls`) form one sample.

# %%
local = Path(tempfile.mkdtemp(prefix="datapipes-files-"))

for shard in range(4):
    with open(local / f"train-{shard:02d}.jsonl", "w") as f:
        for i in range(shard * 2500, (shard + 1) * 2500):
            f.write(json.dumps({"id": i, "text": f"record {i}", "label": i % 10}) + "\n")

with open(local / "table.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["name", "comment"])
    writer.writerows([["ada", "likes, commas"], ["bob", "two\nlines"], ["cy", "plain"]])

np.save(local / "features.npy", np.arange(30, dtype=np.float32).reshape(10, 3))


def png_bytes(value: int) -> bytes:
    pixels = np.full((4, 6, 3), value, dtype=np.uint8)  # a 4 x 6 RGB image of one colour
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


for shard in range(2):
    members = []
    for i in range(shard * 8, (shard + 1) * 8):
        members += [
            (f"sample{i:04d}.png", png_bytes(i * 10)),
            (f"sample{i:04d}.cls", b"%d" % (i % 2)),
        ]
    write_tar(local / f"images-{shard}.tar", members)
print(sorted(p.name for p in local.iterdir()))

# %% [markdown]
# ## The same files in memory and over HTTP
#
# `memory://` is fsspec's in-process filesystem (handy in tests). The HTTP
# server is the standard library's, what `python -m http.server` runs: it
# lists directories, which `dp.files` globs through, but it does not answer
# `Range` requests, so files are read from their start as a stream (a resume
# then re-downloads the bytes before its offset; object stores and most web
# servers do answer ranges and seek directly).

# %%
memory = "memory://tutorial-files"
for path in local.iterdir():
    with fsspec.open(f"{memory}/{path.name}", "wb") as f:
        f.write(path.read_bytes())


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """``python -m http.server``'s handler, minus a log line per request."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):  # a client that read enough hung up
            pass


server = http.server.ThreadingHTTPServer(
    ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(local))
)
threading.Thread(target=server.serve_forever, daemon=True).start()
http_root = f"http://127.0.0.1:{server.server_address[1]}"

ROOTS = {"local": str(local), "memory": memory, "http": http_root}
print(ROOTS)

# %% [markdown]
# ## Every reader, on every filesystem
#
# * `read_jsonl()`: one JSON value per line (blank lines ignored);
# * `read_csv()`: a `dict` per row, keyed by the header (values are strings);
# * `read_npy()`: the rows of an array (`rows=False`: one array per file);
# * `read_tar()`: one dict per sample, `{"__key__", "__url__", "png": b"...",
#   "cls": b"1"}`, and `.decode()` makes the PNG a uint8 tensor (channels,
#   height, width) and the class an int.
#
# The listing of a glob is sorted, so every process sees the same files in
# the same order, on any filesystem.


# %%
def readers(root: str) -> dict[str, dp.DataPipe]:
    return {
        "jsonl": dp.files(f"{root}/train-*.jsonl").read_jsonl(),
        "csv": dp.files(f"{root}/table.csv").read_csv(),
        "npy": dp.files(f"{root}/features.npy").read_npy(),
        "tar": dp.files(f"{root}/images-{{0..1}}.tar").read_tar().decode(),
    }


def comparable(record):
    """Records minus the URL they came from, with arrays and tensors as lists."""
    if isinstance(record, dict):
        return {k: comparable(v) for k, v in record.items() if k != "__url__"}
    return record.tolist() if hasattr(record, "tolist") else record


results = {
    fs: {fmt: [comparable(r) for r in dp.Loader(pipe)] for fmt, pipe in readers(root).items()}
    for fs, root in ROOTS.items()
}
for fmt in readers(str(local)):
    counts = {fs: len(results[fs][fmt]) for fs in ROOTS}
    print(f"{fmt:5}: {counts}")
    assert results["local"][fmt] == results["memory"][fmt] == results["http"][fmt]

assert [r["id"] for r in results["local"]["jsonl"]] == list(range(10_000))
assert results["local"]["csv"][1] == {"name": "bob", "comment": "two\nlines"}
assert results["local"]["npy"][2] == [6.0, 7.0, 8.0]
first_image = next(iter(dp.Loader(readers(http_root)["tar"])))
print(first_image["__key__"], first_image["__url__"], tuple(first_image["png"].shape))
assert tuple(first_image["png"].shape) == (3, 4, 6) and first_image["cls"] == 0
print("every reader gives the same records from local disk, memory:// and HTTP")

# %% [markdown]
# ## Files are dealt to consumers
#
# With two ranks (given explicitly here; under `torchrun` they come from
# `torch.distributed`), each reads two of the four JSONL files and together
# they read everything once. Whole files are dealt round-robin, so 4 files
# over 3 ranks give 2, 1 and 1 files: uneven shares, which `even_batches`
# evens out under DDP (tutorial 6). With fewer files than consumers, files
# are split at line boundaries instead (a record belongs to the part its
# first byte is in), so nobody idles and nothing is read twice.

# %%
records = dp.files(f"{http_root}/train-*.jsonl").read_jsonl()
per_rank = [[r["id"] for r in dp.Loader(records, rank=r, world_size=2)] for r in range(2)]
print("4 files over 2 ranks:", [len(ids) for ids in per_rank])
assert sorted(per_rank[0] + per_rank[1]) == list(range(10_000))

one_file = dp.files(f"{local}/train-00.jsonl").read_jsonl()
parts = [[r["id"] for r in dp.Loader(one_file, rank=r, world_size=3)] for r in range(3)]
print("1 file over 3 ranks:", [len(part) for part in parts])
assert sorted(sum(parts, [])) == list(range(2500))

# %% [markdown]
# ## A checkpoint in the middle of a file
#
# A reader's state is the file, a byte offset and a record index: the
# position of the last record handed out. A resumed Loader reopens that file
# at that offset (over HTTP: a request from there, or on this server, which
# ignores `Range`, a download up to there) and reads on. `describe_checkpoint`
# (what `python -m datapipes inspect` prints) shows the position step by step.

# %%
from datapipes.inspect import describe_checkpoint  # noqa: E402


def features(record: dict) -> dict:
    return {"label": record["label"], "length": len(record["text"])}


def resume_is_exact(pipe: dp.DataPipe, stop: int) -> dict:
    """Stop after ``stop`` batches, resume in a fresh Loader; return the saved state."""
    reference = [b["label"].tolist() for b in dp.Loader(pipe, seed=7)]
    loader = dp.Loader(pipe, seed=7)
    batches = iter(loader)
    head = [next(batches)["label"].tolist() for _ in range(stop)]
    state = json.loads(json.dumps(loader.state_dict()))  # plain data
    loader.close()
    resumed = dp.Loader(pipe, seed=7)
    resumed.load_state_dict(state)
    assert head + [b["label"].tolist() for b in resumed] == reference
    return state


reader = dp.files(f"{http_root}/train-*.jsonl").shuffle().read_jsonl().map(features).batch(64)
state = resume_is_exact(reader, stop=75)  # 4,800 records: in the middle of the second file
shown = describe_checkpoint({"data": state})
print(shown.splitlines()[-1].strip())
assert "cursor=[" in shown  # [byte offset, line, block]: a real position inside the file
print("resumed over HTTP at a byte offset: identical stream")

# %% [markdown]
# A buffer shuffle after the reader holds positions, never records: its
# state is an *anchor* (the reader's state at some earlier point) and which
# records sit in the buffer. A resume reopens the file at the anchor and
# re-reads a window of records, about `buffer_size * ln(buffer_size)`
# whatever the position in the epoch, to refill the buffer exactly.

# %%
shuffled = (
    dp.files(f"{http_root}/train-*.jsonl")
    .shuffle()  # file order, new every epoch, the same on every rank
    .read_jsonl()
    .map(features)
    .shuffle(500)  # records, within a buffer of 500
    .batch(64)
)
state = resume_is_exact(shuffled, stop=60)
buffer_line = next(
    line for line in describe_checkpoint({"data": state}).splitlines() if "anchor_seq" in line
)
print(buffer_line.strip().split(": ", 1)[1])
assert "re-reads" in buffer_line
print("resumed inside the buffer shuffle: identical stream")

# %% [markdown]
# ## Images: tar shards and loose files
#
# `.decode()` picks a decoder by field extension: images (`jpg`, `png`,
# `webp`, ... through Pillow) become uint8 tensors, `image="chw"` (default)
# or `"hwc"`, or `"pil"` for PIL images; `cls`/`index`/`id` become ints,
# `json` objects, `txt` strings, `npy` arrays. `decoders={...}` adds or
# overrides one by extension or full field name. Decoded images batch into
# one tensor.

# %%
images = dp.files(f"{memory}/images-*.tar").read_tar().decode().batch(4)
batch = next(iter(dp.Loader(images)))
print(batch["__key__"], tuple(batch["png"].shape), batch["cls"])
assert tuple(batch["png"].shape) == (4, 3, 4, 6) and batch["cls"].tolist() == [0, 1, 0, 1]
assert batch["png"][1].unique().tolist() == [10]  # sample 1 was painted with value 10

as_float = {"png": lambda data: np.asarray(Image.open(io.BytesIO(data)), np.float32) / 255}
custom = next(
    iter(dp.Loader(dp.files(f"{local}/images-0.tar").read_tar().decode(decoders=as_float)))
)
assert custom["png"].dtype == np.float32 and custom["png"].shape == (4, 6, 3)

# Loose files: `read_bytes()` gives one sample per file, named like a tar
# sample (`a.png` -> key "a", field "png"), so `.decode()` applies unchanged.
(local / "loose").mkdir()
Image.fromarray(np.zeros((2, 3, 3), dtype=np.uint8)).save(local / "loose" / "a.png")
(local / "loose" / "b.txt").write_text("a caption\nsecond line\n")
loose = list(dp.Loader(dp.files(f"{local}/loose/*").read_bytes().decode(image="hwc")))
print([(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in loose])
assert tuple(loose[0]["png"].shape) == (2, 3, 3) and loose[1]["txt"].startswith("a caption")

# `read_lines()` gives the raw text lines, one `str` each.
assert list(dp.Loader(dp.files(f"{local}/loose/*.txt").read_lines())) == [
    "a caption",
    "second line",
]

# %% [markdown]
# ## Compressed files
#
# `.gz`, `.bz2`, `.xz` and `.zst` (with `zstandard`) are decompressed
# transparently, on any filesystem. A compressed file cannot seek, so a
# resume inside one decompresses that file from its start (never the files
# before it).

# %%
with gzip.open(local / "packed.jsonl.gz", "wt") as f:
    f.writelines(json.dumps({"id": i}) + "\n" for i in range(100))
packed = [r["id"] for r in dp.Loader(dp.files(f"{http_root}/packed.jsonl.gz").read_jsonl())]
assert packed == list(range(100))

# %% [markdown]
# ## Bad records: an error that says where, or skip and count
#
# By default a malformed line, an undecodable image or a missing file stops
# the pipeline with an error naming the file and the place. With
# `on_error="skip"` the reader (or decoder) skips it instead, warns once
# (`dp.BadRecordWarning`) and counts it: `loader.skipped()` maps each step
# to its count, and the counts are part of the checkpoint. Nothing is
# dropped silently.

# %%
with open(local / "dirty.jsonl", "w") as f:
    f.write('{"id": 1}\n{"id": 2, oops\n{"id": 3}\n{"id": 4\n{"id": 5}\n')
write_tar(local / "broken.tar", [("s0.png", b"not a png"), ("s0.cls", b"0")])

try:
    list(dp.Loader(dp.files(f"{http_root}/dirty.jsonl").read_jsonl()))
except dp.BadRecordError as error:
    print("error:", error)
    assert "dirty.jsonl" in str(error) and "line 2" in str(error)
else:
    raise AssertionError("a malformed line must raise")

try:
    list(dp.Loader(dp.files(f"{local}/broken.tar").read_tar().decode()))
except dp.BadRecordError as error:
    print("error:", str(error)[:100])
    assert "'s0'" in str(error) and "'png'" in str(error)
else:
    raise AssertionError("an image that does not decode must raise")

lenient_lines = dp.files(f"{http_root}/dirty.jsonl").read_jsonl(on_error="skip")
lenient_images = (
    dp.files([f"{local}/images-0.tar", f"{local}/broken.tar", f"{local}/missing.tar"])
    .read_tar(on_error="skip")  # the missing file: one skip
    .decode(on_error="skip")  # the sample whose png does not decode: one skip
)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", dp.BadRecordWarning)
    lines_loader, images_loader = dp.Loader(lenient_lines), dp.Loader(lenient_images)
    kept = [r["id"] for r in lines_loader]
    samples = list(images_loader)
print("kept", kept, "skipped", list(lines_loader.skipped().values()))
print(f"{len(samples)} images kept; skipped per step:")
for step, count in images_loader.skipped().items():
    print(f"  {count} in {step}")
print(f"{len(caught)} warnings (one per step that skipped)")
assert kept == [1, 3, 5] and list(lines_loader.skipped().values()) == [2]
assert len(samples) == 8 and sorted(images_loader.skipped().values()) == [1, 1]
assert len(caught) == 3

# `skipped()` counts one per lost file, whatever it held; `losses()` says what
# was lost, step by step: records (where the format can count them), whole
# files, files lost from some offset on ("ranges"), and the bytes not read.
losses = images_loader.losses()  # keyed like skipped(): by each step's recipe
reader_losses = next(v for step, v in losses.items() if step.endswith("read_tar(on_error='skip')"))
decode_losses = next(v for step, v in losses.items() if step.endswith("decode(on_error='skip')"))
print("read_tar lost:", reader_losses, "decode lost:", decode_losses)
assert reader_losses["files"] == 1 and reader_losses["records"] == 0  # missing.tar, whole
assert decode_losses["records"] == 1 and decode_losses["files"] == 0  # the bad png

# %% [markdown]
# The counts are part of the checkpoint: a Loader resumed after the bad line
# still reports it, and counts nothing twice.

# %%
loader = dp.Loader(lenient_lines)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dp.BadRecordWarning)
    lines = iter(loader)
    assert [next(lines)["id"], next(lines)["id"]] == [1, 3]  # line 2 was skipped on the way
    state = loader.state_dict()
    resumed = dp.Loader(lenient_lines)
    resumed.load_state_dict(state)
    assert [r["id"] for r in resumed] == [5]
print("after the resume, skipped:", list(resumed.skipped().values()))
assert list(resumed.skipped().values()) == [2]

# %% [markdown]
# ## Hostile input: a record too big to hold
#
# A small compressed file can hold a huge line (a 60 KB gzip file, a 60 MB
# line). Readers stop at `max_record_bytes` of one record (256 MiB unless the
# step says otherwise) before holding it whole: an error naming the file and
# offset, or, with `on_error="skip"`, a counted skip.

# %%
bomb = local / "bomb.jsonl.gz"
text = '{"id": 1}\n{"pad": "' + "x" * (60 << 20) + '"}\n{"id": 3}\n'
bomb.write_bytes(gzip.compress(text.encode()))
print(f"{bomb.stat().st_size:,} bytes on disk")
guarded = dp.files(str(bomb)).read_jsonl(max_record_bytes=1 << 20, on_error="skip")
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dp.BadRecordWarning)
    guarded_loader = dp.Loader(guarded)
    assert [r["id"] for r in guarded_loader] == [1, 3]
print("skipped:", list(guarded_loader.skipped().values()))

# %% [markdown]
# ## Secrets in URLs
#
# Credentials belong in storage options or the environment, but a URL that
# carries them (`http://user:password@host/...`, a pre-signed URL) is shown,
# stored and fingerprinted without them, so a checkpoint resumes after a
# password rotation or a re-signing.

# %%
from nodes.credentials import shown_url  # noqa: E402

print(shown_url("https://user:hunter2@host/a.jsonl?X-Amz-Signature=f00d&version=2"))
signed = dp.files("https://host/a.jsonl?X-Amz-Signature=f00d&X-Amz-Expires=900")
resigned = dp.files("https://host/a.jsonl?X-Amz-Signature=beef&X-Amz-Expires=600")
assert signed.fingerprint() == resigned.fingerprint() and "f00d" not in repr(signed)

# %%
server.shutdown()
server.server_close()
fsspec.filesystem("memory").rm(memory, recursive=True)
shutil.rmtree(local)
