"""Exports of a routing record: Chrome Trace Event JSON (ui.perfetto.dev, chrome://tracing) and CSV.

Trace layout (one process, "colibri <model file>"; thread 1 "prefill" holds the prompt's
positions, thread 2 "decode" the generated ones):
  * X "token P 'text'"  - one complete slice per position, dur = max(token_ns, sum of its layers);
      * X "layer L"     - nested, one per model layer, packed from the token's start in order,
                          dur = max(phase LAYER, sum of its phases);
          * X "attention", "router", "experts", "combine" (MoE layers) or "attention", "mlp"
            (dense layers: the rest of the layer) - nested, packed in that order. The router
            slice's args carry the routing decision: layer, position, token, experts, weights,
            logits of the chosen experts, margin (and in ULPs), hidden_norm, shared_gate; under
            expert caching cache_kept, cache_margin, fresh_experts and cache_hits; and the kinds
            of the interventions that acted on it (when any did).
  * i "routing change"  - thread instant at the router slice of a (position, layer) whose chosen
                          set differs from the previous position's.
  * C "throughput"      - counter {"tokens_per_s": 1e9 / token_ns} at each token's start.
  * M process_name / thread_name / *_sort_index metadata.
The engine records durations, not start times, so positions are laid back to back from ts 0 and
phases are packed inside their layer; the slices' lengths are the measured ones (a prompt run as
one prefill, or in the debugger's pieces, shares each call's times evenly among its positions,
as the engine's trace does), and time the phases do not cover (norms, residual adds, embedding,
LM head) is the unsliced tail of each layer or token. ts and dur are microseconds with nanosecond resolution (3 decimals); every X slice nests
inside its parent, as Perfetto requires for complete events on one thread.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from colibri.debugging.events import EventList
from colibri.debugging.run import PHASES
from colibri.files import atomic_write
from colibri.interventions import KINDS
from colibri.values import RunSettings

PID = 1
TID_PREFILL, TID_DECODE = 1, 2
_MOE_PHASES = PHASES[:4]


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def chrome_trace(events: EventList, settings: RunSettings | None = None,
                 n_prompt: int | None = None, other: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    """The Trace Event JSON document (a dict) for every position of `events.record`.
    `n_prompt` positions go to the prefill thread (default: settings' prompt length, else all)."""
    rec = events.record
    P = rec.n_positions
    if n_prompt is None:
        n_prompt = len(settings.prompt_tokens) if settings is not None else P
    moe_of_layer = {int(layer): m for m, layer in enumerate(rec.moe_layers)}
    phase_ns = rec.phase_ns.astype(np.int64)
    token_ns = rec.token_ns.astype(np.int64)
    margins, ulps, changed = events.margins, events.margin_ulps, events.routing_changed
    out: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "ts": 0, "pid": PID, "tid": TID_PREFILL,
         "args": {"name": f"colibri {(other or {}).get('model_name', 'engine')}"}},
        {"name": "process_sort_index", "ph": "M", "ts": 0, "pid": PID, "tid": TID_PREFILL,
         "args": {"sort_index": 0}},
    ]
    for tid, name in ((TID_PREFILL, "prefill"), (TID_DECODE, "decode")):
        out.append({"name": "thread_name", "ph": "M", "ts": 0, "pid": PID, "tid": tid,
                    "args": {"name": name}})
        out.append({"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": PID, "tid": tid,
                    "args": {"sort_index": tid}})
    routing = settings.routing if settings is not None else None
    epsilon = settings.epsilon if settings is not None else None
    clock = 0
    for p in range(P):
        tid = TID_PREFILL if p < n_prompt else TID_DECODE
        text = rec.token_text(p)
        slices: list[dict[str, Any]] = []
        layer_start = clock
        for layer in range(rec.n_layers):
            ph = phase_ns[p, layer]
            m = moe_of_layer.get(layer)
            if m is not None:
                parts = [(name, int(ph[i])) for i, name in enumerate(_MOE_PHASES)]
            else:
                rest = max(int(ph[4]) - int(ph[0]), 0)
                parts = [("attention", int(ph[0])), ("mlp", rest)]
            layer_dur = max(int(ph[4]), sum(d for _, d in parts))
            slices.append({"name": f"layer {layer}", "cat": "layer", "ph": "X",
                           "ts": _us(layer_start), "dur": _us(layer_dur), "pid": PID, "tid": tid,
                           "args": {"layer": layer, "position": p,
                                    "kind": "moe" if m is not None else "dense"}})
            t = layer_start
            for name, dur in parts:
                s: dict[str, Any] = {"name": name, "cat": "phase", "ph": "X", "ts": _us(t),
                                     "dur": _us(dur), "pid": PID, "tid": tid}
                if name == "router" and m is not None:
                    ids = rec.expert_ids[p, m]
                    keep = ids >= 0
                    chosen = ids[keep]
                    s["args"] = {
                        "layer": layer, "moe_index": m, "position": p, "token": int(rec.tokens[p]),
                        "text": text, "experts": [int(e) for e in chosen],
                        "weights": [float(w) for w in rec.expert_weights[p, m][keep]],
                        "logits_chosen": [_finite(float(rec.router_logits[p, m, e]))
                                          for e in chosen],
                        "margin": _finite(float(margins[p, m])),
                        "margin_ulps": (int(ulps[p, m]) if math.isfinite(float(margins[p, m]))
                                        else None),
                        "hidden_norm": _finite(float(rec.hidden_norm[p, m])),
                        "shared_gate": _finite(float(rec.shared_gate[p, m])),
                        "routing": routing, "epsilon": epsilon,
                    }
                    if rec.intervened[p, m]:
                        s["args"]["interventions"] = [k for i, k in enumerate(KINDS)
                                                      if int(rec.intervened[p, m]) >> i & 1]
                    if rec.k_fresh:
                        s["args"]["cache_kept"] = bool(rec.cache_kept[p, m])
                        s["args"]["cache_margin"] = _finite(float(rec.cache_margin[p, m]))
                        s["args"]["fresh_experts"] = [int(e) for e in rec.fresh_ids[p, m]
                                                      if e >= 0]
                    if rec.k_hits:
                        s["args"]["cache_hits"] = [bool(h) for h in rec.cache_hits[p, m][keep]]
                    if changed[p, m]:
                        slices.append({"name": "routing change", "cat": "routing", "ph": "i",
                                       "s": "t", "ts": _us(t), "pid": PID, "tid": tid,
                                       "args": {"layer": layer, "position": p,
                                                "experts": [int(e) for e in chosen]}})
                slices.append(s)
                t += dur
            layer_start += layer_dur
        token_dur = max(int(token_ns[p]), layer_start - clock)
        out.append({"name": f"token {p} {text!r}", "cat": "token", "ph": "X", "ts": _us(clock),
                    "dur": _us(token_dur), "pid": PID, "tid": tid,
                    "args": {"position": p, "token": int(rec.tokens[p]), "text": text,
                             "prompt": p < n_prompt, "token_ns": int(token_ns[p])}})
        out.extend(slices)
        if token_ns[p] > 0:
            out.append({"name": "throughput", "ph": "C", "ts": _us(clock), "pid": PID,
                        "tid": tid, "args": {"tokens_per_s": round(1e9 / int(token_ns[p]), 3)}})
        clock += token_dur
    meta: dict[str, Any] = {"generator": "colibri debugger", "positions": P,
                            "n_prompt": n_prompt, "n_layers": rec.n_layers,
                            "moe_layers": [int(x) for x in rec.moe_layers],
                            "n_experts": rec.n_experts, "k": rec.k}
    if settings is not None:
        meta["settings"] = settings.to_dict()
    meta.update(other or {})
    return {"traceEvents": out, "displayTimeUnit": "ns", "otherData": meta}


def write_chrome_trace(path: str | os.PathLike[str], events: EventList,
                       settings: RunSettings | None = None, n_prompt: int | None = None,
                       other: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the trace JSON through a temporary file and rename; returns the document."""
    doc = chrome_trace(events, settings, n_prompt, other)
    data = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")
    atomic_write(path, lambda f: f.write(data))
    return doc


def check_trace_events(doc: Any) -> list[str]:
    """Problems with a Trace Event JSON document (empty when it follows the format as Perfetto
    imports it): required fields per event, numeric ts/dur, known phases, and X slices that nest
    per (pid, tid) without partial overlaps."""
    problems: list[str] = []
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        return ["no traceEvents list"]
    slices: dict[tuple[Any, Any], list[tuple[int, int, str]]] = {}
    for i, e in enumerate(events):
        for key in ("name", "ph", "ts", "pid", "tid"):
            if key not in e:
                problems.append(f"event {i}: missing {key!r}")
        ph = e.get("ph")
        if ph not in {"X", "B", "E", "i", "I", "C", "M", "b", "e", "n", "s", "t", "f"}:
            problems.append(f"event {i}: unknown ph {ph!r}")
        if not isinstance(e.get("ts"), (int, float)):
            problems.append(f"event {i}: ts is not a number")
        if ph == "X":
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                problems.append(f"event {i}: X without a non-negative dur")
                continue
            start = round(e["ts"] * 1000)
            slices.setdefault((e.get("pid"), e.get("tid")), []).append(
                (start, start + round(dur * 1000), str(e.get("name"))))
        if ph == "C" and not all(isinstance(v, (int, float)) for v in e.get("args", {}).values()):
            problems.append(f"event {i}: counter args must be numbers")
        if ph == "M" and e.get("name") not in {"process_name", "thread_name",
                                               "process_sort_index", "thread_sort_index"}:
            problems.append(f"event {i}: unknown metadata {e.get('name')!r}")
    for key, items in slices.items():
        items.sort(key=lambda s: (s[0], -s[1]))
        stack: list[tuple[int, int, str]] = []
        for start, end, name in items:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack and end > stack[-1][1]:
                problems.append(f"thread {key}: {name!r} [{start}, {end}) ns overlaps "
                                f"{stack[-1][2]!r} [{stack[-1][0]}, {stack[-1][1]}) partially")
            stack.append((start, end, name))
    return problems


# ---------------------------------------------------------------------------------------------
# CSV

CSV_COLUMNS = ("position", "token", "text", "layer", "rank", "expert", "weight", "logit",
               "margin", "margin_ulps", "cache_kept", "cache_hit", "interventions")


def routing_rows(events: EventList) -> Iterable[tuple[Any, ...]]:
    """One row per (position, MoE layer, rank) of a chosen expert. cache_kept (cached routing
    kept the previous experts: 0/1) and cache_hit (the expert was resident: 0/1) are empty for a
    run without them."""
    rec = events.record
    margins, ulps = events.margins, events.margin_ulps
    for p in range(events.n_positions):
        text = rec.token_text(p)
        for m, layer in enumerate(rec.moe_layers):
            ids = rec.expert_ids[p, m]
            margin = float(margins[p, m])
            u = int(ulps[p, m]) if math.isfinite(margin) else ""
            edits = "+".join(k for i, k in enumerate(KINDS) if int(rec.intervened[p, m]) >> i & 1)
            kept = int(rec.cache_kept[p, m]) if rec.k_fresh else ""
            for rank, e in enumerate(ids):
                if e < 0:
                    continue
                hit = int(rec.cache_hits[p, m, rank]) if rec.k_hits else ""
                yield (p, int(rec.tokens[p]), text, int(layer), rank, int(e),
                       repr(float(rec.expert_weights[p, m, rank])),
                       repr(float(rec.router_logits[p, m, e])), repr(margin), u, kept, hit,
                       edits)


def write_routing_csv(path: str | os.PathLike[str], events: EventList) -> int:
    """Write the routing trace as CSV (columns CSV_COLUMNS; floats as shortest round-trip
    repr) through a temporary file and rename; returns the number of data rows."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    n = 0
    for row in routing_rows(events):
        writer.writerow(row)
        n += 1
    data = buf.getvalue().encode("utf-8")
    atomic_write(path, lambda f: f.write(data))
    return n


__all__ = ["CSV_COLUMNS", "chrome_trace", "check_trace_events", "routing_rows",
           "write_chrome_trace", "write_routing_csv"]
