"""dp.write: shards named by input unit, published whole, the same bytes on any topology.

Real files in ``tmp_path`` and ``memory://``; ranks as threads of this process (each
``dp.write`` returns only when every unit is written, so a rank's call needs the others
running); the kill tests with real processes are in test_write_kills.py.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

import datapipes as dp
from datapipes.write import PLAN
from datapipes.write.destination import META


def sample(i: int) -> dict[str, Any]:
    return {
        "__key__": f"s{i:05d}",
        "id": i,
        "text": f"record {i} " * (i % 7),
        "jpg": bytes([i % 256]) * (i % 50),
    }


def jsonl_sample(i: int) -> dict[str, Any]:
    return {"id": i, "text": f"record {i}", "squares": [i, i * i]}


def make_inputs(folder: Path, sizes: list[int]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    start = 0
    for number, size in enumerate(sizes):
        with open(folder / f"in-{number:02d}.jsonl", "w") as out:
            for i in range(start, start + size):
                out.write(json.dumps({"id": i, "text": f"line {i}"}) + "\n")
        start += size
    return str(folder / "*.jsonl")


def upper(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "text": record["text"].upper()}


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path (what a byte-for-byte comparison sees)."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def in_threads(world: int, call: Any) -> list[Any]:
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = call(rank)
        except BaseException as error:  # noqa: BLE001 - raised in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), "a rank's write hung"
    if errors:
        raise errors[0]
    return results


# ----- formats read back ------------------------------------------------------------------------


def test_jsonl_round_trip_in_input_order(tmp_path: Path) -> None:
    pattern = make_inputs(tmp_path / "in", [30, 5, 17])
    pipe = dp.files(pattern).read_jsonl().map(upper)
    manifest = dp.write(pipe, str(tmp_path / "out"), records_per_shard=8, min_units=3)
    back = list(dp.Loader(manifest.files().read_jsonl()))
    assert back == list(dp.Loader(pipe))  # every record once, in the unit order
    assert manifest.records == 52 and all(s.records <= 8 for s in manifest.shards)
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        [s.name for s in manifest.shards] + ["manifest.json", META]
    )
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk["fingerprint"] == pipe.fingerprint() and on_disk["records"] == 52


def test_tar_is_a_webdataset_with_fixed_headers(tmp_path: Path) -> None:
    import webdataset as wds

    manifest = dp.write(
        dp.range(40).map(sample), str(tmp_path / "out"), format="tar", records_per_shard=16
    )
    read = list(wds.WebDataset(manifest.urls(), shardshuffle=False))
    assert [r["__key__"] for r in read] == [f"s{i:05d}" for i in range(40)]
    assert read[9]["jpg"] == bytes([9]) * 9 and json.loads(read[9]["id"]) == 9
    assert read[9]["text"].decode() == sample(9)["text"]
    with tarfile.open(tmp_path / "out" / manifest.shards[0].name) as tar:
        members = tar.getmembers()
    assert {(m.mtime, m.uid, m.gid, m.uname, m.mode) for m in members} == {(0, 0, 0, "", 0o444)}
    ours = list(dp.Loader(manifest.files().read_tar()))
    assert [r["__key__"] for r in ours] == [f"s{i:05d}" for i in range(40)]


def test_parquet_reads_back_in_pyarrow_and_hf_datasets(tmp_path: Path) -> None:
    import datasets
    import pyarrow.parquet as pq

    manifest = dp.write(
        dp.range(30).map(jsonl_sample), str(tmp_path / "out"), format="parquet",
        records_per_shard=12,
    )  # fmt: skip
    rows = [row for url in manifest.urls() for row in pq.read_table(url).to_pylist()]
    assert rows == [jsonl_sample(i) for i in range(30)]
    hf = datasets.load_dataset("parquet", data_files=manifest.urls(), split="train")
    assert hf["id"] == list(range(30))


def test_a_default_key_names_the_unit_and_the_index(tmp_path: Path) -> None:
    manifest = dp.write(
        dp.range(6).map(lambda i: {"txt": str(i)}), str(tmp_path / "o"), format="tar", min_units=2
    )
    keys = [r["__key__"] for r in dp.Loader(manifest.files().read_tar())]
    assert keys == ["000000-00000000", "000000-00000001", "000000-00000002",
                    "000001-00000000", "000001-00000001", "000001-00000002"]  # fmt: skip


def test_bytes_per_shard_cuts_shards(tmp_path: Path) -> None:
    manifest = dp.write(
        dp.range(100).map(jsonl_sample), str(tmp_path / "o"), records_per_shard=None,
        bytes_per_shard=300, min_units=1,
    )  # fmt: skip
    assert len(manifest.shards) > 5
    assert all(shard.bytes < 300 + 80 for shard in manifest.shards)
    assert manifest.records == 100


# ----- the same bytes on any topology, again and again ------------------------------------------


def test_the_output_is_the_same_bytes_on_any_topology(tmp_path: Path) -> None:
    pattern = make_inputs(tmp_path / "in", [23, 61, 17, 35, 48])
    pipe = dp.files(pattern).read_jsonl().map(upper)
    options = {"format": "tar", "records_per_shard": 10}
    alone = tree(Path(dp.write(pipe.map(keyed), str(tmp_path / "one"), **options).url))
    three = in_threads(
        3,
        lambda r: dp.write(
            pipe.map(keyed), str(tmp_path / "three"), rank=r, world_size=3, **options
        ),
    )
    assert [m.records for m in three] == [184] * 3
    assert tree(tmp_path / "three") == alone


@pytest.mark.slow  # DataLoader worker processes
def test_the_output_written_by_workers_is_the_same_bytes(tmp_path: Path) -> None:
    pattern = make_inputs(tmp_path / "in", [23, 61, 17, 35, 48])
    pipe = dp.files(pattern).read_jsonl().map(upper)
    options = {"format": "tar", "records_per_shard": 10}
    alone = tree(Path(dp.write(pipe.map(keyed), str(tmp_path / "one"), **options).url))
    dp.write(pipe.map(keyed), str(tmp_path / "workers"), num_workers=2, **options)
    assert tree(tmp_path / "workers") == alone


def keyed(record: dict[str, Any]) -> dict[str, Any]:
    return {"__key__": f"k{record['id']:05d}", "json": record}


def test_writing_again_writes_nothing(tmp_path: Path) -> None:
    pipe = dp.range(50).map(jsonl_sample)
    first = dp.write(pipe, str(tmp_path / "o"), records_per_shard=7)
    before = tree(tmp_path / "o")
    again = dp.write(pipe, str(tmp_path / "o"), records_per_shard=7)
    assert again.stats["units_written"] == 0 and again.stats["units_found_done"] == 8
    assert again.shards == first.shards and tree(tmp_path / "o") == before


#: Records left before ``countdown_sample`` raises (``None``: it never does).
COUNTDOWN: dict[str, int | None] = {"left": None}


def countdown_sample(i: int) -> dict[str, Any]:
    if COUNTDOWN["left"] is not None:
        COUNTDOWN["left"] -= 1
        if COUNTDOWN["left"] == 0:
            raise RuntimeError("killed")
    return jsonl_sample(i)


def test_a_write_stopped_midway_finishes_with_the_same_bytes(tmp_path: Path) -> None:
    pipe = dp.range(80).map(countdown_sample)
    clean = tree(Path(dp.write(pipe, str(tmp_path / "clean"), records_per_shard=6).url))
    COUNTDOWN["left"] = 25
    try:
        with pytest.raises(RuntimeError, match="killed"):
            dp.write(pipe, str(tmp_path / "o"), records_per_shard=6)
    finally:
        COUNTDOWN["left"] = None
    assert not (tmp_path / "o" / "manifest.json").exists()
    assert not list((tmp_path / "o" / META / "writing").iterdir())  # its marker went with it
    done = dp.write(pipe, str(tmp_path / "o"), records_per_shard=6)
    assert 0 < done.stats["units_found_done"] < 8
    assert tree(tmp_path / "o") == clean


def test_memory_filesystem(tmp_path: Path) -> None:
    manifest = dp.write(
        dp.range(20).map(jsonl_sample), "memory://write-test/m", records_per_shard=5
    )
    assert manifest.urls()[0].startswith("memory://write-test/m/shard-")
    assert [r["id"] for r in dp.Loader(manifest.files().read_jsonl())] == list(range(20))
    assert dp.read_manifest("memory://write-test/m") == manifest


# ----- whose output, and damage ------------------------------------------------------------------


def test_another_recipes_output_is_refused_unless_overwrite(tmp_path: Path) -> None:
    dp.write(dp.range(20).map(jsonl_sample), str(tmp_path / "o"))
    other = dp.range(20).map(upper_sample)
    with pytest.raises(dp.WriteConflictError, match="another recipe"):
        dp.write(other, str(tmp_path / "o"))
    with pytest.raises(dp.WriteConflictError, match="other options"):
        dp.write(dp.range(20).map(jsonl_sample), str(tmp_path / "o"), records_per_shard=3)
    manifest = dp.write(other, str(tmp_path / "o"), overwrite=True)
    assert [r["text"] for r in dp.Loader(manifest.files().read_jsonl())][:1] == ["RECORD 0"]
    names = {p.name for p in (tmp_path / "o").iterdir()}
    assert names == {s.name for s in manifest.shards} | {"manifest.json", META}


def upper_sample(i: int) -> dict[str, Any]:
    return {**jsonl_sample(i), "text": jsonl_sample(i)["text"].upper()}


def test_changed_input_is_refused(tmp_path: Path) -> None:
    pattern = make_inputs(tmp_path / "in", [5, 5])
    pipe = dp.files(pattern).read_jsonl()
    dp.write(pipe, str(tmp_path / "o"))
    make_inputs(tmp_path / "in", [5, 5, 5])
    with pytest.raises(dp.WriteConflictError, match="other input"):
        dp.write(dp.files(pattern).read_jsonl(), str(tmp_path / "o"))


def test_damaged_records_are_written_again_and_a_damaged_manifest_is_an_error(
    tmp_path: Path,
) -> None:
    pipe = dp.range(30).map(jsonl_sample)
    dp.write(pipe, str(tmp_path / "o"), records_per_shard=4)
    clean = tree(tmp_path / "o")
    (tmp_path / "o" / "manifest.json").unlink()
    unit = tmp_path / "o" / META / "units" / "000003.json"
    unit.write_text(unit.read_text()[:40])  # cut
    shard = tmp_path / "o" / "shard-000003-0000.jsonl"
    shard.write_bytes(b"garbage")
    again = dp.write(pipe, str(tmp_path / "o"), records_per_shard=4)
    assert again.stats["units_written"] == 1
    assert tree(tmp_path / "o") == clean
    (tmp_path / "o" / "manifest.json").write_text('{"version": 1, "shards": [{"name": 3}]}')
    with pytest.raises(ValueError, match="not a datapipes manifest"):
        dp.read_manifest(str(tmp_path / "o"))
    (tmp_path / "o" / PLAN).write_text("{")
    with pytest.raises(dp.WriteConflictError, match="damaged"):
        dp.write(pipe, str(tmp_path / "o"), records_per_shard=4)


def test_a_unit_abandoned_by_a_dead_writer_is_written_by_another(tmp_path: Path) -> None:
    pipe = dp.range(20).map(jsonl_sample)
    clean = tree(Path(dp.write(pipe, str(tmp_path / "clean")).url))
    out = tmp_path / "o"
    (out / META / "writing").mkdir(parents=True)
    from datapipes.write.destination import _host

    dead = 2**22 + 12345  # no such pid
    (out / META / "writing" / f"000002.{_host()}.{dead}").write_text("0")
    (out / f".shard-000002-0000.jsonl.tmp-{_host()}-{dead}-0").write_text("half")
    dp.write(pipe, str(out))
    assert tree(out) == clean  # marker and temporary of the dead writer gone


@pytest.mark.parametrize(
    ("fmt", "record", "message"),
    [
        ("jsonl", {"x": object()}, "cannot be written as JSON"),
        ("tar", 5, "holds dicts"),
        ("tar", {"__key__": "a.b", "x": b""}, "cannot hold a dot"),
        ("tar", {"x": object()}, "cannot be a tar member"),
    ],
)
def test_records_a_format_cannot_hold_are_clear_errors(
    tmp_path: Path, fmt: str, record: Any, message: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        dp.write(dp.from_sequence([record]), str(tmp_path / "o"), format=fmt)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"format": "csv"}, "format must be"),
        ({"records_per_shard": 0}, "records_per_shard"),
        ({"min_units": True}, "min_units"),
        ({"stale_seconds": -1}, "stale_seconds"),
        ({"checksum": "md5"}, "checksum must be"),
        ({"checksum": None}, "checksum must be"),
    ],
)
def test_arguments_are_checked(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dp.write(dp.range(3), str(tmp_path / "o"), **options)


def test_tar_bytes_do_not_depend_on_the_clock(tmp_path: Path) -> None:
    from datapipes.write.formats import TarFormat

    data = TarFormat().encode([sample(3)], ["k"])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert [m.name for m in tar.getmembers()] == ["s00003.id", "s00003.jpg", "s00003.text"]


def test_a_write_that_another_write_took_over_stops_with_a_conflict(tmp_path: Path) -> None:
    """Two writes racing for one destination (here: another recipe started while this
    one's units were pending) would mix their units: the later check refuses."""
    from datapipes.write import _check_same_plan
    from datapipes.write.shard_plan import WriteOptions, make_plan

    pipe = dp.range(10).map(jsonl_sample)
    dp.write(pipe, str(tmp_path / "o"))
    plan = make_plan(
        dp.range(10).map(upper_sample), WriteOptions("jsonl", 10_000, None, 8, 10_000, 0, "shard")
    )
    from datapipes.write.destination import Destination

    with pytest.raises(dp.WriteConflictError, match="started meanwhile.*another recipe"):
        _check_same_plan(Destination(str(tmp_path / "o")), plan)


def test_a_stopped_writers_unit_is_written_by_another_after_stale_seconds(tmp_path: Path) -> None:
    """A marker of a live process untouched for stale_seconds (a stopped writer) no longer
    holds its unit."""
    from datapipes.write.destination import Destination, _host

    dest = Destination(str(tmp_path / "o"))
    marker = dest.mark_writing("000001")
    assert dest.held_units(60.0) == {"000001"}
    old = os.path.getmtime(tmp_path / "o" / marker) - 120
    os.utime(tmp_path / "o" / marker, (old, old))
    assert dest.held_units(60.0) == set()
    assert marker.endswith(f".{_host()}.{os.getpid()}")


def test_a_unit_held_by_a_stopped_writer_of_this_host_is_written_once_its_marker_is_stale(
    tmp_path: Path,
) -> None:
    """A whole write: a stopped (SIGSTOP) writer is alive but touches its marker no more;
    the others respect its fresh markers, and write its units once they are stale."""
    import signal
    import subprocess
    import sys
    import time

    from datapipes.write.destination import _host

    pipe = dp.range(40).map(jsonl_sample)
    clean = tree(Path(dp.write(pipe, str(tmp_path / "clean")).url))
    out, stale = tmp_path / "o", 1.5
    (out / META / "writing").mkdir(parents=True)
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        os.kill(stopped.pid, signal.SIGSTOP)
        started = time.monotonic()
        markers = [out / META / "writing" / f"{u:06d}.{_host()}.{stopped.pid}" for u in range(8)]
        for marker in markers:
            marker.write_text("0")
        # Rank 1 of 2 never comes: rank 0 writes its share, then rank 1's once stale.
        (manifest,) = in_threads(
            1, lambda r: dp.write(pipe, str(out), rank=0, world_size=2, stale_seconds=stale)
        )
        assert time.monotonic() - started >= stale  # a fresh marker was respected
        assert manifest.stats["units_written"] == 8
        assert all(marker.exists() for marker in markers)  # its owner is alive: it removes them
        for marker in markers:
            marker.unlink()
        assert tree(out) == clean
    finally:
        stopped.kill()
        stopped.wait()


#: Where ``leaving_leftovers`` drops a dead writer's leftovers (``None``: it does not).
LEFTOVERS: dict[str, Path | None] = {"out": None}


def leaving_leftovers(i: int) -> dict[str, Any]:
    out = LEFTOVERS["out"]
    if i == 13 and out is not None:  # mid-write: after the first look for dead writers
        from datapipes.write.destination import _host

        dead = 2**22 + 4321  # no such pid
        (out / META / "writing" / f"000005.{_host()}.{dead}").write_text("0")
        (out / f".shard-000005-0000.jsonl.tmp-{_host()}-{dead}-3").write_text("half")
        other = out / META / "writing" / "000006.otherhost.77"
        other.write_text("0")
        os.utime(other, (0, 0))  # untouched for ages
    return jsonl_sample(i)


def test_leftovers_of_writers_that_died_meanwhile_are_removed_before_the_manifest(
    tmp_path: Path,
) -> None:
    """A writer that died while the others wrote (its units written again by them) leaves
    no marker or temporary behind (before: only a later call's first look removed them)."""
    pipe = dp.range(40).map(leaving_leftovers)
    clean = tree(Path(dp.write(pipe, str(tmp_path / "clean"), stale_seconds=30).url))
    LEFTOVERS["out"] = tmp_path / "o"
    try:
        dp.write(pipe, str(tmp_path / "o"), stale_seconds=30)
    finally:
        LEFTOVERS["out"] = None
    assert tree(tmp_path / "o") == clean


def test_writing_again_removes_a_dead_writers_temporary_and_nothing_else(tmp_path: Path) -> None:
    """A rank killed while it published the manifest the others had already published
    leaves its temporary; the next call finds the output complete, writes nothing and
    removes it (before: it stayed for good)."""
    from datapipes.write.destination import _host

    pipe = dp.range(30).map(jsonl_sample)
    dp.write(pipe, str(tmp_path / "o"), records_per_shard=4)
    clean = tree(tmp_path / "o")
    dead = 2**22 + 999  # no such pid
    (tmp_path / "o" / f".manifest.json.tmp-{_host()}-{dead}-7").write_text('{"vers')
    again = dp.write(pipe, str(tmp_path / "o"), records_per_shard=4)
    assert again.stats["units_written"] == 0
    assert tree(tmp_path / "o") == clean


@pytest.mark.slow
def test_an_s3_destination_sees_what_others_wrote_after_it_listed() -> None:
    """Each rank's s3fs keeps a folder's listing for ever: a rank that had listed the unit
    records missed (and failed to open) those other ranks wrote after, and waited for a
    marker its owner had removed (before: every look now asks the store)."""
    pytest.importorskip("s3fs", reason="s3fs is not installed")
    pytest.importorskip("moto.server", reason="moto's server mode is not installed")
    from s3_server import KEY, REGION, SECRET, moto_server

    from datapipes.write.destination import Destination

    with moto_server() as endpoint:
        options = {
            "key": KEY, "secret": SECRET, "skip_instance_cache": True,  # a cache each
            "client_kwargs": {"endpoint_url": endpoint, "region_name": REGION},
        }  # fmt: skip
        mine = Destination("s3://write-listings/out", options)
        theirs = Destination("s3://write-listings/out", options)
        mine.fs.mkdir("write-listings")
        theirs.publish(f"{META}/units/000000.json", b"{}")
        assert mine.names(f"{META}/units") == ["000000.json"]  # a listing s3fs keeps
        theirs.publish(f"{META}/units/000001.json", b"{}")
        assert mine.read(f"{META}/units/000001.json") == b"{}"
        assert mine.names(f"{META}/units") == ["000000.json", "000001.json"]
        marker = theirs.mark_writing("000002")  # this process's pid: a live writer
        assert mine.held_units(60) == {"000002"}
        theirs.remove(marker)
        assert mine.held_units(60) == set()


def test_a_rank_that_starts_late_is_dealt_the_units_of_its_rank_not_of_what_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks deal all the units (the done ones skipped): a rank that starts once unit 0 is
    done still gets units 1, 3, 5, 7 of 2 ranks (before: 2, 4, 6 of the 7 left, which the
    early rank 0 also had, while 3, 5, 7 waited for the help phase)."""
    import sys

    from datapipes.write.unit import UnitWriter

    write_module = sys.modules["datapipes.write"]  # dp.write, the function, hides the module

    pipe = dp.range(80).map(countdown_sample)
    clean = tree(Path(dp.write(pipe, str(tmp_path / "clean"), records_per_shard=6).url))
    COUNTDOWN["left"] = 11  # unit 0 (10 records) written, then the job dies in unit 1
    try:
        with pytest.raises(RuntimeError, match="killed"):
            dp.write(pipe, str(tmp_path / "o"), records_per_shard=6)
    finally:
        COUNTDOWN["left"] = None
    log: list[Any] = []
    write, help_ = UnitWriter.write, write_module._help

    def logged_write(self: UnitWriter, unit: Any) -> Any:
        log.append(unit.index)
        return write(self, unit)

    def logged_help(*args: Any) -> int:
        log.append("help")
        return help_(*args)

    monkeypatch.setattr(UnitWriter, "write", logged_write)
    monkeypatch.setattr(write_module, "_help", logged_help)
    late = dp.write(pipe, str(tmp_path / "o"), records_per_shard=6, rank=1, world_size=2)
    assert log[: log.index("help")] == [1, 3, 5, 7]
    assert sorted(log[log.index("help") + 1 :]) == [2, 4, 6]  # rank 0's: it never came
    assert late.stats["units_written"] == 7 and late.stats["units_found_done"] == 1
    assert tree(tmp_path / "o") == clean


def test_parquet_written_reads_back_through_read_parquet(tmp_path: Path) -> None:
    manifest = dp.write(
        dp.range(40).map(sample), str(tmp_path / "o"), format="parquet", records_per_shard=15
    )
    back = list(dp.Loader(manifest.files().read_parquet()))
    assert back == [sample(i) for i in range(40)]
    resumed_from = dp.Loader(manifest.files().read_parquet())
    it = iter(resumed_from)
    first = [next(it) for _ in range(17)]
    state = resumed_from.state_dict()
    rest = dp.Loader(manifest.files().read_parquet())
    rest.load_state_dict(state)
    assert first + list(rest) == back


# ----- the formats' bytes are those of tarfile and of pa.Table.from_pylist -----------------------


def tarfile_shard(records: list[dict[str, Any]], keys: list[str]) -> bytes:
    """A tar shard as tarfile itself writes it: what TarFormat.encode gives, byte for byte."""
    from datapipes.write.formats import _member_bytes

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for record, default_key in zip(records, keys):
            key = str(record.get("__key__", default_key))
            for field in sorted(f for f in record if not f.startswith("__")):
                data = _member_bytes(field, record[field])
                info = tarfile.TarInfo(f"{key}.{field}")
                info.size, info.mtime, info.mode = len(data), 0, 0o444
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


TAR_KEYS = ["s1", "dir/é-ü", "k" * 95, "k" * 96, "d/" + "x" * 120, "ü" * 60, "日本" * 20]


@pytest.mark.parametrize("run", [1 << 20, 700])  # bytes of members written at a time
@pytest.mark.parametrize("count", [0, 1, 2, 7, 19])
def test_tar_shards_are_the_bytes_tarfile_writes(
    count: int, run: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    from datapipes.write import formats
    from datapipes.write.formats import TarFormat

    monkeypatch.setattr(formats, "_RUN", run)

    records = [
        {
            **({"__key__": TAR_KEYS[i % len(TAR_KEYS)] + str(i)} if i % 3 else {}),
            "jpg": bytes([i % 256]) * (i * 97 % 1500),  # empty, under, over and at 512s
            "bin": b"z" * 512 * (i % 3),
            "txt": "é" * i,
            "cls": i,
            "json": {"i": [i, None]},
            "x.npy": np.arange(i, dtype=np.int16),
            "__url__": "not a member",
        }
        for i in range(count)
    ]
    keys = [f"000003-{i:08d}" for i in range(count)]
    assert TarFormat().encode(records, keys) == tarfile_shard(records, keys)


@pytest.mark.parametrize("name", ["a.jpg", "", "é" * 50, "n" * 99 + ".", "n" * 101, "ü" * 51])
@pytest.mark.parametrize("size", [0, 1, 511, 512, 8**11 - 1, 8**11, 2**40])
def test_tar_member_headers_are_tarfiles(name: str, size: int) -> None:
    from datapipes.write import formats

    assert formats._FAST_HEADERS  # built here, not only taken from tarfile
    assert formats._member_header(name, size) == formats._tarfile_header(name, size)


def test_parquet_shards_are_the_bytes_of_from_pylist() -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datapipes.write.formats import ParquetFormat, _plain

    records: list[dict[str, Any]] = [
        {"id": i, "jpg": bytes([i]) * i, "v": np.arange(i), "f": np.float32(i / 2)}
        for i in range(9)
    ]
    del records[3]["jpg"]  # a missing field is null
    records[4]["extra"] = "not a column"  # only the first record's fields are
    plain = [
        {k: _plain(v) if isinstance(v, np.ndarray | np.generic) else v for k, v in r.items()}
        for r in records
    ]
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(plain), buffer)
    assert ParquetFormat().encode(records, []) == buffer.getvalue()
    with pytest.raises(TypeError, match="holds dicts"):
        ParquetFormat().encode([*records, 5], [])


def test_a_shard_that_fails_to_publish_fails_its_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # shards are committed (fsynced, hashed, renamed) on a thread of the writer's: its
    # error is the unit's, and the shard's temporary file goes
    from datapipes.write.destination import NewFile

    pipe = dp.range(40).map(sample)
    clean = tree(Path(dp.write(pipe, str(tmp_path / "clean"), format="tar").url))
    commit = NewFile.commit

    def failing(self: NewFile, checksum: str | None = None) -> tuple[int, str]:
        if self.final.endswith("shard-000002-0000.tar"):
            raise OSError("disk full")
        return commit(self, checksum)

    monkeypatch.setattr(NewFile, "commit", failing)
    with pytest.raises(OSError, match="disk full"):
        dp.write(pipe, str(tmp_path / "o"), format="tar")
    assert not list((tmp_path / "o" / META / "writing").iterdir())  # its marker went with it
    assert not (tmp_path / "o" / META / "units" / "000002.json").exists()
    assert not [p.name for p in (tmp_path / "o").iterdir() if ".tmp-" in p.name]
    monkeypatch.setattr(NewFile, "commit", commit)
    dp.write(pipe, str(tmp_path / "o"), format="tar")
    assert tree(tmp_path / "o") == clean
