"""RetryingFile and ForwardOnlyFile on their own, over a fake opener of in-memory bytes.

The fake injects what a network does to a read: short reads, transient errors,
permanent errors and connections cut mid-file, and counts how often the file
is opened. (tests/readers/test_readers.py runs the same classes against real servers.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import io
import itertools
import random
import threading
import time

import aiohttp
import fsspec.exceptions
import pytest
import yarl
from multidict import CIMultiDict, CIMultiDictProxy

from nodes.storage import (
    ForwardOnlyFile,
    ReadFailedError,
    RetryingFile,
    RetryPolicy,
    is_transient,
    read_full,
    skip_forward,
    with_retries,
)
from nodes.storage.retry import FIRST_WAIT, MAX_WAIT

URL = "https://example.test/data.bin"
DATA = random.Random(0).randbytes(5000)  # no byte pattern repeats at a short distance
NO_WAIT = 1e-5  # back-off of the retries: these tests need not wait for a server


class Fault:
    """An error raised once: by the read or seek that reaches byte ``at``, or by the next open.

    Reads stop short of a pending read fault, so the connection delivers the
    bytes before ``at`` and then breaks: a cut mid-file.
    """

    def __init__(self, at: int, error: BaseException, on: str = "read") -> None:
        self.at, self.error, self.on = at, error, on


class FakeOpener:
    """Opens ``data`` as a fresh in-memory file at its start; counts opens and bytes served.

    ``chunk`` caps each read of a given size (a stream hands out what has
    arrived; ``read()`` still reads to the end); ``faults`` are consumed in
    order of offset; ``seekable=False`` makes a stream whose ``seek`` fails,
    as an HTTP stream without Range support.
    """

    def __init__(
        self,
        data: bytes = DATA,
        *,
        chunk: int | None = None,
        faults: list[Fault] | tuple[Fault, ...] = (),
        seekable: bool = True,
    ) -> None:
        self.data, self.chunk, self.seekable = data, chunk, seekable
        self.faults = sorted(faults, key=lambda fault: fault.at)
        self.opens = 0
        self.served = 0  # bytes handed out by all reads of all opened files
        self.files: list[FakeFile] = []

    def __call__(self) -> FakeFile:
        self.opens += 1
        self.fail("open", len(self.data))  # whatever its offset
        file = FakeFile(self)
        self.files.append(file)
        return file

    def fail(self, on: str, at: int) -> None:
        """Raise the first pending ``on`` fault at or before ``at``, consuming it."""
        for fault in self.faults:
            if fault.on == on and fault.at <= at:
                self.faults.remove(fault)
                raise fault.error

    def stop_before(self, start: int, end: int) -> int:
        """Where a read from ``start`` ends: short of the next pending read fault."""
        for fault in self.faults:
            if fault.on == "read" and start < fault.at < end:
                return fault.at
        return end

    @property
    def open_files(self) -> int:
        return sum(not file.closed for file in self.files)


class FakeFile:
    """One opened file of a :class:`FakeOpener`."""

    def __init__(self, opener: FakeOpener) -> None:
        self.opener, self.pos, self.closed = opener, 0, False

    def read(self, size: int | None = -1) -> bytes:
        assert not self.closed, "read of a closed file"
        opener, length = self.opener, len(self.opener.data)
        opener.fail("read", self.pos)
        if size is None or size < 0:
            end = length
        else:
            end = min(length, self.pos + size)
            if opener.chunk is not None:
                end = min(end, self.pos + opener.chunk)
        end = max(self.pos, opener.stop_before(self.pos, end))
        data = opener.data[self.pos : end]
        self.pos += len(data)
        opener.served += len(data)
        return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        assert not self.closed, "seek of a closed file"
        if not self.opener.seekable:
            raise io.UnsupportedOperation("a stream cannot seek")
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.opener.data)}
        target = base[whence] + offset
        self.opener.fail("seek", target)
        self.pos = target
        return target

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        self.closed = True


def retrying(opener: FakeOpener, retries: int = 3, **kwargs) -> RetryingFile:
    return RetryingFile(URL, opener, retries, backoff=NO_WAIT, **kwargs)


def forward_only(opener: FakeOpener, size: int | None = len(DATA)) -> ForwardOnlyFile:
    sizes = []

    def ask_size() -> int | None:
        sizes.append(size)
        return size

    file = ForwardOnlyFile(opener, ask_size)
    file.size_queries = sizes  # type: ignore[attr-defined]
    return file


TRANSIENT = [
    ConnectionResetError(errno.ECONNRESET, "connection reset by peer"),
    TimeoutError("timed out"),
    OSError(errno.EIO, "input/output error"),
    OSError(errno.ETIMEDOUT, "timed out"),
    aiohttp.ClientPayloadError("response payload is not completed"),
]
TRANSIENT_IDS = ["reset", "timeout", "EIO", "ETIMEDOUT", "aiohttp-payload"]


# ----- the fake itself --------------------------------------------------------------------


def test_the_fake_cuts_short_of_a_fault_then_raises_it_once():
    opener = FakeOpener(faults=[Fault(10, TimeoutError("t"))])
    file = opener()
    assert file.read(100) == DATA[:10]
    with pytest.raises(TimeoutError):
        file.read(100)
    assert file.read(5) == DATA[10:15]
    assert opener.served == 15


# ----- RetryingFile -----------------------------------------------------------------------


def test_retrying_file_reads_what_its_file_gives_and_tells_the_position():
    opener = FakeOpener(chunk=7)
    file = retrying(opener)
    assert file.read(100) == DATA[:7]  # a short read passes through
    assert file.tell() == 7
    assert read_full(file, 100) == DATA[7:107]
    assert file.tell() == 107
    assert file.read() == DATA[107:]  # to the end, as a file's read() does
    assert file.tell() == len(DATA)
    assert file.read(10) == b""
    assert file.tell() == len(DATA)
    assert opener.opens == 1 and file.retried == 0


@pytest.mark.parametrize("error", TRANSIENT, ids=TRANSIENT_IDS)
def test_a_read_after_a_transient_error_resumes_at_the_same_offset(error):
    opener = FakeOpener(faults=[Fault(1234, error)])
    file = retrying(opener)
    assert file.read(1000) == DATA[:1000]
    assert read_full(file, 2000) == DATA[1000:3000]  # broken at 1234, reopened there
    assert file.tell() == 3000
    assert opener.opens == 2 and file.retried == 1
    assert opener.open_files == 1  # the broken handle was closed
    assert file.read() == DATA[3000:]


def test_a_cut_before_the_first_byte_of_a_read_is_retried_without_losing_bytes():
    opener = FakeOpener(faults=[Fault(0, ConnectionResetError()), Fault(4000, TimeoutError())])
    file = retrying(opener)
    assert read_full(file, len(DATA) + 10) == DATA
    assert file.tell() == len(DATA)
    assert opener.opens == 3 and file.retried == 2


def test_a_reopen_that_fails_too_counts_as_a_retry():
    opener = FakeOpener(faults=[Fault(100, TimeoutError())])
    file = retrying(opener, retries=2)
    opener.faults.append(Fault(0, ConnectionResetError(), on="open"))  # fails the reopen
    assert read_full(file, 300) == DATA[:300]
    assert file.retried == 2  # the read, then the reopen after it
    assert opener.opens == 3  # the first open, the failed reopen, the good one


def test_a_seek_of_the_reopened_file_that_fails_is_retried():
    opener = FakeOpener(faults=[Fault(2000, TimeoutError()), Fault(2000, OSError(errno.EIO, "x"))])
    opener.faults[1].on = "seek"
    file = retrying(opener)
    file.seek(1500)
    assert file.read(1000) == DATA[1500:2000]
    assert read_full(file, 500) == DATA[2000:2500]
    assert file.tell() == 2500
    assert file.retried == 2


def test_retries_are_bounded_and_the_error_names_the_url_and_offset():
    opener = FakeOpener(faults=[Fault(50, TimeoutError(f"timeout {i}")) for i in range(10)])
    file = retrying(opener, retries=3)
    assert file.read(200) == DATA[:50]
    with pytest.raises(ReadFailedError) as caught:
        file.read(200)
    message = str(caught.value)
    assert URL in message
    assert "read at byte offset 50" in message
    assert "after 4 attempt(s)" in message
    assert "TimeoutError: timeout 3" in message  # the last error, with its type
    assert isinstance(caught.value.__cause__, TimeoutError)
    assert file.retried == 3 and opener.opens == 4
    assert file.tell() == 50  # nothing was read past the bytes already returned


def test_no_retries_means_one_attempt():
    opener = FakeOpener(faults=[Fault(10, ConnectionResetError())])
    file = retrying(opener, retries=0)
    assert file.read(100) == DATA[:10]
    with pytest.raises(ReadFailedError, match=r"after 1 attempt\(s\)"):
        file.read(100)
    assert opener.opens == 1


@pytest.mark.parametrize("on", ["open", "read"])
def test_a_missing_file_is_not_retried(on):
    opener = FakeOpener(faults=[Fault(0, FileNotFoundError("gone"), on=on)])
    with pytest.raises(FileNotFoundError, match="no such file") as caught:
        read_full(retrying(opener), 10)
    assert URL in str(caught.value)
    assert opener.opens == 1


@pytest.mark.parametrize(
    "error",
    [PermissionError(errno.EACCES, "denied"), OSError(errno.EINVAL, "invalid argument")],
    ids=["PermissionError", "EINVAL"],
)
@pytest.mark.parametrize("on", ["open", "read"])
def test_permanent_errors_are_not_retried(error, on):
    opener = FakeOpener(faults=[Fault(0, error, on=on)])
    with pytest.raises(ReadFailedError, match=r"after 1 attempt\(s\)") as caught:
        retrying(opener).read(10)
    assert URL in str(caught.value)
    assert caught.value.__cause__ is error
    assert opener.opens == 1


def test_a_permanent_error_mid_file_is_not_retried():
    opener = FakeOpener(faults=[Fault(300, PermissionError("revoked"))])
    file = retrying(opener)
    assert file.read(1000) == DATA[:300]
    with pytest.raises(ReadFailedError, match="read at byte offset 300"):
        file.read(1000)
    assert opener.opens == 1 and file.retried == 0


def test_retrying_file_seeks_only_record_the_position():
    opener = FakeOpener()
    file = retrying(opener)
    assert file.seek(4000) == 4000 and file.tell() == 4000
    assert file.seek(-1000, io.SEEK_CUR) == 3000 and file.tell() == 3000
    assert opener.served == 0  # nothing read yet
    assert file.read(10) == DATA[3000:3010]
    assert file.tell() == 3010
    assert file.seek(-10, io.SEEK_END) == len(DATA) - 10
    assert file.read() == DATA[-10:]
    assert file.seek(5) == 5 and file.read(5) == DATA[5:10]
    assert opener.opens == 1  # the file seeks; no reopen
    with pytest.raises(ValueError, match="negative seek position"):
        file.seek(-1)
    assert file.tell() == 10


def test_a_seek_from_the_end_to_where_the_file_is_still_reads_there():
    """Asking for the end moves the handle there; the next read must come back."""
    opener = FakeOpener()
    file = retrying(opener)
    assert read_full(file, len(DATA) - 10) == DATA[:-10]
    assert file.seek(-10, io.SEEK_END) == len(DATA) - 10 == file.tell()
    assert file.read(4) == DATA[-10:-6] and file.tell() == len(DATA) - 6


def test_retrying_file_stream_instead_is_asked_once_with_the_cause():
    range_error = ValueError("this server ignores ranges")
    stream = FakeOpener()
    seekable = FakeOpener(faults=[Fault(0, range_error)])
    asked = []

    def opener():
        return stream() if asked else seekable()

    def stream_instead(cause):
        asked.append(cause)
        return True

    file = RetryingFile(URL, opener, 3, backoff=NO_WAIT, stream_instead=stream_instead)
    assert file.read(100) == DATA[:100]
    assert asked == [range_error]
    assert stream.opens == 1 and seekable.opens == 1 and seekable.open_files == 0
    stream.faults.append(Fault(200, ValueError("another permanent error")))
    assert file.read(100) == DATA[100:200]
    with pytest.raises(ReadFailedError):  # not asked again: the switch happens once
        file.read(100)
    assert len(asked) == 1


def test_retrying_file_raises_when_stream_instead_says_no():
    opener = FakeOpener(faults=[Fault(0, ValueError("bad"))])
    asked = []

    def stream_instead(cause):
        asked.append(cause)
        return False

    file = RetryingFile(URL, opener, 3, backoff=NO_WAIT, stream_instead=stream_instead)
    with pytest.raises(ReadFailedError, match="ValueError: bad"):
        file.read(10)
    assert len(asked) == 1 and opener.opens == 1


def test_closing_a_retrying_file_closes_its_handle():
    opener = FakeOpener()
    with retrying(opener) as file:
        assert io.BufferedReader(file, 64).read(300) == DATA[:300]
    assert opener.open_files == 0 and file.closed


# ----- ForwardOnlyFile --------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_forward_only_reads_return_what_was_asked_despite_short_reads(chunk):
    opener = FakeOpener(chunk=chunk, seekable=False)
    file = forward_only(opener)
    assert file.read(0) == b"" and file.tell() == 0
    assert file.read(100) == DATA[:100] and file.tell() == 100
    assert file.read(2345) == DATA[100:2445] and file.tell() == 2445
    assert file.read() == DATA[2445:] and file.tell() == len(DATA)
    assert file.read(10) == b"" and file.tell() == len(DATA)
    assert opener.opens == 1


def test_forward_only_seeks_forward_by_reading_without_reopening():
    opener = FakeOpener(chunk=100, seekable=False)
    file = forward_only(opener)
    assert file.seek(3000) == 3000 and file.tell() == 3000
    assert opener.served == 0  # a seek only records the position
    assert file.read(10) == DATA[3000:3010] and file.tell() == 3010
    assert file.seek(500, io.SEEK_CUR) == 3510
    assert file.read(10) == DATA[3510:3520]
    assert opener.opens == 1 and opener.served == 3520


def test_forward_only_seeks_backward_by_reopening():
    opener = FakeOpener(seekable=False)
    file = forward_only(opener)
    assert file.read(2000) == DATA[:2000]
    assert file.seek(1000) == 1000 and file.tell() == 1000
    assert opener.opens == 1  # reopened by the read, not the seek
    assert file.read(10) == DATA[1000:1010] and file.tell() == 1010
    assert opener.opens == 2 and opener.open_files == 1  # the old stream was closed
    assert file.seek(1010) == 1010 and file.read(5) == DATA[1010:1015]
    assert opener.opens == 2  # a seek to where it is reopens nothing


def test_forward_only_seek_from_the_end_with_a_known_size_reads_nothing_until_the_read():
    opener = FakeOpener(seekable=False)
    file = forward_only(opener, size=len(DATA))
    assert file.seek(-100, io.SEEK_END) == len(DATA) - 100
    assert opener.served == 0
    assert file.seek(-50, io.SEEK_END) == len(DATA) - 50
    assert file.size_queries == [len(DATA)]  # asked once
    assert file.read() == DATA[-50:] and file.tell() == len(DATA)
    assert opener.opens == 1


def test_forward_only_seek_from_the_end_without_a_size_reads_to_the_end_once():
    opener = FakeOpener(seekable=False)
    file = forward_only(opener, size=None)
    assert file.seek(-100, io.SEEK_END) == len(DATA) - 100
    assert file.tell() == len(DATA) - 100
    assert opener.served == len(DATA) and opener.opens == 1
    assert file.read(10) == DATA[-100:-90]  # behind the stream: read from the start again
    assert opener.opens == 2 and file.tell() == len(DATA) - 90
    assert file.seek(0, io.SEEK_END) == len(DATA)  # the length is known now
    assert opener.opens == 2 and file.read() == b""


def test_forward_only_read_past_the_end_gives_nothing_and_keeps_the_position():
    opener = FakeOpener(seekable=False)
    file = forward_only(opener, size=None)
    assert file.seek(len(DATA) + 50) == len(DATA) + 50
    assert file.read(10) == b""
    assert file.tell() == len(DATA) + 50
    assert file.seek(10) == 10 and file.read(5) == DATA[10:15]


def test_a_cut_mid_seek_leaves_the_forward_only_file_at_its_position():
    opener = FakeOpener(chunk=256, seekable=False, faults=[Fault(1500, ConnectionResetError())])
    file = forward_only(opener)
    file.seek(3000)
    with pytest.raises(ConnectionResetError):
        file.read(10)
    assert file.tell() == 3000  # the seek target, not where the stream broke


@pytest.mark.parametrize("cut", [1, 1500, 2999, 3000, 3005])
def test_a_cut_mid_seek_through_a_retrying_file_resumes_exactly(cut):
    """As SourceFile reads a server without Range: RetryingFile reopens the stream."""
    opener = FakeOpener(chunk=256, seekable=False, faults=[Fault(cut, TimeoutError())])
    file = RetryingFile(URL, lambda: forward_only(opener), 3, backoff=NO_WAIT)
    assert file.seek(3000) == 3000
    assert read_full(file, 10) == DATA[3000:3010]
    assert file.tell() == 3010
    assert opener.opens == 2 and file.retried == 1
    assert opener.open_files == 1


def test_forward_only_works_under_a_buffered_reader():
    opener = FakeOpener(chunk=5, seekable=False)
    buffered = io.BufferedReader(forward_only(opener), 64)
    assert buffered.read(1000) == DATA[:1000]
    buffered.seek(10)
    assert buffered.read(20) == DATA[10:30]
    assert buffered.tell() == 30
    buffered.close()
    assert opener.open_files == 0


# ----- against io.BytesIO: random operations under random faults ---------------------------


def _random_ops(rng: random.Random, n: int) -> list[tuple[str, int, int]]:
    ops = []
    for _ in range(n):
        kind = rng.choice(["read", "read", "read_all", "seek", "seek", "skip"])
        if kind == "seek":
            whence = rng.choice([io.SEEK_SET, io.SEEK_CUR, io.SEEK_END])
            offset = {
                io.SEEK_SET: rng.randrange(len(DATA) + 20),
                io.SEEK_CUR: rng.randrange(-200, 800),
                io.SEEK_END: -rng.randrange(len(DATA)),
            }[whence]
            ops.append((kind, offset, whence))
        else:
            ops.append((kind, rng.randrange(1, 900), 0))
    return ops


def _apply(file, op: tuple[str, int, int]) -> object:
    kind, a, b = op
    if kind == "read":
        return read_full(file, a)
    if kind == "read_all":  # read() to the end, retried reads included
        return b"".join(iter(file.read, b""))
    if kind == "skip":
        skip_forward(file, file.tell() + a, chunk=97)
        return None
    return file.seek(max(a, -file.tell()) if b == io.SEEK_CUR else a, b)


@pytest.mark.parametrize("watched", [False, True], ids=["direct", "watched"])
@pytest.mark.parametrize("stream", [False, True], ids=["seekable", "forward-only"])
@pytest.mark.parametrize("seed", range(12))
def test_random_reads_and_seeks_match_bytesio_despite_cuts(stream, seed, watched):
    rng = random.Random(seed)
    faults = [
        Fault(rng.randrange(len(DATA)), rng.choice(TRANSIENT), rng.choice(["read", "read", "open"]))
        for _ in range(rng.randrange(6))
    ]
    if not stream:
        faults += [Fault(rng.randrange(len(DATA)), TimeoutError(), "seek")]
    opener = FakeOpener(chunk=rng.choice([None, 13, 400]), seekable=not stream, faults=faults)
    # Watched: under a watchdog, with pieces and read-ahead small enough to matter here.
    policy = RetryPolicy(retries=10, first_wait=NO_WAIT, timeout=30)
    if stream:
        size = rng.choice([len(DATA), None])
        file = RetryingFile(URL, lambda: forward_only(opener, size), policy, watchdog=watched)
    else:
        file = RetryingFile(URL, opener, policy, watchdog=watched)
    if watched:
        file.watched_piece, file.watched_ahead = rng.choice([(1000, 300), (700, 64), (50, 10)])
    expected = io.BytesIO(DATA)
    for op in _random_ops(rng, 40):
        assert _apply(file, op) == _apply(expected, op), op
        assert file.tell() == expected.tell(), op
    assert file.retried <= len(faults)
    file.close()
    assert opener.open_files == 0


# ----- what counts as transient -----------------------------------------------------------


def _http_error(status: int) -> aiohttp.ClientResponseError:
    """The error aiohttp raises for an HTTP answer with ``status``, as fsspec's HTTP gets it."""
    url = yarl.URL(URL)
    request = aiohttp.RequestInfo(url, "GET", CIMultiDictProxy(CIMultiDict()), url)
    return aiohttp.ClientResponseError(request, (), status=status, message="HTTP error")


def _wrapped(cause: BaseException) -> FileNotFoundError:
    """fsspec's HTTP filesystem raises a failed request as FileNotFoundError from it."""
    try:
        raise FileNotFoundError("http://host/a") from cause
    except FileNotFoundError as error:
        return error


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        *[(error, True) for error in TRANSIENT],
        (FileNotFoundError("a"), False),
        (PermissionError("a"), False),
        (IsADirectoryError("a"), False),
        (OSError(errno.EINVAL, "a"), False),
        (io.UnsupportedOperation("a"), False),
        (ValueError("a"), False),
        (_http_error(503), True),
        (_http_error(429), True),
        (_http_error(404), False),
        (_wrapped(_http_error(500)), True),
        (_wrapped(_http_error(404)), False),
        (_wrapped(ConnectionResetError()), True),
        # not the builtin TimeoutError on Python 3.10
        (asyncio.TimeoutError(), True),
        (fsspec.exceptions.FSTimeoutError(), True),
        (concurrent.futures.TimeoutError(), True),
    ],
)
def test_is_transient(error, transient):
    assert is_transient(error) is transient


@pytest.mark.parametrize(("status", "raised"), [(403, PermissionError), (404, FileNotFoundError)])
def test_a_refused_or_missing_http_file_is_said_so(status, raised):
    calls = []

    def action():
        calls.append(1)
        raise _wrapped(_http_error(status))

    with pytest.raises(raised, match=URL):
        with_retries(action, 3, url=URL, doing=lambda: "size query", backoff=NO_WAIT)
    assert len(calls) == 1


def test_a_wrapped_transient_http_error_is_retried_and_shown_unwrapped():
    calls = []

    def action():
        calls.append(1)
        raise _wrapped(_http_error(503))

    with pytest.raises(ReadFailedError, match="size query failed after 3 attempt") as caught:
        with_retries(action, 2, url=URL, doing=lambda: "size query", backoff=NO_WAIT)
    assert "ClientResponseError: 503" in str(caught.value)  # the HTTP error, not the wrapper
    assert len(calls) == 3


# ----- the retry policy: back-off schedule, count and time caps, read timeout ---------------


class FakeClock:
    """A clock that only moves when slept on: retry schedules without waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _policy(clock: FakeClock, **limits) -> RetryPolicy:
    return RetryPolicy(clock=clock.clock, sleep=clock.sleep, **limits)


def _always_failing(calls: list[int], error: BaseException | None = None):
    def action():
        calls.append(1)
        raise TimeoutError("timed out") if error is None else error

    return action


def test_the_backoff_doubles_up_to_its_cap_with_a_deterministic_jitter():
    policy = RetryPolicy()
    first = list(itertools.islice(policy.waits("a"), 12))
    assert first == list(itertools.islice(policy.waits("a"), 12))  # same key, same schedule
    assert first != list(itertools.islice(policy.waits("b"), 12))  # another read, other jitter
    for k, wait in enumerate(first):
        cap = min(MAX_WAIT, FIRST_WAIT * 2**k)
        assert cap / 2 <= wait < cap, (k, wait)
    assert first[:3] != [FIRST_WAIT, 2 * FIRST_WAIT, 4 * FIRST_WAIT]  # jittered, not exact
    state = random.getstate()
    list(itertools.islice(policy.waits("a"), 5))
    assert random.getstate() == state  # the global RNG is the user's


def test_retries_stop_at_retry_seconds_with_a_last_attempt_at_the_deadline():
    clock, calls = FakeClock(), []
    with pytest.raises(ReadFailedError) as caught:
        with_retries(
            _always_failing(calls),
            _policy(clock, retry_seconds=20),
            url=URL,
            doing=lambda: "read at byte offset 7",
        )
    assert sum(clock.slept) == pytest.approx(20)  # the last wait is cut to end at 20 s
    assert max(clock.slept) <= MAX_WAIT
    assert clock.slept == pytest.approx(
        [
            *itertools.islice(_policy(clock).waits(f"{URL} read at byte offset 7"), len(calls) - 2),
            clock.slept[-1],
        ]
    )
    assert len(calls) == len(clock.slept) + 1
    message = str(caught.value)
    assert URL in message and "read at byte offset 7" in message
    assert f"after {len(calls)} attempt(s) in 20.0 s" in message
    assert "retry_seconds=20" in message and "TimeoutError: timed out" in message


def test_the_default_policy_rides_out_a_ten_second_outage():
    clock, calls = FakeClock(), []

    def action():
        calls.append(clock.now)
        if clock.now < 10:
            raise ConnectionResetError(errno.ECONNRESET, "reset")
        return "data"

    assert with_retries(action, _policy(clock), url=URL, doing=lambda: "read") == "data"
    assert 10 <= clock.now < 10 + MAX_WAIT  # retried right after the outage, not long after
    assert len(calls) < 20  # at most 5 s apart: not a busy loop


@pytest.mark.parametrize(
    ("limits", "attempts"),
    [
        ({"retries": 2}, 3),  # the count cap comes first
        ({"retries": 0}, 1),
        ({"retries": 1000, "retry_seconds": 3}, None),  # the time cap comes first
        ({"retry_seconds": 0}, 1),  # no retries at all
    ],
)
def test_whichever_cap_comes_first_ends_the_retries(limits, attempts):
    clock, calls = FakeClock(), []
    with pytest.raises(ReadFailedError, match=r"attempt\(s\)"):
        with_retries(_always_failing(calls), _policy(clock, **limits), url=URL, doing=str)
    if attempts is not None:
        assert len(calls) == attempts
    else:
        assert sum(clock.slept) == pytest.approx(limits["retry_seconds"])
        assert 3 < len(calls) < 1000


def test_a_permanent_error_ends_the_retries_at_once_whatever_the_budget():
    clock, calls = FakeClock(), []
    with pytest.raises(ReadFailedError, match=r"after 1 attempt\(s\)") as caught:
        with_retries(_always_failing(calls, ValueError("bad")), _policy(clock), url=URL, doing=str)
    assert len(calls) == 1 and clock.slept == []
    assert "retry budget" not in str(caught.value)  # retrying would not have helped


@pytest.mark.parametrize(
    "limits",
    [
        {"timeout": 0},
        {"timeout": -1},
        {"timeout": float("nan")},
        {"timeout": float("inf")},
        {"timeout": "60"},
        {"retry_seconds": -1},
        {"retry_seconds": float("nan")},
        {"retries": -1},
        {"retries": True},
        {"retries": 2.0},
    ],
)
def test_invalid_limits_are_refused_naming_the_limit(limits):
    (name,) = limits
    with pytest.raises(ValueError, match=name):
        RetryPolicy(**limits)


class StallingOpener(FakeOpener):
    """A fake opener whose first ``stalls`` files block in their first read at ``at`` until
    released (or 30 s), as a server that stops sending mid-body without closing."""

    def __init__(self, stalls: int, at: int = 1000, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stalls_left, self.at = stalls, at
        self.release = threading.Event()
        self.stalled: list[FakeFile] = []

    def __call__(self) -> FakeFile:
        file = super().__call__()
        if self.stalls_left > 0:
            self.stalls_left -= 1
            self.stalled.append(file)
            read = file.read

            def stalling_read(size: int | None = -1) -> bytes:
                if file.pos >= self.at:
                    self.release.wait(30)  # bounded: a test never hangs
                return read(size)

            file.read = stalling_read  # type: ignore[method-assign]
        return file


def _watched(opener: FakeOpener, **limits) -> RetryingFile:
    """A file under a watchdog that reads what is asked (no read-ahead past a stall point)."""
    policy = RetryPolicy(first_wait=NO_WAIT, **limits)
    file = RetryingFile(URL, opener, policy, watchdog=True)
    file.watched_ahead = 0
    return file


def test_small_reads_under_a_watchdog_are_served_from_one_read_ahead():
    opener = FakeOpener(chunk=None)
    calls = []
    with RetryingFile(URL, opener, RetryPolicy(timeout=5), watchdog=True) as file:
        real = opener.files[0].read

        def read(size: int | None = -1) -> bytes:
            calls.append(size)
            return real(size)

        opener.files[0].read = read  # type: ignore[method-assign]
        assert [read_full(file, 512) for _ in range(4)] == [
            DATA[i : i + 512] for i in range(0, 2048, 512)
        ]
        assert file.tell() == 2048
        assert calls == [file.watched_ahead]  # one call for four tar-header-sized reads
        file.seek(3000)  # within the bytes read ahead: no call
        assert file.read(10) == DATA[3000:3010] and len(calls) == 1
        file.seek(100)  # behind them: read again from there
        assert file.read(10) == DATA[100:110]


def test_a_stalled_read_times_out_and_is_retried_on_a_reopened_file():
    opener = StallingOpener(stalls=1)
    file = _watched(opener, timeout=0.2)
    try:
        assert read_full(file, 1000) == DATA[:1000]
        started = time.monotonic()
        assert read_full(file, 3000) == DATA[1000:4000]  # the stall, then a reopened file
        assert 0.2 <= time.monotonic() - started < 5
        assert opener.opens == 2 and file.retried == 1
        stalled = opener.stalled[0]
        assert not stalled.closed  # its read still runs: closing it under its feet is unsafe
        opener.release.set()
        _wait_for(lambda: stalled.closed)  # closed once the stalled read returned
    finally:
        opener.release.set()
        file.close()


def test_a_read_that_keeps_stalling_fails_naming_the_url_offset_and_timeout():
    opener = StallingOpener(stalls=100)
    file = _watched(opener, timeout=0.1, retry_seconds=0.5)
    try:
        assert read_full(file, 1000) == DATA[:1000]
        started = time.monotonic()
        with pytest.raises(ReadFailedError) as caught:
            file.read(100)
        assert time.monotonic() - started < 5  # about 0.1 + 0.5 + 0.1 s, never a hang
        message = str(caught.value)
        assert URL in message and "read at byte offset 1000" in message
        assert "no progress for 0.1 s" in message and "timeout=0.1 s" in message
        assert isinstance(caught.value.__cause__, TimeoutError)
        assert file.tell() == 1000
    finally:
        opener.release.set()
        file.close()


class SlowOpener(FakeOpener):
    """A fake opener whose reads take ``delay`` seconds per 400 bytes: slow, never stalled."""

    def __init__(self, delay: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.delay = delay

    def __call__(self) -> FakeFile:
        file = super().__call__()
        read = file.read

        def slow_read(size: int | None = -1) -> bytes:
            data = read(size)
            time.sleep(self.delay * max(1, len(data) / 400))
            return data

        file.read = slow_read  # type: ignore[method-assign]
        return file


def test_a_big_read_is_made_of_pieces_so_a_slow_source_is_not_taken_for_a_stalled_one():
    opener = SlowOpener(0.03)
    # A piece may end 0.22 s late (a loaded machine) before it is taken for a stall.
    with _watched(opener, timeout=0.25) as file:
        file.watched_piece = 400  # 12 pieces of 30 ms, not one read of 0.36 s
        assert file.read(4800) == DATA[:4800]
        assert file.read() == DATA[4800:]
        assert file.retried == 0 and opener.opens == 1


def test_a_long_skip_of_a_stream_that_moves_is_not_taken_for_a_stall():
    opener = SlowOpener(0.03, chunk=400, seekable=False)  # a stream: seeks are reads
    with RetryingFile(
        URL,
        lambda: ForwardOnlyFile(opener, lambda: len(DATA)),
        RetryPolicy(timeout=0.25, first_wait=NO_WAIT),  # 0.22 s of slack per piece
        watchdog=True,
    ) as file:
        file.seek(4500)  # reached by reading 12 pieces of 30 ms (0.36 s) in one call
        assert file.read(100) == DATA[4500:4600]
        assert file.retried == 0 and opener.opens == 1


def test_without_a_watchdog_reads_run_on_the_callers_thread():
    threads = []
    opener = FakeOpener()
    file = RetryingFile(URL, opener, RetryPolicy(timeout=0.1))  # local files: no watchdog
    real = opener.files[0].read

    def read(size: int | None = -1) -> bytes:
        threads.append(threading.current_thread())
        return real(size)

    opener.files[0].read = read  # type: ignore[method-assign]
    assert file.read(10) == DATA[:10]
    assert threads == [threading.current_thread()]


def test_watchdog_threads_end_with_their_files():
    def helpers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "datapipes-read"}

    before = helpers()  # other tests' stalled helpers may still be ending
    for _ in range(20):
        with _watched(FakeOpener(), timeout=5) as file:
            assert file.read(10) == DATA[:10]
            assert helpers() - before  # its reads run on a helper (the last one's may be ending)
    _wait_for(lambda: not helpers() - before)
    with pytest.raises(FileNotFoundError):  # a failed open ends its thread too
        _watched(FakeOpener(faults=[Fault(0, FileNotFoundError("x"), on="open")]), timeout=5)
    _wait_for(lambda: not helpers() - before)


def _wait_for(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
