"""Credentials in URLs never leave the process: not in a repr, a state, a checkpoint, an
error (its chain and notes included), a warning, a log record or the output, at 0 and 2
workers; a checkpoint resumes exactly when only the credentials changed.

The secrets are made up; the local HTTP server ignores them.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import pickle
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import fsspec.asyn
import pytest
from file_fixtures import tar_bytes
from http_server import _Handler, serve

import datapipes as dp
from datapipes.dispatch.dynamic import private_file_store
from datapipes.inspect import describe_checkpoint
from nodes.credentials import (
    ScrubbedError,
    remember,
    scrub_error,
    scrubbed,
    secrets_of,
    shown_url,
)
from nodes.errors import add_note

SECRETS = ("PW-s3cr3t-alice", "SIG-0ff1ce-sig", "TOK-b4d9e-token", "BEARER-9f8e7d-opt")
#: A storage option that carries a credential (nested, as fsspec's HTTP headers are).
HEADERS = {"headers": {"X-Api-Key": SECRETS[3]}}
QUERY = f"X-Amz-Signature={SECRETS[1]}&token={SECRETS[2]}&version=2"


# ----- one way to show a URL ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://alice:pw@host/a.jsonl", "http://alice:***@host/a.jsonl"),
        ("http://alice@host/a.jsonl", "http://alice@host/a.jsonl"),  # a user name alone stays
        (
            "https://b.s3.amazonaws.com/k.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=AKIA%2F20261207&X-Amz-Date=20261207T000000Z&X-Amz-Expires=900"
            "&X-Amz-SignedHeaders=host&X-Amz-Signature=f00d",
            "https://b.s3.amazonaws.com/k.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256"
            "&X-Amz-Credential=***&X-Amz-Date=***&X-Amz-Expires=***"
            "&X-Amz-SignedHeaders=host&X-Amz-Signature=***",
        ),
        (
            "https://acct.blob.core.windows.net/c/x.tar?sv=2024-01-01&sp=r&se=2026-12-08&sig=a%2Fb",
            "https://acct.blob.core.windows.net/c/x.tar?sv=2024-01-01&sp=r&se=***&sig=***",
        ),
        ("https://h/x?X-Goog-Signature=1&alt=media", "https://h/x?X-Goog-Signature=***&alt=media"),
        ("https://h/x?my_api_token=1&page=3", "https://h/x?my_api_token=***&page=3"),
        ("/data/train-*.jsonl", "/data/train-*.jsonl"),
        ("memory://bucket/a.jsonl", "memory://bucket/a.jsonl"),
    ],
)
def test_a_url_is_shown_without_its_credentials(url: str, shown: str) -> None:
    assert shown_url(url) == shown


def test_the_secrets_of_a_url_include_their_encoded_forms() -> None:
    found = secrets_of("http://u:p%40ss@h/x?sig=a%2Fb%3D&page=2")
    assert {"p%40ss", "p@ss", "a/b=", "a%2Fb%3D"} <= set(found)
    assert "2" not in found and all(len(s) >= 3 for s in found)


def test_a_chain_is_scrubbed_and_a_link_built_from_attributes_replaced() -> None:
    remember("http://carol:chain-pw-77@host/a.jsonl")

    class FromAttributes(Exception):  # str() from an attribute, as aiohttp's errors are
        def __init__(self, url: str) -> None:
            super().__init__()
            self.where = url

        def __str__(self) -> str:
            return f"failed: {self.where}"

    try:
        try:
            raise FromAttributes("http://carol:chain-pw-77@host/a.jsonl")
        except FromAttributes as inner:
            error = OSError("reading http://carol:chain-pw-77@host/a.jsonl failed")
            add_note(error, "while reading http://carol:chain-pw-77@host/a.jsonl")
            raise error from inner
    except OSError as error_seen:
        caught = scrub_error(error_seen)
    text = "".join(traceback.format_exception(caught))
    assert "chain-pw-77" not in text
    assert "http://carol:***@host/a.jsonl" in text
    assert isinstance(caught.__cause__, ScrubbedError)
    assert "FromAttributes: failed: http://carol:***@host/a.jsonl" in str(caught.__cause__)
    assert scrubbed("nothing to hide") == "nothing to hide"


# ----- every channel ---------------------------------------------------------------------------


def _bad_files() -> dict[str, bytes]:
    import io

    import numpy as np

    tar = tar_bytes([{"__key__": f"s{i}", "txt": b"x" * 600} for i in range(3)])
    npy = io.BytesIO()
    np.save(npy, np.arange(1000))
    return {
        "bad.csv": b"a,b\n1,2\n3\n",  # a row of the wrong width
        "bad.tar": tar[: len(tar) // 2 + 100],  # cut inside a member
        "bad.npy": npy.getvalue()[:-100],  # fewer rows than its header says
        "bad.jsonl.gz": gzip.compress(b'{"id": 1}\n')[:-6],  # truncated compressed data
    }


BAD_FILES = _bad_files()
READS = {
    "bad.csv": lambda files: files.read_csv(),
    "bad.tar": lambda files: files.read_tar(),
    "bad.npy": lambda files: files.read_npy(),
    "bad.jsonl.gz": lambda files: files.read_jsonl(),
}


class _DownForSome(_Handler):
    """Answers 503 (a transient error, retried until retry_seconds runs out) for paths
    holding "down", and stalls mid-body for paths holding "stall"; serves the rest."""

    def do_GET(self) -> None:  # noqa: N802
        if not self._faulty():
            super().do_GET()
        elif "stall" in self.path:
            self.wfile.write(b'{"id": 1}\n')
            self.wfile.flush()
            time.sleep(3)  # past the read timeout (0.3 s) and retry_seconds (0.5 s)

    def do_HEAD(self) -> None:  # noqa: N802
        if not self._faulty():
            super().do_HEAD()

    def _faulty(self) -> bool:
        """Answer a faulty path's status line and headers; whether it was one."""
        if "down" in self.path:
            self.send_error(503, "injected outage")
        elif "stall" in self.path:
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
        else:
            return False
        return True


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("served-credentials")
    (root / "a.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(40)))
    (root / "b.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(40, 80)))
    (root / "bad.jsonl").write_text('{"id": 100}\n{bad\n{"id": 102}\n')
    for name, data in BAD_FILES.items():
        (root / name).write_bytes(data)
    (root / "listing").mkdir()
    for index in range(3):
        (root / "listing" / f"part{index}.jsonl").write_text(json.dumps({"id": index}) + "\n")
    fsspec.asyn.get_loop()  # fsspec's shared loop thread, started before any test counts
    with serve(root, handler=_DownForSome) as server:
        yield server


def url(server: Any, name: str, password: str = SECRETS[0], query: str = QUERY) -> str:
    host = server.url.split("//", 1)[1]
    return f"http://alice:{password}@{host}/{name}?{query}"


class Channels:
    """Everything a run can write: exceptions (formatted with chain and notes), warnings,
    log records, states and the files under the test's folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.texts: list[str] = []

    def error(self, action: Any) -> BaseException:
        with pytest.raises(Exception) as caught:
            action()
        self.texts.append("".join(traceback.format_exception(caught.value)))
        self.texts.append(repr(caught.value) + repr(getattr(caught.value, "__notes__", "")))
        return caught.value

    def check(self, captured: Any, records: list[logging.LogRecord]) -> None:
        self.texts += [captured.out, captured.err, *(r.getMessage() for r in records)]
        for path in self.folder.rglob("*"):
            if path.is_file():
                self.texts.append(path.read_bytes().decode("latin-1"))
        everything = "\n".join(self.texts)
        assert len(everything) > 1000  # it did capture the runs
        leaked = [s for s in SECRETS if s in everything]
        assert not leaked, f"{leaked} found in:\n{everything[:3000]}"


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_no_credential_reaches_any_channel(
    served: Any,
    workers: int,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    seen = Channels(tmp_path)
    good = dp.files([url(served, "a.jsonl"), url(served, "b.jsonl")], **HEADERS).read_jsonl()
    seen.texts += [repr(good), good.fingerprint(), str(good.steps())]
    loader = dp.Loader(good, num_workers=workers, stats=True, progress=True)
    with loader.trace(tmp_path / "trace.json"):
        it = iter(loader)
        head = [next(it) for _ in range(7)]
    assert [r["id"] for r in head] == [r["id"] for r in list(dp.Loader(good))[:7]]
    state = loader.state_dict()
    seen.texts += [json.dumps(state), repr(loader.stats()), repr(loader.skipped())]
    dp.save_checkpoint({"loader": state}, tmp_path / "ckpt.pt")
    seen.texts.append(describe_checkpoint(dp.load_checkpoint(tmp_path / "ckpt.pt"), good))
    loader.close()

    # a missing file, a bad record raised, a bad record skipped (warned, counted)
    missing = dp.files([url(served, "missing.jsonl"), url(served, "a.jsonl")], **HEADERS)
    missing = missing.read_jsonl()
    assert isinstance(
        seen.error(lambda: list(dp.Loader(missing, num_workers=workers))), FileNotFoundError
    )
    bad = dp.files([url(served, "bad.jsonl"), url(served, "a.jsonl")]).read_jsonl()
    assert type(seen.error(lambda: list(dp.Loader(bad, num_workers=workers)))).__name__ == (
        "BadRecordError"
    )
    skipping = dp.files([url(served, "bad.jsonl"), url(served, "a.jsonl")])
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        tolerant = dp.Loader(skipping.read_jsonl(on_error="skip"), num_workers=workers)
        assert len(list(tolerant)) == 42
    # The main process warns; a worker forked inside catch_warnings(record=True) records
    # its warning in its own copy of the list, so there the count is what shows the skip.
    assert list(tolerant.skipped().values()) == [1]
    assert warned or workers, "the skip warns"
    seen.texts += [str(w.message) for w in warned]
    seen.texts += [
        repr(tolerant.skipped()),
        repr(tolerant.losses()),
        json.dumps(tolerant.state_dict()),
    ]

    # a bad record (or damaged file) of every format
    for name, reading in READS.items():
        pipe = reading(dp.files([url(served, name)]))
        seen.error(lambda pipe=pipe: list(dp.Loader(pipe, num_workers=workers)))

    # ranks that listed different files (one added between their starts)
    if not workers:
        host = served.url.split("//", 1)[1]
        listed = dp.files(f"http://alice:{SECRETS[0]}@{host}/listing/*.jsonl").read_jsonl()
        store = private_file_store()
        ranks = [
            dp.Loader(listed, rank=r, world_size=2, dispatch="dynamic", store=store)
            for r in range(2)
        ]
        next(iter(ranks[0]))
        (served.root / "listing" / "part3.jsonl").write_text('{"id": 3}\n')
        mismatch = seen.error(lambda: next(iter(ranks[1])))
        assert type(mismatch).__name__ == "ListingMismatchError" and "part3" in str(mismatch)
        seen.texts.append(Path(store.path).read_bytes().decode("latin-1"))  # the store's file
        for rank in ranks:
            rank.close()

    # a worker that dies mid-epoch
    if workers:
        dying = good.map(_exit_at_three)
        seen.error(lambda: list(dp.Loader(dying, num_workers=workers)))

    # a server that keeps failing: retried until retry_seconds, then a ReadFailedError
    down = dp.files([url(served, "down.jsonl"), url(served, "a.jsonl")], retry_seconds=0.5)
    failed = seen.error(lambda: list(dp.Loader(down.read_jsonl(), num_workers=workers)))
    assert "503" in str(failed) or "503" in repr(failed.__cause__), failed

    # a server that stops sending mid-body: timed out, retried, then a ReadFailedError
    stalled = dp.files([url(served, "stall.jsonl")], timeout=0.3, retry_seconds=0.5)
    seen.error(lambda: list(dp.Loader(stalled.read_jsonl(), num_workers=workers)))

    # a changed recipe (another version of the data): refused, showing masked URLs
    other = dp.files(
        [
            url(served, "a.jsonl", query=QUERY.replace("version=2", "version=3")),
            url(served, "b.jsonl", query=QUERY.replace("version=2", "version=3")),
        ]
    )
    refusing = dp.Loader(other.read_jsonl(), num_workers=workers)
    refusal = seen.error(lambda: refusing.load_state_dict(state))
    assert "version=3" in str(refusal) and "version=2" in str(refusal)
    seen.check(capfd.readouterr(), caplog.records)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("change", ["rotated password", "re-signed query"])
def test_a_checkpoint_resumes_exactly_when_only_the_credentials_changed(
    served: Any, workers: int, change: str
) -> None:
    before = [url(served, "a.jsonl"), url(served, "b.jsonl")]
    if change == "rotated password":
        after = [url(served, n, password="PW-rotated-2027") for n in ("a.jsonl", "b.jsonl")]
    else:
        resigned = "X-Amz-Signature=SIG-new&token=TOK-new&version=2"
        after = [url(served, n, query=resigned) for n in ("a.jsonl", "b.jsonl")]
    recipe = lambda urls: dp.files(urls).read_jsonl().shuffle(buffer_size=8)  # noqa: E731
    whole = [r["id"] for r in dp.Loader(recipe(before), seed=3, num_workers=workers)]
    loader = dp.Loader(recipe(before), seed=3, num_workers=workers)
    it = iter(loader)
    head = [next(it)["id"] for _ in range(25)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    loader.close()
    resumed = dp.Loader(recipe(after), seed=3, num_workers=workers)
    resumed.load_state_dict(state)
    assert head + [r["id"] for r in resumed] == whole
    assert sorted(whole) == list(range(80))


def test_a_write_keeps_its_storage_credentials_out_of_the_manifest_and_errors() -> None:
    import fsspec

    secret = "WRITE-s3cr3t-key"
    options = {"key": secret, "client_kwargs": {"aws_secret_access_key": secret + "2"}}
    dest = "memory://credentials-write/out"
    dp.write(dp.range(30).map(_record), dest, records_per_shard=10, storage_options=options)
    fs = fsspec.filesystem("memory")
    written = b"".join(fs.cat(path) for path in fs.find("/credentials-write"))
    assert b'"id": 29' in written or b'"id":29' in written
    with pytest.raises(Exception) as caught:  # another recipe into the same destination
        dp.write(dp.range(31).map(_record), dest, records_per_shard=10, storage_options=options)
    text = "".join(traceback.format_exception(caught.value))
    assert "credentials-write" in text
    assert secret.encode() not in written and secret not in text
    assert repr(dp.read_manifest(dest, **options)).count(secret) == 0


def _exit_at_three(record: dict[str, int]) -> dict[str, int]:
    if record["id"] == 3:
        os._exit(3)  # a worker killed: what the main process then reports names no secret
    return record


def _record(i: int) -> dict[str, int]:
    return {"id": i}


def test_a_torch_dataset_in_a_users_dataloader_scrubs_its_errors(served: Any) -> None:
    from torch.utils.data import DataLoader

    dataset = dp.files([url(served, "bad.jsonl")]).read_jsonl().as_torch_dataset()
    with pytest.raises(Exception) as caught:
        list(DataLoader(dataset, batch_size=None, num_workers=0))
    text = "".join(traceback.format_exception(caught.value))
    assert "bad.jsonl" in text and "line 2" in text
    assert not [s for s in SECRETS if s in text]
