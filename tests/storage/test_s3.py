"""``s3://`` end to end through s3fs, against moto's S3 server on 127.0.0.1.

One moto server and one fault-injecting proxy in front of it (``tests/s3_server.py``)
serve the whole module; the same files are written to a local folder, and every read
from S3 is compared with the same recipe over the local files (same listing order, same
deal to consumers, same records). Faults (503 ``SlowDown``, bodies cut short or stalled,
a refused connection) go through the real s3fs, aiobotocore and botocore stack.

s3fs retries each request 5 times and botocore 5 times more (legacy mode), with waits of
seconds: the tests of our own retry layer turn both down to one attempt
(``S3FileSystem.retries`` and ``config_kwargs``), so each takes about a second.
"""

from __future__ import annotations

import io
import json
import re
import socket
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

s3fs = pytest.importorskip("s3fs", reason="s3fs is not installed (pip install datapipes-torch[s3])")
pytest.importorskip("moto.server", reason="moto's server mode is not installed (moto[server])")

from s3_server import KEY, REGION, SECRET, FaultProxy, fault_proxy, moto_server  # noqa: E402
from subprocess_helpers import run_python  # noqa: E402

import datapipes as dp  # noqa: E402
from nodes.storage import ReadFailedError  # noqa: E402

BUCKET = "datapipes"
BLOCK = 1 << 14  # s3fs's block size here: a read asks for 16 KiB ranges, so files take several
PARTS = {f"data/part-{k}.jsonl": 700 + 150 * k for k in range(4)}
#: s3fs's own read timeout: a stall that only it noticed takes at least this long.
S3FS_READ_TIMEOUT = 15
NESTED = {"data/nested/deep-0.jsonl": 120}
BIG = {"big/big.jsonl": 4_000}


def _one_attempt() -> dict[str, Any]:
    """botocore's config for one attempt per request (a new dict: botocore adds to it)."""
    return {"retries": {"total_max_attempts": 1}}


def _jsonl(name: str, count: int) -> bytes:
    lines = (json.dumps({"file": name, "i": i, "pad": "x" * (i % 37)}) for i in range(count))
    return ("\n".join(lines) + "\n").encode()


def _csv(k: int, count: int) -> bytes:
    rows = [f"{k}-{i},name {i},{i * 0.5}" for i in range(count)]
    return ("id,name,value\n" + "\n".join(rows) + "\n").encode()


def _tar(k: int, count: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i in range(count):
            for ext, data in (("txt", f"text {k} {i}"), ("json", json.dumps({"k": k, "i": i}))):
                info = tarfile.TarInfo(f"s{k}-{i:04d}.{ext}")
                info.size = len(data.encode())
                tar.addfile(info, io.BytesIO(data.encode()))
    return buffer.getvalue()


def _objects() -> dict[str, bytes]:
    objects = {name: _jsonl(name, n) for name, n in {**PARTS, **NESTED, **BIG}.items()}
    objects.update({f"csv/table-{k}.csv": _csv(k, 300 + 50 * k) for k in range(2)})
    objects.update({f"tar/shard-{k}.tar": _tar(k, 40 + 10 * k) for k in range(2)})
    return objects


@dataclass
class Store:
    """The module's S3 server: its endpoint, the proxy in front of it, and the local copy."""

    endpoint: str
    proxy: FaultProxy
    root: Path
    objects: dict[str, bytes] = field(repr=False)

    def options(self, *, proxied: bool = False, **extra: Any) -> dict[str, Any]:
        """Storage options the documented way: credentials and the endpoint."""
        endpoint = self.proxy.url if proxied else self.endpoint
        client = {"endpoint_url": endpoint, "region_name": REGION}
        return {"key": KEY, "secret": SECRET, "client_kwargs": client, **extra}

    def s3(self, pattern: str | list[str], **options: Any) -> dp.FileList:
        patterns = [pattern] if isinstance(pattern, str) else pattern
        urls = [f"s3://{BUCKET}/{p}" for p in patterns]
        return dp.files(urls, block_size=BLOCK, **self.options(**options))

    def local(self, pattern: str | list[str]) -> dp.FileList:
        patterns = [pattern] if isinstance(pattern, str) else pattern
        return dp.files([str(self.root / p) for p in patterns], block_size=BLOCK)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """moto on 127.0.0.1 with a bucket of JSONL, CSV and tar files, and their local copy."""
    root = tmp_path_factory.mktemp("s3-local")
    objects = _objects()
    for name, data in objects.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    with moto_server() as endpoint, fault_proxy(endpoint) as proxy:
        here = Store(endpoint, proxy, root, objects)
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **here.options())
        fs.mkdir(BUCKET)
        for name, data in objects.items():
            fs.pipe(f"{BUCKET}/{name}", data)
        yield here
        s3fs.S3FileSystem.clear_instance_cache()  # no client of a stopped server is reused
    # Nothing outlives the module: moto's port is closed, so is the proxy's.
    for url in (here.endpoint, here.proxy.url):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5)


@pytest.fixture
def proxy(store: Store) -> Iterator[FaultProxy]:
    """The proxy, without faults and with an empty log (healed again afterwards)."""
    store.proxy.reset()
    yield store.proxy
    store.proxy.reset()


@pytest.fixture
def one_attempt(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """s3fs tries each request once (its class setting); the options do so for botocore."""
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    return {"config_kwargs": _one_attempt()}


READERS: dict[str, tuple[str, Callable[[dp.FileList], dp.DataPipe[Any]]]] = {
    "jsonl": ("data/*.jsonl", lambda files: files.read_jsonl(block_size=4096)),
    "csv": ("csv/*.csv", lambda files: files.read_csv(block_size=4096)),
    "tar": ("tar/*.tar", lambda files: files.read_tar()),
}


def _plain(record: Any) -> Any:
    """A record without where it came from (``__url__`` differs between S3 and disk)."""
    if isinstance(record, dict):
        return {k: v for k, v in record.items() if k != "__url__"}
    return record


def _read(pipe: dp.DataPipe[Any], **loader: Any) -> list[Any]:
    return [_plain(r) for r in dp.Loader(pipe, **loader)]


def _ids(records: list[dict]) -> list[tuple[str, int]]:
    return [(r["file"], r["i"]) for r in records]


def _read_with_fault(pipe: dp.DataPipe[Any], fault: Callable[[], None], after: int) -> list[Any]:
    """All records, ``fault()`` starting after the first ``after`` (a file half read)."""
    records = []
    for record in dp.Loader(pipe):
        records.append(record)
        if len(records) == after:
            fault()
    return records


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----- reading, listing, dealing -----------------------------------------------------------


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_glob_reads_what_the_local_files_hold(store: Store, reader: str):
    pattern, read = READERS[reader]
    got = _read(read(store.s3(pattern)))
    assert got == _read(read(store.local(pattern)))
    assert len(got) == {"jsonl": sum(PARTS.values()), "csv": 650, "tar": 90}[reader]


def test_listings_match_the_keys_with_single_and_double_star(store: Store):
    def names(files: dp.FileList, prefix: str) -> list[str]:
        return [url.removeprefix(prefix) for url in dp.Loader(files)]

    for pattern, expected in (("data/*.jsonl", PARTS), ("data/**/*.jsonl", {**PARTS, **NESTED})):
        s3 = names(store.s3(pattern), f"s3://{BUCKET}/")
        assert s3 == sorted(expected)  # sorted: the same listing in every process
        assert s3 == names(store.local(pattern), f"{store.root}/")


def test_a_pattern_or_key_that_names_nothing_is_a_clear_error(store: Store):
    with pytest.raises(FileNotFoundError, match=r"s3://datapipes/none/\*\.jsonl.*matched no"):
        list(dp.Loader(store.s3("none/*.jsonl")))
    with pytest.raises(FileNotFoundError, match="s3://datapipes/none.jsonl: no such file"):
        list(dp.Loader(store.s3("none.jsonl").read_jsonl()))


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("pattern", ["data/**/*.jsonl", "big/big.jsonl"], ids=["glob", "one"])
def test_consumers_read_every_record_once_as_they_do_locally(
    store: Store, pattern: str, world_size: int
):
    """One big file among 2 or 3 consumers is split into byte ranges (parts)."""
    read = READERS["jsonl"][1]
    ranks = [
        _read(read(store.s3(pattern)), rank=rank, world_size=world_size)
        for rank in range(world_size)
    ]
    local = [
        _read(read(store.local(pattern)), rank=rank, world_size=world_size)
        for rank in range(world_size)
    ]
    assert ranks == local
    ids = [i for records in ranks for i in _ids(records)]
    names = {**PARTS, **NESTED} if pattern.startswith("data") else BIG
    assert sorted(ids) == sorted((name, i) for name, n in names.items() for i in range(n))
    assert all(records for records in ranks)  # a split file gives every consumer a share


def test_a_split_file_is_read_by_byte_ranges_from_its_middle(store: Store, proxy: FaultProxy):
    """Rank 1 of 2 reads the second half of the one big file: its first ranged GET starts
    about halfway, and it never asks for the whole object."""
    size = len(store.objects["big/big.jsonl"])
    read = READERS["jsonl"][1]
    records = _read(read(store.s3("big/big.jsonl", proxied=True)), rank=1, world_size=2)
    assert 0 < len(records) < BIG["big/big.jsonl"]
    ranges = [r for _, method, path, _, r in proxy.log if method == "GET" and "big" in path]
    starts = [int(r.removeprefix("bytes=").split("-")[0]) for r in ranges]
    assert ranges and all(r.startswith("bytes=") for r in ranges)
    assert size // 2 - BLOCK <= min(starts) < size // 2 + BLOCK, (size, starts)


# ----- credentials and storage options -------------------------------------------------------


@pytest.mark.parametrize("where", ["top-level", "client_kwargs"])
def test_credentials_never_reach_repr_identity_or_checkpoint(store: Store, where: str):
    """Credentials are masked in repr and the identity (so the fingerprint does not change
    when keys rotate: a checkpoint taken with old keys resumes with new ones)."""

    def pipe(key: str, secret: str, token: str) -> dp.DataPipe[Any]:
        client = {"endpoint_url": store.endpoint, "region_name": REGION}
        if where == "top-level":
            options = {"key": key, "secret": secret, "token": token, "client_kwargs": client}
        else:
            client.update(
                aws_access_key_id=key, aws_secret_access_key=secret, aws_session_token=token
            )
            options = {"client_kwargs": client}
        return dp.files(f"s3://{BUCKET}/data/*.jsonl", **options).read_jsonl()

    old = ("AKIA-OLD-KEY-ID", "old-secret-value", "old-session-token")
    new = ("AKIA-NEW-KEY-ID", "new-secret-value", "new-session-token")
    reference = list(dp.Loader(pipe(*old)))
    loader = dp.Loader(pipe(*old))
    it = iter(loader)
    head = [next(it) for _ in range(1_000)]
    state = json.loads(json.dumps(loader.state_dict()))
    shown = [repr(pipe(*old)), json.dumps(pipe(*old).identity()), json.dumps(state)]
    for text in shown:
        for value in old:
            assert value not in text
    assert store.endpoint in json.dumps(pipe(*old).identity())  # the rest is still there
    assert pipe(*old).fingerprint() == pipe(*new).fingerprint()
    rotated = dp.Loader(pipe(*new))
    rotated.load_state_dict(state)
    assert head + list(rotated) == reference


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"])
def test_credentials_and_endpoint_from_environment_variables(
    store: Store, monkeypatch: pytest.MonkeyPatch, variable: str
):
    """No storage options at all: botocore takes keys, region and endpoint from the
    environment, and the recipe's identity holds none of them."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv(variable, store.endpoint)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    s3fs.S3FileSystem.clear_instance_cache()  # a client made without these must not be reused
    try:
        pipe = dp.files(f"s3://{BUCKET}/data/*.jsonl").read_jsonl()
        assert _read(pipe) == _read(READERS["jsonl"][1](store.local("data/*.jsonl")))
        assert pipe.identity()["inputs"][0] == {
            "step": "files",
            "args": [f"s3://{BUCKET}/data/*.jsonl"],
        }
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_s3fs_own_endpoint_url_option_works_too(store: Store):
    files = dp.files(
        f"s3://{BUCKET}/data/*.jsonl", key=KEY, secret=SECRET, endpoint_url=store.endpoint
    )
    assert _read(files.read_jsonl()) == _read(store.local("data/*.jsonl").read_jsonl())


# ----- resume --------------------------------------------------------------------------------


def _resumable(files: dp.FileList) -> dp.DataPipe[Any]:
    return files.shuffle().read_jsonl(block_size=4096).shuffle(64)


@pytest.mark.parametrize("pattern", ["data/**/*.jsonl", "big/big.jsonl"], ids=["glob", "split"])
def test_a_checkpoint_mid_epoch_resumes_exactly(store: Store, pattern: str):
    """Each of 2 ranks resumes with exactly the records an uninterrupted run has left."""
    pipe = _resumable(store.s3(pattern))
    references = [list(dp.Loader(pipe, seed=5, rank=rank, world_size=2)) for rank in range(2)]
    # The same records as locally; another order, as the shuffles are keyed by the recipe
    # (its URLs included).
    local = _resumable(store.local(pattern))
    ids = [i for rank in range(2) for i in _ids(list(dp.Loader(local, rank=rank, world_size=2)))]
    assert sorted(i for reference in references for i in _ids(reference)) == sorted(ids)
    for rank, reference in enumerate(references):
        for stop in (1, len(reference) // 3, len(reference) - 1):
            loader = dp.Loader(pipe, seed=5, rank=rank, world_size=2)
            it = iter(loader)
            head = [next(it) for _ in range(stop)]
            state = json.loads(json.dumps(loader.state_dict()))
            fresh = dp.Loader(pipe, seed=5, rank=rank, world_size=2)
            fresh.load_state_dict(state)
            assert head + list(fresh) == reference, (rank, stop)


_RESUME_ELSEWHERE = """
import json, sys
import datapipes as dp
options, state = json.loads(sys.argv[1]), json.loads(open(sys.argv[2]).read())
files = dp.files(["s3://datapipes/data/**/*.jsonl"], block_size=1 << 14, **options)
loader = dp.Loader(files.shuffle().read_jsonl(block_size=4096).shuffle(64), seed=5)
loader.load_state_dict(state)
print(json.dumps(list(loader)))
"""


@pytest.mark.slow
def test_a_checkpoint_resumes_exactly_in_a_new_process(store: Store, tmp_path: Path):
    pipe = _resumable(store.s3("data/**/*.jsonl"))
    reference = list(dp.Loader(pipe, seed=5))
    loader = dp.Loader(pipe, seed=5)
    it = iter(loader)
    head = [next(it) for _ in range(1_234)]
    (tmp_path / "state.json").write_text(json.dumps(loader.state_dict()))
    options = json.dumps(store.options())
    tail = json.loads(run_python(_RESUME_ELSEWHERE, options, str(tmp_path / "state.json")))
    assert head + tail == reference


@pytest.mark.slow
def test_dataloader_workers_read_s3_every_record_once(store: Store):
    """s3fs's event loop and clients do not survive a fork: the workers must make their own."""
    pipe = READERS["jsonl"][1](store.s3("data/**/*.jsonl"))
    got = _read(pipe, num_workers=2)
    expected = _read(READERS["jsonl"][1](store.local("data/**/*.jsonl")))
    assert sorted(_ids(got)) == sorted(_ids(expected))
    assert len(got) == len(expected)


# ----- faults: 503s, bodies cut short or stalled, refused connections --------------------------


def _reference(store: Store, pattern: str = "data/*.jsonl") -> list[Any]:
    return _read(READERS["jsonl"][1](store.local(pattern)))


@pytest.mark.timeout(60)
def test_503_slow_downs_are_retried_by_our_layer(store, proxy, one_attempt):
    """With s3fs and botocore down to one attempt, each 503 reaches our retry policy, which
    reopens the file at the same offset: every record once, in order."""
    pipe = store.s3("data/*.jsonl", proxied=True, **one_attempt).read_jsonl(block_size=4096)
    started = time.monotonic()
    got = _read_with_fault(pipe, lambda: proxy.fail_next(3), after=100)
    assert proxy.count(503) == 3
    assert got == _reference(store)
    assert time.monotonic() - started < 10


@pytest.mark.timeout(60)
def test_a_listing_answered_503_is_retried(store, proxy, one_attempt):
    proxy.every_request = True  # the listing (a GET of the bucket) too
    proxy.fail_next(2)
    options = {**one_attempt, "use_listings_cache": False}  # s3fs must ask the server
    files = store.s3("data/*.jsonl", proxied=True, **options)
    assert [url.rsplit("/", 1)[1] for url in dp.Loader(files)] == [
        k.split("/")[1] for k in sorted(PARTS)
    ]
    assert proxy.count(503, objects=False) == 2


@pytest.mark.timeout(60)
def test_a_listing_that_stalls_is_given_up_after_the_timeout(store, proxy):
    """The listing runs under our watchdog too (s3fs would wait 15 s, its read timeout).

    moto answers on a thread of this process: on a loaded machine an answer can take a
    second, and a shorter timeout takes it for a stall too. The bound tells our 2 s from
    s3fs's 15 s."""
    proxy.every_request = True
    proxy.stall_next(1)  # the first request: the listing (a GET of the bucket)
    files = store.s3("data/*.jsonl", proxied=True, timeout=2, use_listings_cache=False)
    started = time.monotonic()
    assert [url.rsplit("/", 1)[1] for url in dp.Loader(files)] == [
        k.split("/")[1] for k in sorted(PARTS)
    ]
    assert proxy.done["stall"] == 1
    assert time.monotonic() - started < S3FS_READ_TIMEOUT


@pytest.mark.timeout(60)
def test_a_persistent_outage_ends_in_a_clear_error_within_the_budget(store, proxy, one_attempt):
    pipe = store.s3("data/*.jsonl", proxied=True, retry_seconds=1, **one_attempt).read_jsonl(
        block_size=4096
    )
    got: list[Any] = []
    started = time.monotonic()
    with pytest.raises(ReadFailedError) as raised:
        got.extend(_read_with_fault(pipe, lambda: proxy.outage(float("inf")), after=100))
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert re.search(r"s3://datapipes/data/part-\d\.jsonl: read at byte offset \d+", message)
    assert "reduce your request rate" in message and "retry budget is spent" in message
    assert "retry_seconds=1" in message and ".." not in message
    assert proxy.count(503) >= 2  # ours retried at least once
    assert elapsed < 10


@pytest.mark.timeout(60)
@pytest.mark.parametrize("retrier", ["ours", "s3fs"])
def test_a_body_cut_short_is_read_again(store, proxy, monkeypatch, retrier):
    """A GET whose body ends early (the connection drops): s3fs retries it itself; with its
    retries turned off, ours does. Either way every record once, in order."""
    options: dict[str, Any] = {}
    if retrier == "ours":
        monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
        options = {"config_kwargs": _one_attempt()}
    pipe = store.s3("data/*.jsonl", proxied=True, **options).read_jsonl(block_size=4096)
    got = _read_with_fault(pipe, lambda: proxy.cut_next(2), after=100)
    assert proxy.done["cut"] == 2  # met mid-file
    assert [_plain(r) for r in got] == _reference(store)


@pytest.mark.timeout(60)
def test_a_stalled_body_is_given_up_after_the_timeout_and_read_again(store, proxy):
    """s3fs's own read timeout is 15 s; our watchdog (timeout=) covers s3 reads too (2 s:
    moto, on a thread of this process, can take a second to answer on a loaded machine)."""
    pipe = store.s3("data/*.jsonl", proxied=True, timeout=2).read_jsonl(block_size=4096)
    started = time.monotonic()
    got = _read_with_fault(pipe, lambda: proxy.stall_next(1), after=100)
    assert proxy.done["stall"] == 1
    assert got == _reference(store)
    assert time.monotonic() - started < S3FS_READ_TIMEOUT


@pytest.mark.timeout(60)
def test_a_body_that_keeps_stalling_fails_naming_the_timeout(store, proxy):
    pipe = store.s3("data/*.jsonl", proxied=True, timeout=0.3, retry_seconds=0.6)
    started = time.monotonic()
    with pytest.raises(ReadFailedError, match=r"no progress for 0\.3 s \(timeout=0\.3\)"):
        _read_with_fault(pipe.read_jsonl(block_size=4096), lambda: proxy.stall_next(100), 100)
    assert time.monotonic() - started < 10


@pytest.mark.timeout(60)
def test_a_refused_connection_is_retried_then_fails_clearly(one_attempt):
    endpoint = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    files = dp.files(
        f"s3://{BUCKET}/a.jsonl",
        retry_seconds=0.5,
        key=KEY,
        secret=SECRET,
        client_kwargs={"endpoint_url": endpoint, "region_name": REGION},
        **one_attempt,
    )
    started = time.monotonic()
    with pytest.raises(ReadFailedError, match="EndpointConnectionError") as raised:
        list(dp.Loader(files.read_jsonl()))
    attempts = int(str(raised.value).split(" attempt(s)")[0].rsplit(" ", 1)[1])
    assert attempts >= 2  # ours retried: botocore's network errors count as transient
    assert time.monotonic() - started < 15


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_burst_of_503s_is_ridden_out_by_botocore_and_s3fs_alone(store, proxy):
    """The libraries' defaults: botocore retries a 503 four times with waits of up to
    several seconds before s3fs or our layer see it."""
    pipe = store.s3("data/*.jsonl", proxied=True).read_jsonl(block_size=4096)
    got = _read_with_fault(pipe, lambda: proxy.fail_next(3), after=100)
    assert proxy.count(503) == 3
    assert got == _reference(store)
