"""webdataset parity: shards written by webdataset's own ShardWriter and TarWriter (images,
cls, json, npy, npz, txt, pth, gzipped fields, keys with dots, upper-case extensions, several
shards and a .tar.gz) read with dp.files(...).read_tar().decode(...) and with
webdataset.WebDataset(...).decode(...), every decoded field of every sample compared; our
key/field rule against webdataset's on every short name; resume and dealing over those shards.

Known differences, each pinned by a test here: webdataset adds ``__local_path__``; its
``"rgb8"`` images are numpy arrays where ours (``image="hwc"``) are tensors; its one-channel
images (``"torchl8"``) have no channel axis where ours keep one; a member named ``./x.jpg`` has
key ``./x`` there and ``x`` here, and a hidden file (``dir/.x.jpg``) is a field there (of key
``dir/``) and skipped here."""

from __future__ import annotations

import itertools
import json
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import datapipes as dp
from nodes.readers.tar.samples import split_name

wds = pytest.importorskip("webdataset", reason="the webdataset conformance tests need webdataset")
Image = pytest.importorskip("PIL.Image", reason="image decoding needs Pillow")

SHARD_SAMPLES = 10  # through ShardWriter, 4 per shard: 3 shards
GZ_SAMPLES = 3  # through TarWriter into one .tar.gz


def make_sample(i: int, rng: np.random.Generator) -> dict[str, Any]:
    """A sample as one hands it to webdataset's writers (its encoders make the bytes)."""
    # Keys: a dotted directory, dots in the key itself (webdataset's readers split at the
    # basename's first dot: key "s001", fields "crop.left.png", ...), upper case.
    key = (f"dir.v2/s{i:03d}", f"s{i:03d}.crop.left", f"S{i:03d}")[i % 3]
    return {
        "__key__": key,
        "png": rng.integers(0, 256, (5 + i % 3, 4, 3), dtype=np.uint8),
        "JPG": rng.integers(0, 256, (8, 6, 3), dtype=np.uint8),  # member "<key>.JPG"
        "gray.png": rng.integers(0, 256, (4, 3), dtype=np.uint8),  # a one-channel PNG
        "cls": int(rng.integers(0, 1000)),
        "inx": i,
        "json": {"i": i, "name": f"ü{i}", "values": [1.5, None, True]},
        "json.gz": {"zipped": i},  # the writer encodes json, then gzips (".gz")
        "npy": rng.normal(size=(2, i % 4)).astype(np.float32),
        "npz": {"a": np.arange(i, dtype=np.int64), "b": rng.normal(size=3)},
        "txt": f"caption {i} ü",
        "transcript": f"said {i}",
        "pth": torch.arange(i, dtype=torch.int16),
    }


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[str]:
    """The shard URLs, in sorted order (our listing is sorted; webdataset keeps its list's)."""
    root = tmp_path_factory.mktemp("wds")
    rng = np.random.default_rng(16)
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=4, verbose=0) as writer:
        for i in range(SHARD_SAMPLES):
            writer.write(make_sample(i, rng))
    with wds.TarWriter(str(root / "extra.tar.gz")) as writer:  # gzip, from the name
        for i in range(SHARD_SAMPLES, SHARD_SAMPLES + GZ_SAMPLES):
            writer.write(make_sample(i, rng))
    urls = sorted(str(path) for path in root.iterdir())
    assert [Path(u).name for u in urls] == [
        "extra.tar.gz",
        *(f"shard-{n:06d}.tar" for n in range(3)),
    ]
    with tarfile.open(urls[1]) as tar:  # the cases are really in the files
        names = tar.getnames()
    assert "dir.v2/s000.JPG" in names and "s001.crop.left.gray.png" in names
    with open(urls[0], "rb") as f:
        assert f.read(2) == b"\x1f\x8b"  # gzip
    return urls


# ----- comparing values ----------------------------------------------------------------------


def assert_same(ours: Any, theirs: Any, where: str) -> None:
    """Equal types and values: tensors by torch.equal, arrays by np.array_equal, images by
    mode, size and pixels, the rest by ==."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor), where
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), where
        assert torch.equal(ours, theirs), where
    elif isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), where
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), where
        assert np.array_equal(ours, theirs), where
    elif isinstance(theirs, Image.Image):
        assert isinstance(ours, Image.Image), where
        assert (ours.mode, ours.size) == (theirs.mode, theirs.size), where
        assert np.array_equal(np.asarray(ours), np.asarray(theirs)), where
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and sorted(ours) == sorted(theirs), where
        for name in theirs:
            assert_same(ours[name], theirs[name], f"{where}[{name!r}]")
    else:
        assert type(ours) is type(theirs) and ours == theirs, (where, ours, theirs)


def hwc_as_numpy(value: Any) -> Any:
    """Ours: an HWC uint8 tensor; webdataset's "rgb8": the same pixels as a numpy array."""
    return value.numpy() if isinstance(value, torch.Tensor) else value


def drop_channel_axis(value: Any) -> Any:
    """Ours: (1, H, W) for one-channel images; webdataset's "torchl8": (H, W)."""
    return value[0] if isinstance(value, torch.Tensor) else value


IMAGE_FIELDS = ("png", "jpg", "gray.png", "crop.left.png", "crop.left.jpg", "crop.left.gray.png")

# Our decode() options, webdataset's image spec, how our image value maps onto theirs.
SPECS = {
    "chw": ({"image": "chw"}, "torchrgb8", None),
    "hwc": ({"image": "hwc"}, "rgb8", hwc_as_numpy),
    "pil": ({"image": "pil"}, "pil", None),
    "gray": ({"image": "chw", "image_mode": "L"}, "torchl8", drop_channel_axis),
    "rgba": ({"image": "chw", "image_mode": "RGBA"}, "torchrgba8", None),
    "bytes": ({"image": None}, None, None),
}


def read_both(urls: list[str], spec: str) -> tuple[list[dict], list[dict]]:
    options, image_spec, _ = SPECS[spec]
    ours = list(dp.Loader(dp.files(urls).read_tar().decode(**options)))
    handlers = [] if image_spec is None else [image_spec]
    theirs = list(wds.WebDataset(urls, shardshuffle=False).decode(*handlers))
    return ours, theirs


@pytest.mark.parametrize("spec", list(SPECS))
def test_every_decoded_field_matches_webdataset(shards, spec):
    ours, theirs = read_both(shards, spec)
    assert len(ours) == len(theirs) == SHARD_SAMPLES + GZ_SAMPLES
    adapt = SPECS[spec][2] or (lambda value: value)
    for n, (mine, their) in enumerate(zip(ours, theirs, strict=True)):
        where = f"sample {n} ({their['__key__']} of {their['__url__']})"
        # webdataset adds the local path of the file it read (for a local file: the URL).
        assert their.pop("__local_path__") == their["__url__"]
        assert sorted(mine) == sorted(their), where
        for field, value in their.items():
            mapped = adapt(mine[field]) if field in IMAGE_FIELDS else mine[field]
            assert_same(mapped, value, f"{where}, field {field!r}")


def test_what_the_fields_are(shards):
    """What the comparison covers: the upper-case extension and the dotted keys split as
    webdataset splits them, and each field's decoded type."""
    ours = list(dp.Loader(dp.files(shards).read_tar().decode()))
    first = next(s for s in ours if s["__key__"] == "dir.v2/s000")
    assert first["__url__"] == shards[1]
    assert first["jpg"].shape == (3, 8, 6) and first["png"].shape == (3, 5, 4)
    assert first["gray.png"].shape == (3, 4, 3)  # converted to RGB, as image_mode="RGB" says
    assert first["json"] == {"i": 0, "name": "ü0", "values": [1.5, None, True]}
    assert first["json.gz"] == {"zipped": 0} and first["inx"] == 0
    assert first["txt"] == "caption 0 ü" and first["transcript"] == "said 0"
    assert isinstance(first["cls"], int) and first["npy"].dtype == np.float32
    assert sorted(first["npz"]) == ["a", "b"] and first["pth"].dtype == torch.int16
    dotted = next(s for s in ours if s["__key__"] == "s001")
    assert {"crop.left.jpg", "crop.left.cls", "crop.left.json"} <= set(dotted)
    assert dotted["crop.left.jpg"].shape == (3, 8, 6)  # decoded by its last extension
    assert Counter(s["__url__"] for s in ours) == {
        shards[0]: GZ_SAMPLES,
        shards[1]: 4,
        shards[2]: 4,
        shards[3]: 2,
    }


def test_key_and_field_rule_agrees_with_webdataset_on_every_short_name():
    """Every name up to 6 characters over ``a B . / _``: our split equals webdataset's
    (``base_plus_ext`` and the lower-cased field), except the two documented cases."""
    from webdataset.tariterators import base_plus_ext

    compared = 0
    for length in range(1, 7):
        for chars in itertools.product("aB./_", repeat=length):
            name = "".join(chars)
            ours = split_name(name)
            # A tar of "." names its members ./x: one leading "./" is not part of the key here.
            dot_slash = name.startswith("./")
            key, field = base_plus_ext(name[2:] if dot_slash else name)
            theirs = None if key is None else (key, field.lower())
            # A hidden file: webdataset makes "dir/" the key of "dir/.x.jpg"; we skip the file.
            if name.rsplit("/", 1)[-1].startswith("."):
                assert ours is None, name
            else:
                assert ours == theirs, name
                compared += not dot_slash
    assert compared > 14_000  # of 19,530 names: the rest are hidden or start with ./


def test_field_rules_match_webdataset_default_decoder():
    """One sample through our default decoders and webdataset's default Decoder (no image
    handler on either side): gzipped fields (decoded by the inner extension, or gunzipped to
    bytes), the last extension deciding, whitespace around labels."""
    import gzip
    import io

    from webdataset.autodecode import Decoder

    npz = io.BytesIO()
    np.savez(npz, a=np.arange(3), b=np.eye(2))
    sample = {
        "__key__": "k",
        "__url__": "u.tar",
        "cls": b" 7\n",
        "inx": b"12",
        "seg.id": b"5",
        "transcript": "hé".encode(),
        "npz": npz.getvalue(),
        "json.gz": gzip.compress(b'{"a": [1, 2]}'),
        "meta.txt.gz": gzip.compress("zipped ü".encode()),
        "blob.gz": gzip.compress(b"raw"),
        "gz": gzip.compress(b"bare"),
        "unknown": b"left alone",
        "png": b"not decoded by either without an image handler",
    }
    (ours,) = dp.Loader(dp.from_sequence([sample]).decode(image=None))
    theirs = Decoder([])(dict(sample))
    assert sorted(ours) == sorted(theirs)
    for field in theirs:
        assert_same(ours[field], theirs[field], field)
    assert ours["blob.gz"] == b"raw" and ours["json.gz"] == {"a": [1, 2]}


def test_gzip_rule_gives_way_to_explicit_decoders_and_reports_damage():
    import gzip

    data = gzip.compress(b'{"a": 1}')
    sample = {"__key__": "k", "__url__": "u.tar", "json.gz": data}

    def decode(**options: Any) -> Any:
        (out,) = dp.Loader(dp.from_sequence([sample]).decode(**options))
        return out["json.gz"]

    assert decode(decoders={"gz": None}) == data  # off for every gzipped field
    assert decode(decoders={"json.gz": len}) == len(data)  # the field's own decoder
    assert decode(decoders={"json": None}) == b'{"a": 1}'  # gunzipped, left as bytes
    broken = dict(sample, **{"json.gz": data[:-6]})  # cut: the gzip trailer is missing
    with pytest.raises(dp.BadRecordError, match=r"u\.tar.*'k'.*'json\.gz'.*cannot decode"):
        list(dp.Loader(dp.from_sequence([broken]).decode()))


# ----- resume and dealing over these shards ----------------------------------------------------


def stream(urls: list[str]) -> dp.DataPipe[Any]:
    return dp.files(urls).shuffle().read_tar().decode().shuffle(buffer_size=5)


def ident(sample: dict[str, Any]) -> tuple[str, str]:
    return sample["__url__"], sample["__key__"]


def test_resume_mid_epoch_gives_the_uninterrupted_samples(shards):
    whole = list(dp.Loader(stream(shards), seed=3))
    assert sorted(map(ident, whole)) == sorted(
        ident(s) for s in wds.WebDataset(shards, shardshuffle=False)
    )
    for stop in range(1, len(whole), 2):  # inside files, at their ends, in the shuffle buffer
        first = dp.Loader(stream(shards), seed=3)
        head = list(itertools.islice(first, stop))
        state = json.loads(json.dumps(first.state_dict()))  # plain data, as a checkpoint holds
        first.close()
        second = dp.Loader(stream(shards), seed=3)
        second.load_state_dict(state)
        resumed = head + list(second)
        assert [ident(s) for s in resumed] == [ident(s) for s in whole], stop
        for mine, reference in zip(resumed, whole, strict=True):
            assert_same(mine, reference, f"stop {stop}, {ident(reference)}")


def test_two_ranks_read_every_sample_exactly_once(shards):
    everything = Counter(ident(s) for s in wds.WebDataset(shards, shardshuffle=False))
    got: Counter[tuple[str, str]] = Counter()
    for rank in range(2):
        got.update(ident(s) for s in dp.Loader(stream(shards), seed=3, rank=rank, world_size=2))
    assert got == everything


@pytest.mark.slow
def test_two_ranks_with_two_workers_each_read_once_and_resume_exactly(shards):
    everything = Counter(ident(s) for s in wds.WebDataset(shards, shardshuffle=False))
    got: Counter[tuple[str, str]] = Counter()
    for rank in range(2):
        settings = {"seed": 3, "rank": rank, "world_size": 2, "num_workers": 2}
        whole = [ident(s) for s in dp.Loader(stream(shards), **settings)]
        got.update(whole)
        first = dp.Loader(stream(shards), **settings)
        head = [ident(s) for s in itertools.islice(first, len(whole) // 2)]
        state = first.state_dict()
        first.close()
        second = dp.Loader(stream(shards), **settings)
        second.load_state_dict(state)
        assert head + [ident(s) for s in second] == whole
    assert got == everything


@pytest.mark.skipif(
    not __import__("importlib").util.find_spec("torchaudio"),
    reason="webdataset decodes audio only through torchaudio (its torch_audio handler), "
    "which is not installed; tests/media/test_audio.py checks our decoder against soundfile",
)
def test_wav_matches_webdataset_torch_audio(tmp_path):
    sf = pytest.importorskip("soundfile")
    import io

    t = np.arange(4000) / 16_000
    wave = np.round(np.stack([np.sin(2 * np.pi * 440 * t)] * 2, axis=1) * 20_000).astype(np.int16)
    buffer = io.BytesIO()
    sf.write(buffer, wave, 16_000, format="WAV", subtype="PCM_16")
    url = str(tmp_path / "audio.tar")
    with wds.TarWriter(url) as writer:
        writer.write({"__key__": "clip", "wav": buffer.getvalue()})
    (ours,) = dp.Loader(dp.files(url).read_tar().decode())
    (theirs,) = wds.WebDataset(url, shardshuffle=False).decode(wds.torch_audio)
    assert_same(ours["wav"][0], theirs["wav"][0], "waveform")
    assert ours["wav"][1] == theirs["wav"][1] == 16_000
