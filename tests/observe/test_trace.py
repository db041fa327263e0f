"""Loader.trace: one Chrome trace of the main process and its workers; torch.profiler spans."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import datapipes as dp
from datapipes.loader.epoch_stats import LOOP_WAIT
from datapipes.observe.trace import read_span_folder
from nodes.observe import trace as node_trace
from nodes.observe.stats import StatsNode
from nodes.observe.trace import SPANS_ALL_FIRST, SpanRecorder

WORKER_STEPS = ["range(600)", "map(double)", "shuffle(buffer_size=50)", "batch(8)"]


def double(x: int) -> int:
    return 2 * x


def recipe() -> dp.DataPipe[Any]:
    return dp.range(600).map(double).shuffle(50).batch(8)


def spans(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [event for event in document["traceEvents"] if event["ph"] == "X"]


def process_names(document: dict[str, Any]) -> dict[int, str]:
    return {
        event["pid"]: event["args"]["name"]
        for event in document["traceEvents"]
        if event["ph"] == "M" and event["name"] == "process_name"
    }


def assert_well_nested(events: list[dict[str, Any]]) -> int:
    """Spans of one thread nest or follow each other, never overlap; returns how many
    were nested in another."""
    by_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        assert event["dur"] >= 0, event
        by_thread[event["pid"], event["tid"]].append(event)
    nested = 0
    for thread_spans in by_thread.values():
        stack: list[float] = []  # ends of the open spans
        for event in sorted(thread_spans, key=lambda e: (e["ts"], -e["dur"])):
            start, end = event["ts"], event["ts"] + event["dur"]
            while stack and stack[-1] <= start + 1e-3:
                stack.pop()
            if stack:
                assert end <= stack[-1] + 1e-3, f"{event} overlaps a span ending at {stack[-1]}"
                nested += 1
            stack.append(end)
    return nested


def load(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as file:
        return json.load(file)


# ----- a real 2-worker run ---------------------------------------------------------------
@pytest.mark.slow
def test_a_two_worker_trace_holds_every_step_of_both_workers_and_the_main_process(tmp_path):
    loader = dp.Loader(recipe(), seed=3, num_workers=2)
    path = tmp_path / "trace.json"
    before = time.perf_counter() * 1e6
    with loader.trace(path) as trace:
        batches = list(loader)
    after = time.perf_counter() * 1e6
    assert sorted(int(x) for b in batches for x in b) == [2 * i for i in range(600)]
    document = load(path)  # valid JSON, trace-event format
    assert isinstance(document["traceEvents"], list)
    names = process_names(document)
    assert sorted(names.values()) == [
        "datapipes DataLoader worker 0",
        "datapipes DataLoader worker 1",
        "datapipes main",
    ]
    assert trace.processes == ["main", "DataLoader worker 0", "DataLoader worker 1"]
    main = next(pid for pid, name in names.items() if name == "datapipes main")
    assert main == os.getpid()
    events = spans(document)
    assert trace.spans == len(events)
    for event in events:
        assert {"name", "ph", "pid", "tid", "ts", "dur", "cat"} <= set(event)
    steps_by_process = defaultdict(set)
    for event in events:
        steps_by_process[names[event["pid"]]].add(event["name"])
    for worker in ("datapipes DataLoader worker 0", "datapipes DataLoader worker 1"):
        assert steps_by_process[worker] == {f"datapipes: {s}" for s in WORKER_STEPS}
    assert steps_by_process["datapipes main"] == {
        "datapipes: DataLoader workers (2 processes)",
        LOOP_WAIT,
    }
    # The loop's waits: every output of the Loader is timed; the first 32 are kept, then
    # the long ones and one every 5 ms.
    waits = [e for e in events if e["name"] == LOOP_WAIT]
    assert SPANS_ALL_FIRST <= len(waits) <= len(batches)
    assert sum(e["dur"] for e in waits) > 0
    # One clock: the workers' spans lie within the main process's trace, and end before
    # the main process received the last batch.
    main_spans = [e for e in events if e["pid"] == main]
    last_main_end = max(e["ts"] + e["dur"] for e in main_spans)
    for event in events:
        assert before <= event["ts"] and event["ts"] + event["dur"] <= after, event
        if event["pid"] != main:
            assert event["ts"] + event["dur"] <= last_main_end + 1e-3, event
    assert document["datapipes"]["started_us"] >= before
    # Nested spans are well formed, and nesting is there (batch holds its map's spans).
    assert assert_well_nested(events) > 0
    assert not list(tmp_path.glob(".trace.json.*")), "the spans' folder is removed"
    # Its picture: a row for each process, the steps in its legend.
    pytest.importorskip("matplotlib")
    figure = trace.figure(tmp_path / "trace.png")
    assert (tmp_path / "trace.png").stat().st_size > 10_000
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.get_yticklabels()] == [
        "main",
        "DataLoader worker 0",
        "DataLoader worker 1",
    ]
    assert len(axes.collections) == len(events)  # one bar per span
    legend = {t.get_text() for t in axes.get_legend().get_texts()}
    assert legend == {e["name"] for e in events}


@pytest.mark.slow
def test_a_trace_changes_no_item_and_no_state(tmp_path):
    plain = dp.Loader(recipe(), seed=5, num_workers=2)
    expected = [b.tolist() for b in plain]
    traced = dp.Loader(recipe(), seed=5, num_workers=2)
    with traced.trace(tmp_path / "a.json"):
        it = iter(traced)
        head = [next(it).tolist() for _ in range(10)]
    state = traced.state_dict()
    resumed = dp.Loader(recipe(), seed=5, num_workers=2)
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == expected


# ----- in one process ----------------------------------------------------------------------
def test_spans_nest_and_name_every_step_at_0_workers(tmp_path):
    loader = dp.Loader(recipe(), seed=1)
    with loader.trace(tmp_path / "t.json"):
        list(loader)
    events = spans(load(tmp_path / "t.json"))
    assert {e["name"] for e in events} == {f"datapipes: {s}" for s in WORKER_STEPS} | {LOOP_WAIT}
    assert {e["pid"] for e in events} == {os.getpid()}
    assert assert_well_nested(events) > 0
    # A batch of 8 asks its shuffle 8 times: every span of a batch holds shuffle spans
    # (all of the first 256 items of a pass are timed).
    batches = [e for e in events if e["name"] == "datapipes: batch(8)"]
    shuffles = [e for e in events if e["name"] == "datapipes: shuffle(buffer_size=50)"]
    first = batches[0]
    inside = [s for s in shuffles if first["ts"] <= s["ts"] <= first["ts"] + first["dur"]]
    assert len(inside) >= 8


def test_a_trace_over_part_of_an_epoch_keeps_every_item_and_its_graph_loses_the_spans_after(
    tmp_path,
):
    expected = [b.tolist() for b in dp.Loader(recipe(), seed=2)]
    loader = dp.Loader(recipe(), seed=2)
    got = []
    it = iter(loader)
    got += [next(it).tolist() for _ in range(5)]
    # A loop reading an epoch built without spans: refused, never silently ended.
    with pytest.raises(RuntimeError, match="enter loader.trace\\(\\) before the loop"):
        loader.trace(tmp_path / "t.json").__enter__()
    got += [next(it).tolist() for _ in range(5)]
    del it  # abandoned: the graph is closed at the trace, its position kept
    with loader.trace(tmp_path / "t.json"):
        it = iter(loader)
        got += [next(it).tolist() for _ in range(20)]
        assert any(isinstance(n, StatsNode) for n in _graph(loader))
    got += [next(it).tolist() for _ in range(5)]  # the loop goes on past the block
    del it
    rest = iter(loader)  # built again, without spans, where it stopped
    assert not any(isinstance(n, StatsNode) for n in _graph(loader))
    got += [b.tolist() for b in rest]
    assert got == expected
    assert len(spans(load(tmp_path / "t.json"))) > 20


def _graph(loader: dp.Loader) -> list[Any]:
    from nodes.base import walk_graph

    return list(walk_graph(loader._graph.root))


def test_a_prefetch_thread_is_a_thread_of_its_own(tmp_path):
    loader = dp.Loader(dp.range(300).map(double).prefetch(4).batch(10))
    with loader.trace(tmp_path / "t.json"):
        list(loader)
    document = load(tmp_path / "t.json")
    events = spans(document)
    threads = {e["name"]: e["tid"] for e in events}
    assert threads["datapipes: map(double)"] != threads["datapipes: batch(10)"]
    assert threads["datapipes: batch(10)"] == threading.get_native_id()
    named = {
        e["tid"]: e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"
    }
    assert named[threading.get_native_id()] == "MainThread"
    assert threads["datapipes: map(double)"] in named
    assert_well_nested(events)


def test_stats_and_a_trace_together_report_the_same_table(tmp_path):
    loader = dp.Loader(recipe(), stats=True)
    with loader.trace(tmp_path / "t.json"):
        list(loader)
    table = loader.stats()
    assert table.delivered == 75 and {s.step for s in table.steps} >= {"map(double)"}


def test_torch_profiler_shows_each_step_while_stats_are_on(tmp_path):
    loader = dp.Loader(recipe(), stats=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _batch in loader:
            torch.ones(4).sum()
    names = {event.name for event in prof.events()}
    assert {f"datapipes: {s}" for s in WORKER_STEPS} <= names
    assert LOOP_WAIT in names
    # no profiler running: the same loop records nothing and keeps working
    assert len([b for b in loader]) == 75


def test_merge_traces_puts_the_pipeline_on_the_profilers_clock(tmp_path):
    loader = dp.Loader(recipe())
    with profile(activities=[ProfilerActivity.CPU]) as prof, loader.trace(tmp_path / "p.json"):
        for _batch in loader:
            (torch.ones(30, 30) @ torch.ones(30, 30)).sum()
    prof.export_chrome_trace(str(tmp_path / "model.json"))
    out = dp.merge_traces(tmp_path / "model.json", tmp_path / "p.json", tmp_path / "both.json")
    merged = spans(load(out))
    ops = [e for e in merged if e["name"].startswith("aten::matmul")]
    ours = [e for e in merged if e.get("cat") == "datapipes"]
    assert ops and len(ours) == len(spans(load(tmp_path / "p.json")))
    first, last = min(e["ts"] for e in ops), max(e["ts"] + e["dur"] for e in ops)
    waits = [e for e in ours if e["name"] == LOOP_WAIT]
    # each wait for a batch lies between the matmuls (1 ms of slack for the two clocks' reads)
    assert all(first - 1e3 <= e["ts"] <= last + 1e3 for e in waits[1:])


def test_merge_traces_refuses_what_is_not_a_trace(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "plain.json").write_text('{"traceEvents": []}')
    with pytest.raises(ValueError, match="is not JSON"):
        dp.merge_traces(tmp_path / "bad.json", tmp_path / "plain.json")
    with pytest.raises(ValueError, match="is not a trace"):
        dp.merge_traces(tmp_path / "list.json", tmp_path / "plain.json")
    with pytest.raises(ValueError, match="pass the Loader's trace second"):
        dp.merge_traces(tmp_path / "plain.json", tmp_path / "plain.json")


def test_one_trace_at_a_time_and_a_missing_folder_is_named(tmp_path):
    loader = dp.Loader(recipe())
    with loader.trace(tmp_path / "a.json") as trace:
        with pytest.raises(RuntimeError, match="running already"):
            loader.trace(tmp_path / "b.json").__enter__()
        with pytest.raises(RuntimeError, match="after its `with` block"):
            trace.figure(tmp_path / "a.png")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        loader.trace(tmp_path / "no" / "such" / "t.json").__enter__()
    assert len([b for b in loader]) == 75  # still usable


# ----- the recorder and the files it writes -----------------------------------------------
def test_a_recorder_stops_when_its_folder_is_gone(tmp_path):
    folder = tmp_path / "spans"
    folder.mkdir()
    recorder = SpanRecorder(folder, "DataLoader worker 0")
    recorder.record("datapipes: a", 1.0, 2.0)
    recorder.flush()
    shutil.rmtree(folder)
    recorder.record("datapipes: a", 3.0, 4.0)
    recorder.flush()
    assert not recorder.active and not folder.exists()  # not made again


def test_damaged_span_files_lose_their_bad_lines_only(tmp_path):
    recorder = SpanRecorder(tmp_path, "main")
    recorder.record("datapipes: a", 1.0, 2.0)
    recorder.record("datapipes: b", 1.25, 1.5)
    recorder.flush()
    with open(recorder.path, "a", encoding="utf-8") as file:
        file.write('S\t"datapipes: c"\t5.0\t4.0\t1\n')  # ends before it starts
        file.write('S\t"datapipes: d"\tx\t6.0\t1\n')  # not a time
        file.write('S\t"datapipes: e"\t5.0\t6.0\tt\n')  # not a thread
        file.write('S\t"datapipes: n"\tnan\tnan\t1\n')  # not a number
        file.write("S\tdatapipes: g\t5.0\t6.0\t1\n")  # a name not quoted
        file.write("S\t3\t5.0\t6.0\t1\n")  # a name that is no string
        file.write('S\t"datapipes: h"\t5.0\t6.0\n')  # a field missing
        file.write('["datapipes: i", 5.0, 6.0, 1]\n')  # JSON, not a span line
        file.write('{"thread": "x", "name": 3}\n')
        file.write('"just a string"\n')
        file.write('S\t"datapipes: f"\t7.0\t8.')  # cut short by a writer
    (tmp_path / "spans-1-0.jsonl").write_text("no header, no spans\n")
    (tmp_path / "spans-2-0.jsonl").write_bytes(b"\xff\xfe garbage")
    events, processes, dropped = read_span_folder(tmp_path)
    assert processes == ["main"] and dropped == 0
    assert sorted(e["name"] for e in events if e["ph"] == "X") == ["datapipes: a", "datapipes: b"]
    assert_well_nested([e for e in events if e["ph"] == "X"])


def test_a_stretch_of_a_trace_draws_the_spans_in_it(tmp_path):
    pytest.importorskip("matplotlib")
    loader = dp.Loader(dp.range(64).map(double).batch(4))
    with loader.trace(tmp_path / "t.json") as trace:
        list(loader)
    events = spans(load(tmp_path / "t.json"))
    with pytest.raises(ValueError, match="no span from 10.0 s for 1.0 s: the trace's spans cover"):
        trace.figure(start=10.0, seconds=1.0)
    first = min(e["ts"] for e in events)
    early = [e for e in events if e["ts"] <= first + 100]  # its first 100 us
    figure = trace.figure(seconds=100e-6)
    assert len(figure.axes[0].collections) == len(early) > 0
    figure = trace.figure()
    assert len(figure.axes[0].collections) == len(events)


def test_past_the_limit_spans_are_counted_and_the_trace_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(node_trace, "MAX_SPANS", 50)
    loader = dp.Loader(recipe())
    with pytest.warns(UserWarning, match="left out"):
        with loader.trace(tmp_path / "t.json") as trace:
            list(loader)
    document = load(tmp_path / "t.json")
    assert trace.spans == 50 == len(spans(document))
    assert document["datapipes"]["dropped_spans"] > 0
