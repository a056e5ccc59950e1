"""Command buffer timelines as Chrome/Perfetto trace JSON (open in ui.perfetto.dev or chrome://tracing).

Each queue is a track; ML dispatches and compute work are slices, barriers
instants, and every event signal is joined to the waits it releases by a
flow arrow. Each slice's `clock` says whether its times are GPU times or
host times (see pipeline/commands.py).

    sm.write_trace("timeline.json", [cb1, cb2])
"""
from __future__ import annotations

import json
import os
from typing import Iterable


def trace_events(command_buffers: Iterable) -> list[dict]:
    """The traceEvents of completed command buffers."""
    events: list[dict] = []
    tracks: dict[tuple[str, str], int] = {}
    signals: dict[tuple[str, int], int] = {}
    for cb in command_buffers:
        dev = cb.queue.device.name
        key = (dev, cb.queue.label)
        if key not in tracks:
            tracks[key] = len(tracks) + 1
            events.append({"ph": "M", "name": "process_name", "pid": dev, "args": {"name": f"StitchML {dev}"}})
            events.append({"ph": "M", "name": "thread_name", "pid": dev, "tid": tracks[key],
                           "args": {"name": cb.queue.label}})
        tid = tracks[key]
        for span in cb.timeline:
            base = {"name": span.name, "cat": span.kind, "pid": dev, "tid": tid, "ts": span.start_us,
                    "args": {"command_buffer": cb.label, "encoder": span.encoder, "clock": span.clock,
                             **(span.args or {})}}
            if span.kind in ("barrier", "signal"):
                events.append({**base, "ph": "i", "s": "t"})
            else:
                events.append({**base, "ph": "X", "dur": max(span.end_us - span.start_us, 0.0)})
            if span.kind == "signal":
                flow = signals.setdefault((span.args["event"], span.args["value"]), len(signals) + 1)
                events.append({"ph": "s", "id": flow, "name": "event", "cat": "event", "pid": dev, "tid": tid,
                               "ts": span.start_us})
    for cb in command_buffers:
        tid = tracks[(cb.queue.device.name, cb.queue.label)]
        for span in cb.timeline:
            if span.kind == "wait":
                hits = [f for (ev, v), f in signals.items() if ev == span.args["event"] and v >= span.args["value"]]
                if hits:
                    events.append({"ph": "f", "bp": "e", "id": min(hits), "name": "event", "cat": "event",
                                   "pid": cb.queue.device.name, "tid": tid, "ts": span.end_us})
    return events


def write_trace(path: str | os.PathLike, command_buffers: Iterable) -> None:
    """Write the Chrome/Perfetto trace of `command_buffers` (wait for them first)."""
    cbs = list(command_buffers)
    with open(path, "w") as f:
        json.dump({"traceEvents": trace_events(cbs), "displayTimeUnit": "ms"}, f, indent=1)
