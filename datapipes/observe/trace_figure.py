"""The picture of a trace (:meth:`datapipes.PipelineTrace.figure`): a row per thread.

A stretch of the trace, a row per thread of every process, each step's spans in its
own colour (matplotlib, the ``plots`` extra).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

from datapipes.observe.stats_figure import pyplot


def draw_trace(
    trace_path: str | os.PathLike[str],
    path: str | None = None,
    *,
    start: float = 0.0,
    seconds: float | None = None,
) -> Any:
    """Draw the spans of the trace at ``trace_path`` from ``start`` seconds after its first
    span, for ``seconds`` (default: to its end). Nested spans stack downwards within their
    thread's row, so a batch's span sits above the spans of the items it asked for."""
    plt = pyplot(path, "PipelineTrace.figure()")
    with open(trace_path, encoding="utf-8") as file:
        events = json.load(file)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    order = {
        e["pid"]: e["args"]["sort_index"] for e in events if e.get("name") == "process_sort_index"
    }
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"
    }
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise ValueError(f"the trace {str(trace_path)!r} holds no spans to draw")
    origin = min(e["ts"] for e in spans) + start * 1e6
    end = float("inf") if seconds is None else origin + seconds * 1e6
    shown = [e for e in spans if e["ts"] + e["dur"] >= origin and e["ts"] <= end]
    if not shown:
        length = (max(e["ts"] + e["dur"] for e in spans) - min(e["ts"] for e in spans)) / 1e6
        raise ValueError(
            f"no span from {start} s for {seconds} s: the trace's spans cover {length:.3f} s"
        )
    lanes: dict[tuple[int, int], list[tuple[dict[str, Any], int]]] = defaultdict(list)
    for thread, thread_spans in _by_thread(shown).items():
        lanes[thread] = _depths(thread_spans)
    rows = sorted(lanes, key=lambda t: (order.get(t[0], 0), t[0], t[1] != t[0], t[1]))
    steps = sorted({e["name"] for e in shown})
    colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(steps)}
    depth_of = {row: 1 + max(depth for _, depth in lanes[row]) for row in rows}
    height = sum(depth_of.values())
    legend_rows = (len(steps) + 1) // 2
    figure, axes = plt.subplots(figsize=(11, 1.6 + 0.32 * (height + legend_rows)))
    top, ticks, labels = 0.0, [], []
    for row in rows:
        for event, depth in lanes[row]:
            left = (max(event["ts"], origin) - origin) / 1e3
            right = (min(event["ts"] + event["dur"], end) - origin) / 1e3
            axes.broken_barh(
                [(left, max(right - left, 1e-3))],
                (-(top + depth) - 0.9, 0.8),
                facecolors=colours[event["name"]],
            )
        ticks.append(-(top + depth_of[row] / 2))
        pid, tid = row
        thread = threads.get(row, str(tid))
        process = names.get(pid, str(pid)).removeprefix("datapipes ")
        labels.append(process if thread == "MainThread" else f"{process}: {thread}")
        top += depth_of[row]
        axes.axhline(-top, color="0.85", linewidth=0.5)
    axes.set_yticks(ticks, labels)
    axes.set_ylim(-top, 0)
    axes.set_xlabel("milliseconds")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[name]) for name in steps]
    axes.legend(
        handles, steps, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize="small"
    )
    axes.set_title("where the time goes: every process's steps on one clock")
    figure.tight_layout()
    if path is not None:
        figure.savefig(path, dpi=110)
        plt.close(figure)
    return figure


def _by_thread(spans: list[dict[str, Any]]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    threads: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for event in spans:
        threads[event["pid"], event["tid"]].append(event)
    return threads


def _depths(spans: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """Each span with its nesting depth in its thread (0: asked for by no other span)."""
    out, stack = [], []  # stack: the ends of the open spans
    for event in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
        while stack and stack[-1] <= event["ts"] + 1e-3:
            stack.pop()
        out.append((event, len(stack)))
        stack.append(event["ts"] + event["dur"])
    return out
