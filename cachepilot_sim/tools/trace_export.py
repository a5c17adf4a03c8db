"""A run's event trace as a Chrome trace-event JSON file, for Perfetto (ui.perfetto.dev) or
chrome://tracing: `cachepilot-sim trace-export <run folder or trace folder> --out run.json`.

One process per cell (policy, seed), one thread (track) per component: client, scheduler,
batcher, kv, pcie h2d, pcie d2h. Timestamps are the simulated microseconds of the trace.
* Requests: one async span per request (`request`, arrive to finish or reject), with nested
  `queued` (arrive to first admit), `prefill` (first admit to first token) and `decode` (first
  token to finish) spans; rejects, preemptions and evictions are instants.
* PCIe copies: duration slices on their lane, ending at `reload_done` / `offload_done`, lasting
  the copy time the row holds (time queued for the lane is not part of the slice).
* Engine iterations: counters (sequences in the batch, KV bytes held, iteration µs) at each sampled
  `iteration` row. Not slices: the row is written at the start of a mixed iteration but at the end
  of a pure-decode run, and the trace does not say which, so a slice would be placed wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from cachepilot_sim.trace.derive import TraceError, load_trace
from cachepilot_sim.trace.recorder import META_FILE
from cachepilot_sim.trace.schema import REJECT_REASONS

PROG = "cachepilot-sim trace-export"
# Track (thread id) of each component; PCIe copies get one lane each way.
TRACKS = {"client": 1, "scheduler": 2, "batcher": 3, "kv": 4, "pcie h2d": 5, "pcie d2h": 6}
INSTANTS = {  # kind -> track of an instant event
    "session_start": "client",
    "reject": "batcher",
    "preempt": "kv",
    "evict_offload": "kv",
    "evict_drop": "kv",
    "recompute": "kv",
    "hit": "kv",
}
ROW_COLUMNS = ("t_us", "kind", "session", "request", "blocks", "bytes", "tier", "value")


def trace_folders(path: Path) -> list[Path]:
    """`path` itself when it is a trace folder, else the run folder's `trace/*/` folders."""
    if (path / META_FILE).is_file():
        return [path]
    found = sorted(p.parent for p in path.glob(f"trace/*/{META_FILE}"))
    if not found:
        raise TraceError(
            f"{path}: neither a trace folder nor a run folder with trace/*/{META_FILE}"
        )
    return found


def _meta(pid: int, name: str) -> Iterator[dict[str, Any]]:
    """Names of the cell's process and of its tracks, in track order."""
    yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": name}}
    for track, tid in TRACKS.items():
        for key, value in (
            ("thread_name", {"name": track}),
            ("thread_sort_index", {"sort_index": tid}),
        ):
            yield {"ph": "M", "name": key, "pid": pid, "tid": tid, "ts": 0, "args": value}


def _on(track: str, ph: str, name: str, pid: int, t: int, args: dict, **extra: Any) -> dict:
    """An event on a component's track."""
    return {"ph": ph, "name": name, "pid": pid, "tid": TRACKS[track], "ts": t, "args": args} | extra


def cell_events(pid: int, trace: pl.DataFrame, meta: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The trace events of one cell (process `pid`), in trace order."""
    yield from _meta(pid, f"{meta.get('policy', '?')} seed {meta.get('seed', '?')}")
    admitted: set[int] = set()
    first_token: set[int] = set()
    for t, kind, session, request, blocks, num_bytes, tier, value in trace.select(
        ROW_COLUMNS
    ).iter_rows():
        about = {"session": session, "request": request, "blocks": blocks, "bytes": num_bytes}
        if kind == "arrive":
            yield _async("b", "request", request, t, pid, {"session": session, "tokens": value})
            yield _async("b", "queued", request, t, pid)
        elif kind == "admit" and request not in admitted:
            admitted.add(request)
            yield _async("e", "queued", request, t, pid)
            yield _async("b", "prefill", request, t, pid, {"prefill_tokens": value})
        elif kind == "first_token" and request not in first_token:
            first_token.add(request)
            yield _async("e", "prefill", request, t, pid)
            yield _async("b", "decode", request, t, pid)
        elif kind in ("finish", "reject"):
            open_span = (
                "decode"
                if request in first_token
                else "prefill"
                if request in admitted
                else "queued"
            )
            yield _async("e", open_span, request, t, pid)
            yield _async("e", "request", request, t, pid, {"outcome": kind, "value": value})
        elif kind == "reload_done":
            yield _on("pcie h2d", "X", "reload", pid, t - value, about, dur=value)
        elif kind == "offload_done":
            yield _on("pcie d2h", "X", "offload", pid, t - value, about, dur=value)
        elif kind == "iteration":
            args = {"sequences": blocks, "kv_bytes": num_bytes, "iteration_us": value}
            yield _on("batcher", "C", "engine", pid, t, args)
        if kind in INSTANTS:
            if kind == "reject":
                about["reason"] = (
                    REJECT_REASONS[value] if 0 <= value < len(REJECT_REASONS) else value
                )
            elif kind == "evict_drop":
                about["tier"] = tier  # cpu: the CPU store dropped it
            yield _on(INSTANTS[kind], "i", kind, pid, t, about, s="t")


def _async(
    ph: str, name: str, request: int, t: int, pid: int, args: dict | None = None
) -> dict[str, Any]:
    """A nestable async event of one request (spans of one id and category nest by time)."""
    event = {"ph": ph, "cat": "request", "name": name, "id": request, "pid": pid, "tid": 2, "ts": t}
    if args:
        event["args"] = args
    return event


def chrome_trace(folders: list[Path]) -> dict[str, Any]:
    """Every folder's trace (validated by `load_trace`) as one Chrome trace-event document."""
    events: list[dict[str, Any]] = []
    for pid, folder in enumerate(folders, start=1):
        lazy, meta = load_trace(folder)
        events.extend(cell_events(pid, lazy.sort("t_us", "seq").collect(), meta))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path, help="a run folder (all its cells) or one trace folder")
    ap.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    args = ap.parse_args(argv)
    try:
        doc = chrome_trace(trace_folders(args.path))
    except TraceError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    tmp = args.out.with_name(args.out.name + ".tmp")
    try:
        with tmp.open("w") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, args.out)
    except OSError as err:  # an unwritable --out: named, nothing half-written left behind
        print(f"{PROG}: {args.out}: cannot write ({err.strerror})", file=sys.stderr)
        return 2
    finally:
        tmp.unlink(missing_ok=True)
    print(f"{args.out}: {len(doc['traceEvents']):,} events; open in ui.perfetto.dev")
    return 0


if __name__ == "__main__":
    sys.exit(main())
