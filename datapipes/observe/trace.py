"""Traces of a pipeline: one Chrome / Perfetto trace of the main process and its workers.

``Loader.trace(path)`` runs a :class:`PipelineTrace`: while it is entered,
every step notes a sample of its ``next()`` calls as spans (all of a
pass's first 32, then every one of at least 100 us and one every 5 ms of
the others: see :mod:`nodes.observe.trace`), in the main process and in each
DataLoader worker, on one clock. At its
exit the spans become one trace-event JSON file that ``chrome://tracing``,
https://ui.perfetto.dev and ``torch.profiler``'s viewers open: a process
per worker, a thread per thread, a span per step nested in the span of the
step that asked for the item, and the training loop's waits on the Loader.

:func:`merge_traces` puts such a trace into a ``torch.profiler`` trace
(which never sees DataLoader workers) on the profiler's clock.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from nodes.observe.trace import SpanRecorder

#: Where a trace notes what it is, for :func:`merge_traces` and for readers.
TRACE_KEY = "datapipes"


class PipelineTrace:
    """A trace of a Loader's steps, written to ``path`` when the ``with`` block ends.

    Made by :meth:`datapipes.Loader.trace`; see its doc. After the block,
    ``spans`` counts the spans written and ``processes`` names the processes
    they came from.
    """

    def __init__(self, loader: Any, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.spans = 0
        self.processes: list[str] = []
        self._loader = loader
        self._folder: str | None = None
        self._recorder: SpanRecorder | None = None

    def __enter__(self) -> PipelineTrace:
        if self._folder is not None:
            raise RuntimeError("this trace is running already; a Loader runs one at a time")
        parent = self.path.parent
        if not parent.is_dir():
            raise FileNotFoundError(
                f"the trace goes to {str(self.path)!r}, but its folder {str(parent)!r} does "
                "not exist: create it, or pass a path in an existing folder"
            )
        self._folder = tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=parent)
        ranked = self._loader.world_size > 1
        process = f"rank {self._loader.rank}" if ranked else "main"
        self._recorder = SpanRecorder(self._folder, process)
        self._loader._start_trace(self._recorder, self._folder)
        self._started = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        folder, recorder = self._folder, self._recorder
        assert folder is not None and recorder is not None
        self._loader._stop_trace()
        recorder.stop()
        try:
            events, self.processes, dropped = read_span_folder(folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # also stops the workers' recorders
            self._folder = self._recorder = None
        self.spans = sum(1 for event in events if event["ph"] == "X")
        if dropped:
            warnings.warn(
                f"the trace kept {self.spans} spans and left out {dropped} past "
                f"{type(recorder).__name__}'s limit per process; trace a shorter stretch "
                "for every span",
                stacklevel=2,
            )
        document = {
            "traceEvents": events,
            "displayTimeUnit": "ms",
            TRACE_KEY: {
                "clock": "time.perf_counter (CLOCK_MONOTONIC), microseconds",
                # add to a ts for Unix time in microseconds (what torch.profiler's traces use)
                "unix_minus_clock_us": (time.time() - time.perf_counter()) * 1e6,
                "started_us": self._started * 1e6,
                "sampled": "per step: all of a pass's first 32 next() calls, then every "
                "one of at least 100 us and one every 5 ms of the others",
                "dropped_spans": dropped,
            },
        }
        write_json(self.path, document)

    def figure(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        start: float = 0.0,
        seconds: float | None = None,
    ) -> Any:
        """Draw the trace (after the block): a row per thread of every process, each step's
        spans in its colour, nested spans stacked under the span that asked for them;
        from ``start`` seconds after the first span, for ``seconds`` (default: all).
        Written to ``path`` (PNG, SVG, PDF by its suffix) when given; returns the
        matplotlib figure. Needs matplotlib (the ``[plots]`` extra)."""
        if self._folder is not None or not self.path.exists():
            raise RuntimeError("the trace is drawn after its `with` block, which writes it")
        from datapipes.observe.trace_figure import draw_trace

        return draw_trace(
            self.path, None if path is None else str(path), start=start, seconds=seconds
        )


def read_span_folder(folder: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], list[str], int]:
    """The trace events of every recorder's file in ``folder``, the processes' names, and
    how many spans the recorders left out. A line cut short (a worker writing as the trace
    ended) or not a span is skipped, never an error: a trace is a picture, not a record."""
    events: list[dict[str, Any]] = []
    processes: list[str] = []
    dropped = 0
    recorded = []
    for path in Path(folder).glob("spans-*.jsonl"):
        process, pid, threads, spans = None, None, {}, []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("S\t"):
                span = _span(line)
                if span is not None:
                    spans.append(span)
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict):
                continue
            if "process" in entry:
                process, pid = str(entry["process"]), entry.get("pid")
            elif isinstance(entry.get("thread"), int):
                threads[entry["thread"]] = str(entry.get("name"))
            elif isinstance(entry.get("dropped"), int):
                dropped = max(dropped, entry["dropped"])
        if process is not None and isinstance(pid, int):
            recorded.append((process, pid, threads, spans))
    # The main process (or rank) first, then its workers in order.
    recorded.sort(key=lambda entry: _natural(entry[0]))
    for index, (process, pid, threads, spans) in enumerate(recorded):
        processes.append(process)
        events.append(_meta("process_name", pid, None, {"name": f"datapipes {process}"}))
        events.append(_meta("process_sort_index", pid, None, {"sort_index": index}))
        for tid, name in threads.items():
            events.append(_meta("thread_name", pid, tid, {"name": name}))
        for name, ts, dur, tid in spans:
            events.append(
                {
                    "ph": "X",
                    "cat": "datapipes",
                    "name": name,
                    "pid": pid,
                    "tid": tid,
                    "ts": ts,
                    "dur": dur,
                }
            )
    return events, processes, dropped


_names: dict[str, str] = {}  # a span line's quoted name, read once


def _span(line: str) -> tuple[str, float, float, int] | None:
    """A span line's name, start and duration in microseconds, and thread; ``None`` for a
    damaged line. Rounded to the nanosecond from the same floats: a span nested in another
    stays nested."""
    parts = line.split("\t")
    if len(parts) != 5:
        return None
    try:
        name = _names.get(parts[1])
        if name is None:
            name = json.loads(parts[1])
            if not isinstance(name, str):
                return None
            _names[parts[1]] = name
        start, end, tid = float(parts[2]), float(parts[3]), int(parts[4])
    except ValueError:
        return None
    if not end >= start:  # also NaN
        return None
    ts = round(start * 1e6, 3)
    return name, ts, round(end * 1e6, 3) - ts, tid


def _natural(process: str) -> tuple[bool, list[Any]]:
    """Sorts the main process first, then ``worker 2`` before ``worker 10``."""
    parts = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", process)]
    return "worker" in process, parts


def _meta(kind: str, pid: int, tid: int | None, args: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "M", "name": kind, "pid": pid, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` (a trace: ``traceEvents`` first) to ``path`` whole or not at all.

    A span is written from a format string (its name quoted once): about 4x
    faster than ``json.dump`` of its dict, which only the other events take.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    quoted: dict[str, str] = {}
    with open(temporary, "w", encoding="utf-8") as file:
        lines = []
        for event in document.get("traceEvents", []):
            if _plain_span(event):
                name = event["name"]
                if name not in quoted:
                    quoted[name] = json.dumps(name)
                lines.append(
                    f'{{"ph":"X","cat":"datapipes","name":{quoted[name]},"pid":{event["pid"]},'
                    f'"tid":{event["tid"]},"ts":{event["ts"]!r},"dur":{event["dur"]!r}}}'
                )
            else:
                lines.append(json.dumps(event))
        rest = {k: v for k, v in document.items() if k != "traceEvents"}
        file.write('{"traceEvents":[\n' + ",\n".join(lines) + "\n]")
        for key, value in rest.items():
            file.write(f",{json.dumps(key)}:{json.dumps(value)}")
        file.write("}\n")
    os.replace(temporary, path)


def _plain_span(event: Any) -> bool:
    """Whether ``event`` is one of this module's spans, with plain values only."""
    return (
        type(event) is dict
        and len(event) == 7
        and event.get("ph") == "X"
        and event.get("cat") == "datapipes"
        and type(event.get("name")) is str
        and type(event.get("pid")) is int
        and type(event.get("tid")) is int
        and type(event.get("ts")) is float
        and type(event.get("dur")) is float
    )


def merge_traces(
    profiler_trace: str | os.PathLike[str],
    pipeline_trace: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
) -> Path:
    """Put a Loader's trace into a ``torch.profiler`` trace, on the profiler's clock.

    ``torch.profiler`` records the main process only (DataLoader workers are
    other processes); the Loader's trace holds every worker. The result
    (written to ``out``, default: over ``profiler_trace``) shows the model's
    operators and the pipeline's steps, workers included, side by side.

    >>> # with torch.profiler.profile() as prof, loader.trace("pipeline.json"):
    >>> #     train(...)
    >>> # prof.export_chrome_trace("model.json")
    >>> # dp.merge_traces("model.json", "pipeline.json", "both.json")
    """
    profiler = _load_trace(profiler_trace, "the torch.profiler trace")
    pipeline = _load_trace(pipeline_trace, "the Loader's trace")
    about = pipeline.get(TRACE_KEY)
    if not isinstance(about, dict) or not isinstance(about.get("unix_minus_clock_us"), float):
        raise ValueError(
            f"{str(pipeline_trace)!r} is not a trace written by Loader.trace() (no "
            f"{TRACE_KEY!r} entry with its clock): pass the Loader's trace second"
        )
    base_ns = profiler.get("baseTimeNanoseconds", 0)
    if not isinstance(base_ns, int):
        raise ValueError(f"{str(profiler_trace)!r}: baseTimeNanoseconds is not an integer")
    shift = about["unix_minus_clock_us"] - base_ns / 1000
    events = profiler.setdefault("traceEvents", [])
    if not isinstance(events, list):
        raise ValueError(f"{str(profiler_trace)!r}: traceEvents is not a list")
    # The profiler's main process has the same pid as the Loader's main-process spans,
    # which then show in the same process: the pipeline beside the model's operators.
    for event in pipeline.get("traceEvents", []):
        if isinstance(event, dict) and isinstance(event.get("ts"), (int, float)):
            event = {**event, "ts": event["ts"] + shift}
        events.append(event)
    target = Path(profiler_trace if out is None else out)
    write_json(target, profiler)
    return target


def _load_trace(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except ValueError as error:
        raise ValueError(f"{what} {str(path)!r} is not JSON: {error}") from error
    if not isinstance(document, dict):
        raise ValueError(f"{what} {str(path)!r} is not a trace (a JSON object with traceEvents)")
    return document
