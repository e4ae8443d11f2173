"""A client of `colibri serve --http`, and `Monitor`, which follows a server's requests live.

`ServerClient` is blocking and small (the standard library's http.client: no dependency, any
thread): `health()`, `traces()`, `trace(id, start)`, `complete(...)`, `tokenize(text)`, and
`events()`, an iterator over the server-sent events of GET /v1/events that another thread may
end with `close()`. A non-2xx answer raises `ServerError` with the server's message.

`Monitor.run(emit)` attaches to a server and reports, until `stop()`:
  ('attached', health)        connected (again); health is GET /health's body
  ('request', RemoteRequest)  a request appeared or changed: its summary and, once it has
                              positions, its routing as a debugger `RoutingRecord` + `EventList`
                              (the same store and events the debugger's views read)
  ('reload', data)            the server swapped a new model in; ('reload_refused', data) it
                              refused a broken one
  ('lost', message)           the server went away or cannot be reached; the monitor retries
                              every `retry_s` seconds and emits 'attached' when it is back
A request's rows are fetched incrementally (?start=) as the server reports progress, so a long
request costs its new rows only. The monitor keeps the last `keep` requests.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np

from colibri.debugging.events import EventList
from colibri.debugging.run import RECORD_ARRAYS, RoutingRecord
from colibri.serving.traces import array_from_json


class ServerError(Exception):
    """The server answered with an error (status, its message), or is not a Colibri server."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def parse_address(text: str) -> tuple[str, int]:
    """'host:port', '[::1]:port' or 'http://host:port[/]' -> (host, port). ValueError names
    what is wrong."""
    raw = text.strip()
    if not raw:
        raise ValueError("no address: expected host:port, e.g. 127.0.0.1:8080")
    parts = urlsplit(raw if "//" in raw else f"http://{raw}")
    if parts.scheme not in ("http", ""):
        raise ValueError(f"{text!r}: only http:// servers (colibri serve --http)")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{text!r}: the port must be a number in 0..65535") from None
    if not parts.hostname or port is None:
        raise ValueError(f"{text!r}: expected host:port, e.g. 127.0.0.1:8080")
    return parts.hostname, port


class ServerClient:
    """Blocking calls to one server (see the module docstring). One call at a time per object,
    except `close()`, which may come from any thread."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._stream: http.client.HTTPConnection | None = None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(HTTP status, JSON body) of one request; ServerError when the body is not JSON."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            return response.status, (json.loads(raw) if raw else None)
        except ValueError:
            raise ServerError(f"{self.address}{path} answered {response.status} with no JSON: "
                              f"is this a Colibri server?", response.status) from None

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """The JSON body of a 2xx answer; ServerError with the server's message otherwise."""
        status, doc = self.call(method, path, body)
        if status >= 300:
            message = doc.get("error", {}).get("message") if isinstance(doc, dict) else None
            raise ServerError(message or f"{self.address}{path} answered {status}", status)
        return doc

    def health(self) -> dict[str, Any]:
        """GET /health, also when it is a 503 (the model cannot be served now)."""
        _status, doc = self.call("GET", "/health")
        if not isinstance(doc, dict) or "model" not in doc or "reload" not in doc:
            raise ServerError(f"{self.address} is not a Colibri server (GET /health)")
        return doc

    def traces(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/v1/traces")["data"])

    def trace(self, trace_id: str, start: int = 0) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/traces/{quote(trace_id)}?start={int(start)}"))

    def complete(self, prompt: str | list[int], **fields: Any) -> dict[str, Any]:
        return dict(self.request("POST", "/v1/completions", {"prompt": prompt, **fields}))

    def tokenize(self, text: str) -> dict[str, Any]:
        return dict(self.request("POST", "/tokenize", {"prompt": text}))

    def events(self, path: str = "/v1/events") -> Iterator[tuple[str, Any]]:
        """Server-sent events as (event name, parsed data); a comment (the keep-alive) yields
        ('', None). Ends when the server closes the stream or `close()` is called."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        self._stream = conn
        try:
            conn.request("GET", path, headers={"Accept": "text/event-stream"})
            response = conn.getresponse()
            if response.status != 200:
                raise ServerError(f"{self.address}{path} answered {response.status}",
                                  response.status)
            yield from parse_sse(response)
        finally:
            self._stream = None
            conn.close()

    def close(self) -> None:
        """End a running `events()` iteration (from any thread)."""
        conn = self._stream
        sock = getattr(conn, "sock", None) if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def parse_sse(lines: Any) -> Iterator[tuple[str, Any]]:
    """Events of a text/event-stream read line by line from a binary file-like object."""
    event, data = "", []
    while True:
        line = lines.readline()
        if not line:
            return
        text = line.decode("utf-8").rstrip("\r\n")
        if not text:
            if data:
                payload = "\n".join(data)
                yield event or "message", (None if payload == "[DONE]" else json.loads(payload))
            event, data = "", []
        elif text.startswith(":"):
            yield "", None
        elif text.startswith("event:"):
            event = text[6:].strip()
        elif text.startswith("data:"):
            data.append(text[5:].lstrip(" "))


# ---------------------------------------------------------------------------------------------
# Following a server


@dataclass(frozen=True, eq=False)
class RemoteRequest:
    """One served request as the monitor knows it: immutable; `record` and `events` are None
    until it has positions (or once its trace was evicted before the monitor saw it)."""

    id: str
    summary: dict[str, Any]
    record: RoutingRecord | None
    events: EventList | None
    note: str = ""

    @property
    def status(self) -> str:
        return str(self.summary.get("status", ""))


class _Rows:
    """The rows of one request fetched so far."""

    def __init__(self) -> None:
        self.chunks: dict[str, list[np.ndarray]] = {}
        self.texts: list[str] = []
        self.n = 0
        self.meta: dict[str, Any] = {}

    def add(self, doc: dict[str, Any]) -> None:
        if not doc.get("dtypes"):
            return  # not started yet
        start = int(doc["start"])
        if start != self.n:
            raise ValueError(f"trace {doc['id']}: rows from {start}, expected {self.n}")
        positions = doc["positions"]
        for name, dtype in doc["dtypes"].items():
            rows = array_from_json(positions[name], dtype, doc["shapes"][name])
            self.chunks.setdefault(name, []).append(rows)
        self.texts.extend(positions["token_texts"])
        self.n = int(doc["n_positions"])
        self.meta = {k: doc[k] for k in ("moe_layers", "n_layers", "model")}

    def record(self) -> RoutingRecord | None:
        if not self.meta:
            return None
        arrays = {name: np.concatenate(parts) for name, parts in self.chunks.items()}
        missing = [name for name in RECORD_ARRAYS if name not in arrays]
        if missing:
            raise ValueError(f"the server's traces lack {', '.join(missing)}: a different "
                             f"version of Colibri?")
        arrays["moe_layers"] = np.asarray(self.meta["moe_layers"], dtype=np.int32)
        return RoutingRecord.from_arrays(arrays, self.texts, int(self.meta["n_layers"]))


class Monitor:
    """Follows one server (see the module docstring). `run` blocks: call it on a worker
    thread; `stop()` may come from any thread."""

    def __init__(self, host: str, port: int, keep: int = 200, retry_s: float = 2.0,
                 timeout: float = 10.0) -> None:
        self.client = ServerClient(host, port, timeout)
        self.keep = keep
        self.retry_s = retry_s
        self._stop = threading.Event()
        self._rows: dict[str, _Rows] = {}
        self._summaries: dict[str, dict[str, Any]] = {}

    @property
    def address(self) -> str:
        return self.client.address

    def stop(self) -> None:
        self._stop.set()
        self.client.close()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self, emit: Callable[[str, Any], None]) -> None:
        while not self._stop.is_set():
            try:
                message = self._follow(emit)
            except ConnectionRefusedError:
                message = f"cannot reach {self.address}: connection refused (is the server running?)"
            except (OSError, http.client.HTTPException) as exc:
                message = f"lost {self.address}: {exc or type(exc).__name__}"
            except (ServerError, ValueError) as exc:
                message = str(exc)
            if self._stop.is_set():
                return
            emit("lost", f"{message}; retrying every {self.retry_s:g} s")
            self._stop.wait(self.retry_s)

    def _follow(self, emit: Callable[[str, Any], None]) -> str:
        """One connection: returns why it ended."""
        health = self.client.health()
        events = self.client.events()
        try:
            for kind, _data in events:  # subscribe first: nothing between the list and it is lost
                if kind == "hello":
                    break
            # attached once subscribed: a request sent after this is seen from its queued event
            emit("attached", health)
            for summary in self.client.traces():
                self._update(summary, emit)
            for kind, data in events:
                if self._stop.is_set():
                    return "detached"
                if kind in ("queued", "started", "progress", "finished"):
                    self._update(data, emit)
                elif kind in ("reload", "reload_refused"):
                    emit(kind, data)
                elif kind == "overflow":
                    return f"{self.address}: fell behind the server's events; reconnecting"
                elif kind == "bye":
                    return f"{self.address} shut down"
        finally:
            events.close()
        return f"{self.address} closed the connection"

    def _update(self, summary: dict[str, Any], emit: Callable[[str, Any], None]) -> None:
        trace_id = str(summary["id"])
        rows = self._rows.get(trace_id)
        if rows is None:
            rows = self._rows[trace_id] = _Rows()
            while len(self._rows) > self.keep:
                oldest = next(iter(self._rows))
                del self._rows[oldest]
                self._summaries.pop(oldest, None)
        self._summaries[trace_id] = summary
        note = ""
        if int(summary.get("n_positions", 0)) > rows.n or (summary.get("status") != "queued"
                                                          and not rows.meta):
            try:
                rows.add(self.client.trace(trace_id, rows.n))
            except ServerError as exc:
                if exc.status != 404:
                    raise
                note = str(exc)
        record = rows.record()
        events = None
        if record is not None:
            k_active = int(rows.meta["model"].get("n_experts_active", record.k))
            events = EventList(record, k_active)
        emit("request", RemoteRequest(trace_id, dict(summary), record, events, note))


__all__ = ["Monitor", "RemoteRequest", "ServerClient", "ServerError", "parse_address",
           "parse_sse"]
