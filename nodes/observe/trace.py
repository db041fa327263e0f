"""Spans of a pipeline's steps, for a trace (``Loader.trace``) and the torch profiler.

A :class:`SpanRecorder` keeps the spans of one process: each is one timed
``next()`` of a step (see :class:`nodes.observe.stats.StatsNode`, which times a
sample of the items), with its start and end on ``time.perf_counter``,
which is ``CLOCK_MONOTONIC`` on Linux and so one clock for every process
of the machine: the spans of DataLoader workers line up with the main
process's without any exchange. The recorder appends them to its own file
in the trace's folder, as JSON lines, every :data:`FLUSH_SPANS` spans or
:data:`FLUSH_SECONDS` seconds, when a worker's pass ends and when the
process exits. The owner of the trace merges the files at its end
(:mod:`datapipes.observe.trace`) and deletes the folder, which tells the workers'
recorders to stop: their next flush finds no folder.
"""

from __future__ import annotations

import json
import multiprocessing.util
import os
import threading
from pathlib import Path
from time import perf_counter

from nodes.adapters.torch import profiler_span_enter, profiler_span_exit

#: A recorder writes its spans out when it holds this many, or when this many seconds
#: passed since it last wrote at its next span.
FLUSH_SPANS = 4096
FLUSH_SECONDS = 0.2
#: At most this many spans per process: a trace over a long run stays a file a viewer
#: opens. Past it, spans are counted, not kept (the trace says how many).
MAX_SPANS = 200_000
#: The prefix of a step's span: ``datapipes: map(decode)``.
SPAN_PREFIX = "datapipes: "
#: Which timed ``next()`` calls a step keeps as spans: all of a pass's first SPANS_ALL_FIRST,
#: then every one of at least LONG_SPAN seconds (a span costs about 5 us to note, merge and
#: write: at most 5% of such a span), and one every SPAN_GAP seconds of the others.
SPANS_ALL_FIRST = 32
LONG_SPAN = 100e-6
SPAN_GAP = 0.005


class SpanRecorder:
    """The spans of one process, written to ``folder/spans-<pid>-<n>.jsonl``.

    Its lines: a span is ``S<tab>"name"<tab>start<tab>end<tab>thread``; the
    process, its threads' names and the spans left out are JSON objects.

    ``process`` names the process in the trace (``"main"``, ``"worker 1"``).
    ``record`` is called from any thread of the process; each span keeps
    its thread. A recorder whose folder is gone (the trace ended) stops.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> recorder = SpanRecorder(folder, "main")
    >>> recorder.record("datapipes: map(f)", 1.0, 1.5)
    >>> recorder.flush()
    >>> [name for name in os.listdir(folder)] == [recorder.path.name]
    True
    """

    _numbers = iter(range(1 << 62))  # several recorders in one process get their own files

    def __init__(self, folder: str | os.PathLike[str], process: str) -> None:
        self.folder = Path(folder)
        self.process = process
        self.path = self.folder / f"spans-{os.getpid()}-{next(self._numbers)}.jsonl"
        self.active = True
        self.dropped = 0  # spans past MAX_SPANS
        self._kept = 0
        self._spans: list[tuple[str, float, float, int]] = []  # (step, start, end, thread)
        self._threads: dict[int, str] = {}
        self._lock = threading.Lock()
        self._flushed_at = perf_counter()
        self._header_written = False
        self._quoted: dict[str, str] = {}

    def record(self, name: str, start: float, end: float) -> None:
        """Note one span named ``name`` from ``start`` to ``end`` (``perf_counter``)."""
        if not self.active:
            return
        if self._kept >= MAX_SPANS:
            self.dropped += 1
            return
        self._kept += 1
        ident = threading.get_native_id()  # the OS's thread id, as torch.profiler's traces
        spans = self._spans
        spans.append((name, start, end, ident))
        if ident not in self._threads:
            self._threads[ident] = threading.current_thread().name
        if len(spans) >= FLUSH_SPANS or end - self._flushed_at > FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """Append the spans held to this process's file (nothing if the trace ended)."""
        with self._lock:
            spans, self._spans = self._spans, []
            self._flushed_at = perf_counter()
            if not self.active or not (spans or self._threads or self.dropped):
                return
            lines = []
            if not self._header_written:
                header = {"process": self.process, "pid": os.getpid()}
                lines.append(json.dumps(header))
            quoted = self._quoted
            for name, start, end, tid in spans:  # tab-separated: 3x cheaper than JSON here
                if name not in quoted:
                    quoted[name] = json.dumps(name)  # no tab or newline left in it
                lines.append(f"S\t{quoted[name]}\t{start!r}\t{end!r}\t{tid}")
            threads, self._threads = self._threads, {}
            lines.extend(json.dumps({"thread": ident, "name": n}) for ident, n in threads.items())
            if self.dropped:
                lines.append(json.dumps({"dropped": self.dropped}))
            if not lines:
                return
            try:
                # One write of whole lines: a reader at the trace's end sees whole lines,
                # or a last one cut short, which it ignores.
                with open(self.path, "a", encoding="utf-8") as file:
                    file.write("\n".join(lines) + "\n")
            except FileNotFoundError:  # the trace ended and its folder is gone: stop
                self.active = False
                return
            self._header_written = True

    def stop(self) -> None:
        """Write what is held, then record nothing more."""
        self.flush()
        self.active = False


_worker_recorders: dict[str, SpanRecorder] = {}


def worker_recorder(folder: str, process: str) -> SpanRecorder:
    """This process's recorder for the trace in ``folder`` (one per process and trace),
    written out when the process exits, as a DataLoader worker does at an epoch's end."""
    recorder = _worker_recorders.get(folder)
    if recorder is None or recorder.process != process:
        recorder = _worker_recorders[folder] = SpanRecorder(folder, process)
        # multiprocessing runs these as a worker process exits (atexit handlers do not run)
        multiprocessing.util.Finalize(recorder, recorder.flush, exitpriority=10)
    return recorder


class ProfilerSpan:
    """A ``torch.profiler`` span named ``name`` (what ``record_function`` records)."""

    __slots__ = ("handle",)

    def __init__(self, name: str) -> None:
        self.handle = profiler_span_enter(name)

    def end(self) -> None:
        profiler_span_exit(self.handle)
