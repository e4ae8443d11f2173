"""A request's routing trace as the server keeps and serves it, and the bounded store of them.

`RequestTrace` is one completion request: what was asked, on which model (and at which position
a hot reload switched models), what the engine did at every position, when, and how it ended.
The per-position arrays are every per-position field of `colibri.engine.Trace` (taken by name,
so arrays added to the engine's trace appear here unchanged), copied from the session as each
position is processed (in batches: at least every 0.1 s while it runs), plus two the server
measures: `wall_ns` (the engine call's wall time;
a prompt's positions share their one prefill call equally) and `logits_finite` (the position's
output logits are all finite; True where they were not computed: the prompt's positions before
its last). These are the arrays the debugger's `RoutingRecord` holds, so a client can rebuild
one and show a served request in the debugger's views.

Threads: the engine thread writes a trace; the event loop reads it. Buffers are allocated once
for the request's largest position count, rows once written never change, and the row count is
published after the rows, so a reader sees a consistent prefix without locks.

JSON (`to_json`, the body of GET /v1/traces/{id}): arrays are nested lists, positions first;
float32 values are written exactly (as the float64 of the same value) and the non-finite ones as
the strings "NaN", "Infinity" and "-Infinity" (JSON has no literal for them). `dtypes` and `shapes`
name each array's numpy dtype and trailing shape, so `array_from_json` rebuilds it bit for bit.
`start` asks for rows from that position on (a client following a running request fetches only
what is new).

`TraceStore` keeps the most recently used traces, at most `max_traces` of them and at most
`max_bytes` of arrays; ids carry the server's instance and a sequence number, so an id that was
evicted is told apart from one this server never issued.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from colibri.engine import Trace

# Per-position arrays the server adds to the engine's trace fields: name -> dtype.
SERVER_ARRAYS: dict[str, Any] = {"wall_ns": np.uint64, "logits_finite": np.bool_}
STATUSES = ("queued", "running", "finished", "failed", "cancelled")
_NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


# ---------------------------------------------------------------------------------------------
# Arrays as JSON


def array_to_json(a: np.ndarray) -> Any:
    """Nested lists of `a`; float values exact, non-finite ones as "NaN"/"Infinity"/"-Infinity"."""
    if a.dtype.kind != "f" or bool(np.isfinite(a).all()):
        return a.tolist()
    out = a.astype(object)
    bad = ~np.isfinite(a)
    out[bad] = [_NONFINITE[str(v)] for v in a[bad].astype(np.float64)]
    return out.tolist()


def array_from_json(values: Any, dtype: str | Any, inner: Sequence[int]) -> np.ndarray:
    """The array `array_to_json` wrote: `values` nested lists [n, *inner] of `dtype`."""
    dt = np.dtype(dtype)
    if isinstance(values, list) and not values:
        return np.zeros((0, *inner), dtype=dt)
    try:
        out = np.asarray(values, dtype=dt)
    except (ValueError, TypeError):
        if dt.kind != "f":
            raise
        out = np.asarray(values, dtype=object).astype(dt)  # float() reads "NaN", "-Infinity"
    if tuple(out.shape[1:]) != tuple(inner):
        raise ValueError(f"array of shape {out.shape}, expected [n, {', '.join(map(str, inner))}]")
    return out


# ---------------------------------------------------------------------------------------------
# One request


@dataclass(frozen=True)
class CompletionParams:
    """A validated completion request (colibri.serving.api parses it from the JSON body)."""

    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float
    seed: int
    stream: bool

    @property
    def n_positions(self) -> int:
        """Positions the request processes at most (fewer when eos comes early)."""
        return len(self.prompt) + max(self.max_tokens - 1, 0)


class RequestTrace:
    """One completion request and its routing trace (see the module docstring)."""

    def __init__(self, trace_id: str, params: CompletionParams) -> None:
        self.id = trace_id
        self.params = params
        self.created = time.time()
        self.arrived_ns = time.monotonic_ns()
        self.status = "queued"
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.error_status = 0        # the HTTP status of a failed request
        self.error_param: str | None = None
        self.model: dict[str, Any] = {}
        self.settings: dict[str, Any] = {}
        self.generated: list[int] = []
        self.text = ""
        self.reloads: list[dict[str, Any]] = []
        self.timings: dict[str, int] = {"queue_ns": 0, "prefill_ns": 0, "decode_ns": 0,
                                        "total_ns": 0}
        self.moe_layers: list[int] = []
        self.n_layers = 0
        self.token_texts: list[str] = []
        self._arrays: dict[str, np.ndarray] = {}
        self._n = 0

    # -- writing (the engine thread) --------------------------------------------------------------

    def begin(self, trace: Trace, n_layers: int, model: dict[str, Any],
              settings: dict[str, Any]) -> None:
        """The request starts on a session whose (empty) trace is `trace`: allocate every array
        for the request's positions."""
        rows = max(self.params.n_positions, 1)
        self._arrays = {name: np.zeros((rows, *getattr(trace, name).shape[1:]),
                                       getattr(trace, name).dtype)
                        for name in Trace.position_fields()}
        for name, dtype in SERVER_ARRAYS.items():
            self._arrays[name] = np.zeros(rows, dtype)
        self.moe_layers = [int(m) for m in trace.moe_layers]
        self.n_layers = int(n_layers)
        self.model = dict(model)
        self.settings = dict(settings)
        self.timings["queue_ns"] = time.monotonic_ns() - self.arrived_ns
        self.status = "running"

    def note_call(self, positions: range, wall_ns: int, last_finite: bool) -> None:
        """An engine call processed `positions` in `wall_ns`; its last position's logits were
        finite or not (the rows themselves come with `add_rows`)."""
        start, stop = positions.start, positions.stop
        if stop > start:
            self._arrays["wall_ns"][start:stop] = wall_ns // (stop - start)
            self._arrays["logits_finite"][start:stop] = True
            self._arrays["logits_finite"][stop - 1] = last_finite

    def add_rows(self, trace: Trace, stop: int, texts: Sequence[str]) -> None:
        """Copy the session trace's rows from the last one copied up to `stop` (one slice per
        array: the engine thread copies in batches, not per position); `texts` are those
        positions' token texts."""
        start = self._n
        if stop <= start:
            return
        for name in Trace.position_fields():
            self._arrays[name][start:stop] = getattr(trace, name)[start:stop]
        self.token_texts.extend(texts)
        self._n = stop  # publish the rows last

    def finish(self, reason: str, status: str = "finished") -> None:
        self.finish_reason = reason
        self.status = status
        self.timings["total_ns"] = time.monotonic_ns() - self.arrived_ns

    def fail(self, message: str, http_status: int = 500, param: str | None = None) -> None:
        self.error, self.error_status, self.error_param = message, http_status, param
        self.finish("error", "failed")

    # -- reading (any thread) ---------------------------------------------------------------------

    @property
    def n_positions(self) -> int:
        return self._n

    @property
    def done(self) -> bool:
        return self.status in ("finished", "failed", "cancelled")

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())

    def array(self, name: str) -> np.ndarray:
        """Rows so far of one per-position array (read-only view)."""
        view = self._arrays[name][:self._n]
        view.flags.writeable = False
        return view

    def summary(self) -> dict[str, Any]:
        """What a request list shows: no arrays."""
        return {"id": self.id, "status": self.status, "created": self.created,
                "finish_reason": self.finish_reason, "error": self.error,
                "prompt_tokens": len(self.params.prompt), "max_tokens": self.params.max_tokens,
                "completion_tokens": len(self.generated), "n_positions": self._n,
                "model_generation": self.model.get("generation"), "reloads": len(self.reloads),
                "timings": dict(self.timings)}

    def to_json(self, start: int = 0) -> dict[str, Any]:
        """The trace as JSON-ready values, rows from position `start` on."""
        n = self._n  # one length for every array, whatever the engine appends meanwhile
        start = min(max(int(start), 0), n)
        names = [*self._arrays]
        return {
            "id": self.id, "object": "colibri.trace", "status": self.status,
            "created": self.created, "finish_reason": self.finish_reason, "error": self.error,
            "model": self.model, "settings": self.settings,
            "request": {"prompt": list(self.params.prompt), "max_tokens": self.params.max_tokens,
                        "temperature": self.params.temperature, "seed": self.params.seed,
                        "stream": self.params.stream},
            "generated": list(self.generated), "text": self.text, "reloads": list(self.reloads),
            "timings": dict(self.timings), "moe_layers": list(self.moe_layers),
            "n_layers": self.n_layers, "n_positions": n, "start": start,
            "dtypes": {name: self._arrays[name].dtype.name for name in names},
            "shapes": {name: list(self._arrays[name].shape[1:]) for name in names},
            "positions": {**{name: array_to_json(self._arrays[name][start:n]) for name in names},
                          "token_texts": self.token_texts[start:n]},
        }


# ---------------------------------------------------------------------------------------------
# The store


class TraceNotFound(KeyError):
    """No trace under an id; the message says whether it was evicted or never issued."""

    def __str__(self) -> str:
        return str(self.args[0])


class TraceStore:
    """The recent requests' traces, least recently used evicted first (see the module
    docstring). Thread-safe."""

    def __init__(self, max_traces: int = 256, max_bytes: int = 256 << 20) -> None:
        if max_traces < 1:
            raise ValueError(f"the trace store must keep at least 1 trace, got {max_traces}")
        self.max_traces = max_traces
        self.max_bytes = max_bytes
        self.instance = secrets.token_hex(4)
        self._next = 1
        self._traces: OrderedDict[str, RequestTrace] = OrderedDict()
        self._lock = threading.Lock()

    def new_id(self) -> str:
        with self._lock:
            seq, self._next = self._next, self._next + 1
        return f"cmpl-{self.instance}-{seq}"

    def add(self, trace: RequestTrace) -> None:
        with self._lock:
            self._traces[trace.id] = trace
            self._evict()

    def discard(self, trace_id: str) -> None:
        with self._lock:
            self._traces.pop(trace_id, None)

    def _evict(self) -> None:
        """Drop the least recently used finished traces while over either bound (a queued or
        running request's trace stays)."""
        total = sum(t.nbytes for t in self._traces.values())
        for key in list(self._traces):
            if len(self._traces) <= self.max_traces and total <= self.max_bytes:
                break
            trace = self._traces[key]
            if trace.done:
                total -= trace.nbytes
                del self._traces[key]

    def get(self, trace_id: str) -> RequestTrace:
        """The trace of `trace_id` (now the most recently used); TraceNotFound says why not."""
        with self._lock:
            trace = self._traces.get(trace_id)
            if trace is not None:
                self._traces.move_to_end(trace_id)
                return trace
            issued = self._next
        prefix = f"cmpl-{self.instance}-"
        seq = trace_id[len(prefix):] if trace_id.startswith(prefix) else ""
        if seq.isdigit() and 0 < int(seq) < issued:
            raise TraceNotFound(
                f"trace {trace_id} was evicted: this server keeps the {self.max_traces} most "
                f"recently used traces (at most {self.max_bytes >> 20} MiB; --traces, "
                f"--trace-memory)")
        raise TraceNotFound(f"no trace {trace_id} on this server (its ids start with "
                            f"{prefix})")

    def summaries(self) -> list[dict[str, Any]]:
        """Every kept request, oldest first."""
        with self._lock:
            traces = sorted(self._traces.values(), key=lambda t: t.arrived_ns)
        return [t.summary() for t in traces]

    def __len__(self) -> int:
        return len(self._traces)


__all__ = ["SERVER_ARRAYS", "STATUSES", "CompletionParams", "RequestTrace", "TraceNotFound",
           "TraceStore", "array_from_json", "array_to_json"]
