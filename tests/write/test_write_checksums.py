"""dp.write's shard checksums: what the manifest says, what ``Manifest.verify`` finds.

Real files in ``tmp_path`` and ``memory://``; the checksums are checked against
zlib and hashlib over the files' bytes.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path
from typing import Any

import fsspec
import pytest
from test_write import tree

import datapipes as dp
from datapipes.write.checksum import checksum_bytes, checksum_stream


def record(i: int) -> dict[str, Any]:
    return {"id": i, "text": f"row {i} " * (i % 5), "jpg": bytes([i % 256]) * (i % 90)}


def text_record(i: int) -> dict[str, Any]:
    return {"id": i, "text": f"row {i} " * (i % 5)}


def expected(algorithm: str, data: bytes) -> str:
    if algorithm == "crc32":
        return f"crc32:{zlib.crc32(data):08x}"
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@pytest.mark.parametrize("fmt", ["jsonl", "tar", "parquet"])
@pytest.mark.parametrize("algorithm", ["crc32", "sha256"])
def test_every_shard_entry_is_the_checksum_of_its_bytes(
    tmp_path: Path, fmt: str, algorithm: str
) -> None:
    manifest = dp.write(
        dp.range(57).map(text_record if fmt == "jsonl" else record), str(tmp_path / "o"),
        format=fmt, records_per_shard=10,
        checksum=algorithm, min_units=3,
    )  # fmt: skip
    assert len(manifest.shards) >= 6
    for shard in manifest.shards:
        data = (tmp_path / "o" / shard.name).read_bytes()
        assert (shard.bytes, shard.checksum) == (len(data), expected(algorithm, data))
    on_disk = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert [s["checksum"] for s in on_disk["shards"]] == [s.checksum for s in manifest.shards]
    assert on_disk["options"]["checksum"] == algorithm
    manifest.verify()
    dp.read_manifest(str(tmp_path / "o")).verify()


@pytest.mark.parametrize("fmt", ["tar", "parquet"])
def test_local_and_memory_destinations_write_the_same_bytes(tmp_path: Path, fmt: str) -> None:
    # on local disk pyarrow writes the shard's path itself, elsewhere a file object
    pipe = dp.range(33).map(record)
    local = dp.write(pipe, str(tmp_path / "o"), format=fmt, records_per_shard=8)
    memory = dp.write(pipe, f"memory://checksums/{fmt}", format=fmt, records_per_shard=8)
    assert local.shards == memory.shards
    fs = fsspec.filesystem("memory")
    for shard in memory.shards:
        assert (
            fs.cat(f"/checksums/{fmt}/{shard.name}") == (tmp_path / "o" / shard.name).read_bytes()
        )
    memory.verify()


def test_verify_names_every_damaged_truncated_or_missing_shard(tmp_path: Path) -> None:
    manifest = dp.write(dp.range(60).map(text_record), str(tmp_path / "o"), records_per_shard=10)
    clean = tree(tmp_path / "o")
    names = [shard.name for shard in manifest.shards]
    first, second, third = (tmp_path / "o" / name for name in names[:3])
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit: same size, other checksum
    first.write_bytes(bytes(data))
    second.write_bytes(second.read_bytes()[:-3])
    third.unlink()
    with pytest.raises(dp.ShardMismatchError) as caught:
        manifest.verify()
    message = str(caught.value)
    assert message.startswith(f"3 of the {len(names)} shards")
    assert f"{names[0]}: checksum crc32:" in message
    assert f"{names[1]}: {second.stat().st_size} bytes, the manifest says" in message
    assert f"{names[2]}: missing" in message
    assert not any(name in message for name in names[3:])
    # what the message says to do writes those units again, and nothing else
    for line in message.splitlines():
        if line.startswith("To write them again"):
            listed = line.partition("remove ")[2].partition(" from the destination")[0]
            for name in listed.split(", "):
                (tmp_path / "o" / name).unlink()
    again = dp.write(dp.range(60).map(text_record), str(tmp_path / "o"), records_per_shard=10)
    assert again.stats["units_written"] == 3
    assert tree(tmp_path / "o") == clean
    again.verify()


def test_a_manifest_entry_naming_an_unknown_algorithm_fails_verify(tmp_path: Path) -> None:
    dp.write(dp.range(12).map(text_record), str(tmp_path / "o"), records_per_shard=5)
    path = tmp_path / "o" / "manifest.json"
    value = json.loads(path.read_text())
    value["shards"][1]["checksum"] = "md5:" + "0" * 32
    path.write_text(json.dumps(value))
    with pytest.raises(dp.ShardMismatchError, match="names no known algorithm"):
        dp.read_manifest(str(tmp_path / "o")).verify()


def test_a_manifest_without_checksums_is_not_a_manifest(tmp_path: Path) -> None:
    dp.write(dp.range(12).map(text_record), str(tmp_path / "o"), records_per_shard=5)
    path = tmp_path / "o" / "manifest.json"
    value = json.loads(path.read_text())
    for shard in value["shards"]:
        shard["sha256"] = shard.pop("checksum")  # the layout of version 1
    path.write_text(json.dumps(value))
    with pytest.raises(ValueError, match="not a datapipes manifest"):
        dp.read_manifest(str(tmp_path / "o"))


def test_another_checksum_is_another_writes_output(tmp_path: Path) -> None:
    pipe = dp.range(20).map(text_record)
    dp.write(pipe, str(tmp_path / "o"))
    with pytest.raises(dp.WriteConflictError, match="other options"):
        dp.write(pipe, str(tmp_path / "o"), checksum="sha256")
    again = dp.write(pipe, str(tmp_path / "o"), checksum="sha256", overwrite=True)
    assert all(shard.checksum.startswith("sha256:") for shard in again.shards)


@pytest.mark.parametrize("algorithm", ["crc32", "sha256"])
@pytest.mark.parametrize("size", [0, 1, 4095, (8 << 20) + 17])
def test_a_stream_read_in_blocks_has_the_checksum_of_its_bytes(algorithm: str, size: int) -> None:
    import io

    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    assert checksum_bytes(algorithm, data) == expected(algorithm, data)
    assert checksum_stream(algorithm, io.BytesIO(data), block=1000) == expected(algorithm, data)
