"""Remote faults on a real HTTP server (127.0.0.1): stalls mid-body, outages, persistent failure.

Every fault is bounded in time (a stalled answer is released at the end of its
test, or after 30 s) and every test has a pytest timeout, so none can hang.
The ten-second outage at the issue's scale is marked slow; the rest use
short timeouts and budgets.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
from http_server import FileServer, _Handler, serve

import datapipes as dp
import nodes.storage.source
from nodes.storage import ReadFailedError, RetryPolicy
from nodes.storage.fsspec_http import with_read_timeout

RECORDS = 5_000
BLOCK = 1 << 14  # fsspec's block size: a read asks the server for 16 KiB at a time


class Faults:
    """What the server does wrong: answer 503 until ``outage_until`` (a monotonic time;
    ``inf``: for good), or stall the next ``stalls`` ranged answers after half the body.

    ``paths`` limits the faults to those URL paths (default: all). ``answered_503``
    and ``stalled`` count what was done.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outage_until = 0.0
        self.stalls = 0
        self.paths: set[str] | None = None
        self.answered_503 = 0
        self.stalled = 0
        self.release = threading.Event()  # set at the end of a test: stalled answers end

    def outage(self, seconds: float) -> None:
        with self.lock:
            self.outage_until = time.monotonic() + seconds

    def applies(self, path: str) -> bool:
        return self.paths is None or path.split("?")[0] in self.paths

    def take_503(self, path: str) -> bool:
        with self.lock:
            if self.applies(path) and time.monotonic() < self.outage_until:
                self.answered_503 += 1
                return True
            return False

    def take_stall(self, path: str) -> bool:
        with self.lock:
            if self.applies(path) and self.stalls > 0:
                self.stalls -= 1
                self.stalled += 1
                return True
            return False


class _FaultyHandler(_Handler):
    """The test server's handler, with the faults of ``server_state.faults``."""

    def _faults(self) -> Faults:
        return self.server_state.faults  # type: ignore[attr-defined]

    def do_HEAD(self) -> None:  # noqa: N802
        if self._faults().take_503(self.path):
            self.send_error(503, "injected outage")
            return
        super().do_HEAD()

    def do_GET(self) -> None:  # noqa: N802
        faults = self._faults()
        if faults.take_503(self.path):
            self.send_error(503, "injected outage")
            return
        if "Range" in self.headers and faults.take_stall(self.path):
            self._stall(faults)
            return
        super().do_GET()

    def _stall(self, faults: Faults) -> None:
        """Announce the whole range, send half of it, then send nothing (until released)."""
        path = self.translate_path(self.path)
        start, end = (int(x or 0) for x in self.headers["Range"][6:].split("-"))
        body = self.start_partial_content(path, start, end, "*")
        try:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
        except OSError:
            return
        faults.release.wait(30)  # bounded: the server never holds a thread for ever
        self.close_connection = True


@pytest.fixture
def served(tmp_path: Path):
    """A server of two JSONL files (``a``, ``b``) of ``RECORDS`` records each, with faults."""
    for name in ("a", "b"):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            for i in range(RECORDS):
                f.write(json.dumps({"file": name, "i": i, "pad": "x" * (i % 37)}) + "\n")
    with serve(tmp_path, handler=_FaultyHandler) as server:
        faults = server.faults = Faults()  # type: ignore[attr-defined]
        try:
            yield server, faults
        finally:
            faults.release.set()


def _url(server: FileServer, name: str = "a") -> str:
    return f"{server.url}/{name}.jsonl"


def _ids(records: list[dict]) -> list[tuple[str, int]]:
    return [(r["file"], r["i"]) for r in records]


def _read_with_fault(loader: dp.Loader, fault, after: int = 1000) -> list[dict]:
    """All records of ``loader``, starting ``fault()`` after the first ``after``: the fault
    meets a file half read, as it would mid-epoch."""
    records = []
    for record in loader:
        records.append(record)
        if len(records) == after:
            fault()
    return records


def _assert_exactly_once(records: list[dict], names: str = "a") -> None:
    expected = [(name, i) for name in names for i in range(RECORDS)]
    ids = _ids(records)
    assert len(ids) == len(set(ids)), "a record was delivered twice"
    assert sorted(ids) == expected, "a record is missing"


# ----- stalls --------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("watchdog", [True, False], ids=["watchdog", "aiohttp-timeout-alone"])
def test_a_stall_mid_body_is_retried_within_the_timeout(served, monkeypatch, watchdog):
    server, faults = served
    if not watchdog:  # the read timeout handed to aiohttp must do it alone, too
        monkeypatch.setattr(nodes.storage.source, "can_stall", lambda fs: False)
    pipe = dp.files(_url(server), timeout=0.5, block_size=BLOCK).read_jsonl()
    started = time.monotonic()
    records = _read_with_fault(dp.Loader(pipe), lambda: setattr(faults, "stalls", 1))
    elapsed = time.monotonic() - started
    assert faults.stalled == 1  # the stall happened, mid-file
    _assert_exactly_once(records)
    assert elapsed < 10, f"a 0.5 s timeout took {elapsed:.1f} s to get past a stall"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stall_in_a_dataloader_worker_is_retried_too(served):
    server, faults = served
    faults.stalls = 2  # the first ranged answers: each worker's first read of its file
    pipe = dp.files([_url(server, "a"), _url(server, "b")], timeout=0.5, block_size=BLOCK)
    loader = dp.Loader(pipe.read_jsonl(), num_workers=2)
    started = time.monotonic()
    records = list(loader)
    assert faults.stalled == 2
    _assert_exactly_once(records, names="ab")
    assert time.monotonic() - started < 30


@pytest.mark.timeout(60)
def test_a_server_that_keeps_stalling_fails_naming_url_offset_and_timeout(served):
    server, faults = served
    pipe = dp.files(_url(server), timeout=0.5, retry_seconds=1, block_size=BLOCK).read_jsonl()
    started = time.monotonic()
    with pytest.raises(ReadFailedError) as caught:
        _read_with_fault(dp.Loader(pipe), lambda: setattr(faults, "stalls", 1000))
    elapsed = time.monotonic() - started
    assert elapsed < 10, f"gave up after {elapsed:.1f} s (about 0.5 + 1 + 0.5 expected)"
    message = str(caught.value)
    assert _url(server) in message
    offset = re.search(r"byte offset (\d+)", message)
    assert offset is not None and int(offset.group(1)) > 0, message  # mid-file, not at 0
    assert "timeout=0.5 s" in message and "retry_seconds=1" in message
    assert faults.stalled >= 2  # retried before giving up


# ----- outages -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_ten_second_outage_is_ridden_out_by_the_default_retries(served):
    server, faults = served
    pipe = dp.files(_url(server), block_size=BLOCK).read_jsonl()  # the default limits
    started = time.monotonic()
    records = _read_with_fault(dp.Loader(pipe), lambda: faults.outage(10))
    elapsed = time.monotonic() - started
    assert faults.answered_503 >= 5  # the outage was met and retried through
    _assert_exactly_once(records)
    assert 10 <= elapsed < 10 + 5 + 5  # back within the longest back-off (5 s) of its end


@pytest.mark.timeout(60)
def test_a_short_outage_is_ridden_out_within_a_small_budget(served):
    server, faults = served
    pipe = dp.files(_url(server), retry_seconds=5, block_size=BLOCK).read_jsonl()
    started = time.monotonic()
    records = _read_with_fault(dp.Loader(pipe), lambda: faults.outage(1.5))
    assert faults.answered_503 >= 2
    _assert_exactly_once(records)
    assert time.monotonic() - started < 1.5 + 5


@pytest.mark.timeout(60)
def test_persistent_failure_gives_a_clear_error_naming_the_url(served):
    server, faults = served
    pipe = dp.files(_url(server), retry_seconds=1, block_size=BLOCK).read_jsonl()
    started = time.monotonic()
    with pytest.raises(ReadFailedError) as caught:
        _read_with_fault(dp.Loader(pipe), lambda: faults.outage(float("inf")))
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert _url(server) in message and "503" in message
    assert re.search(r"failed after \d+ attempt\(s\) in 1\.\d s", message), message
    assert "retry_seconds=1" in message and "raise retry_seconds=" in message


@pytest.mark.timeout(60)
def test_an_outage_beyond_the_budget_skips_that_file_under_skip(served):
    server, faults = served
    faults.paths = {"/a.jsonl"}
    faults.outage(float("inf"))
    pipe = dp.files([_url(server, "a"), _url(server, "b")], retry_seconds=0.5).read_jsonl(
        on_error="skip"
    )
    with pytest.warns(dp.BadRecordWarning, match=re.escape(_url(server, "a"))):
        loader = dp.Loader(pipe)
        records = list(loader)
    _assert_exactly_once(records, names="b")  # the other file whole, nothing of the lost one
    assert sum(loader.skipped().values()) >= 1  # the lost file is counted, never silent
    assert faults.answered_503 >= 2  # it was retried before it was given up


# ----- the limits: defaults, validation, identity ----------------------------------------


def test_the_limits_default_to_a_minute_and_are_validated(tmp_path: Path):
    files = dp.files(str(tmp_path / "*.jsonl"))
    policy = files._retries  # type: ignore[attr-defined]
    assert (policy.timeout, policy.retry_seconds, policy.retries) == (60, 60, None)
    for bad in ({"timeout": 0}, {"timeout": "1"}, {"retry_seconds": -1}, {"retries": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            dp.files(str(tmp_path / "*.jsonl"), **bad)
    assert dp.files(str(tmp_path / "*.jsonl"), timeout=None)._retries.timeout is None  # type: ignore[attr-defined]


def test_the_limits_are_not_part_of_the_recipes_identity(tmp_path: Path):
    pattern = str(tmp_path / "*.jsonl")
    plain = dp.files(pattern).shuffle().read_jsonl()
    tuned = dp.files(pattern, timeout=5, retry_seconds=600).shuffle().read_jsonl()
    assert tuned.fingerprint() == plain.fingerprint()
    assert tuned._key() == plain._key()  # the same shuffle orders
    assert repr(tuned) == repr(plain)  # the same names for skip counts
    # An explicit retries count keeps its pre-issue-14 identity: checkpoints taken with
    # retries=5 still match (and retries=3, the old default, is left out as it was).
    assert dp.files(pattern, retries=3).shuffle().read_jsonl().fingerprint() == plain.fingerprint()
    with_count = dp.files(pattern, retries=5).shuffle().read_jsonl()
    assert with_count.fingerprint() != plain.fingerprint()
    assert "retries=5" in repr(with_count)


def test_http_storage_options_get_the_read_timeout_unless_the_user_set_one():
    options = with_read_timeout("http://h/a.jsonl", {"headers": {"x": "1"}}, 7.0)
    timeout = options["client_kwargs"]["timeout"]
    assert (timeout.sock_read, timeout.sock_connect, timeout.total) == (7.0, 7.0, None)
    assert options["headers"] == {"x": "1"}
    mine = {"client_kwargs": {"timeout": "the user's"}}
    assert with_read_timeout("https://h/a", mine, 7.0) is mine
    assert with_read_timeout("s3://b/a", {}, 7.0) == {}
    assert with_read_timeout("/local/a", {}, 7.0) == {}
    assert with_read_timeout("http://h/a", {}, None) == {}


@pytest.mark.timeout(60)
def test_a_local_file_is_read_without_a_watchdog_thread(tmp_path: Path):
    (tmp_path / "a.jsonl").write_text("".join(f'{{"i": {i}}}\n' for i in range(100)))
    before = set(threading.enumerate())  # earlier tests' remote reads may still be ending
    seen = []
    loader = dp.Loader(dp.files(str(tmp_path / "a.jsonl")).read_jsonl())
    for _ in loader:
        seen.append({t.name for t in threading.enumerate() if t not in before})
    assert len(seen) == 100
    assert not any("datapipes-read" in name for names in seen for name in names)
    assert RetryPolicy().timeout == 60
