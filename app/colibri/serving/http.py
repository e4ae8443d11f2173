"""The HTTP server: a Starlette application over the engine worker, served by uvicorn.

Routes (docs/serving.md has the full reference):
  POST /v1/completions     OpenAI completions (colibri.serving.api), streamed as server-sent
                           events with "stream": true
  GET  /v1/traces          the kept requests, oldest first (summaries, no arrays)
  GET  /v1/traces/{id}     one request's routing trace (colibri.serving.traces); ?start=P for
                           the rows from position P on
  GET  /v1/events          server-sent events a monitor follows: queued, started, progress,
                           finished, reload, reload_refused (and a keep-alive comment)
  POST /tokenize           {"prompt": text} -> token ids and their texts
  GET  /health             the model, its generation, the queue, the last reload (503 while
                           the model cannot be served)
  GET  /v1/models          the one model, in the OpenAI list shape

The event loop never runs the engine: requests are queued onto the `EngineWorker`, whose thread
reports back through `loop.call_soon_threadsafe`. Prompt encoding and trace JSON (which can be
large) run in the thread pool. Bounds: the request body (413), the queue (503 with Retry-After),
the context (400), a per-request time limit, and the trace store. A client that disconnects
cancels its request between engine calls. Every error is JSON naming the field.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from colibri.serving import api
from colibri.serving.api import RequestError
from colibri.serving.traces import RequestTrace, TraceNotFound, TraceStore
from colibri.serving.worker import EngineWorker, Job, QueueFull

KEEPALIVE_S = 1.0          # the events stream's keep-alive (and shutdown check) period
SUBSCRIBER_BACKLOG = 4096  # events a slow monitor may fall behind before it is disconnected
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(frozen=True)
class Limits:
    """What one request may use (the CLI's --max-body and --timeout)."""

    max_body: int = 1 << 20     # bytes of a request body
    timeout_s: float = 120.0    # from arrival to the last token, queue wait included


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def error_response(exc: RequestError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, refusing more than `limit` bytes before reading them all."""
    declared = request.headers.get("content-length", "")
    too_big = RequestError(f"the request body exceeds the limit of {limit} bytes (--max-body)",
                           413)
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from None


class Hub:
    """Fans the worker's events out to /v1/events subscribers (on the event loop)."""

    def __init__(self) -> None:
        self.subscribers: set[Subscriber] = set()

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        for sub in list(self.subscribers):
            sub.put(kind, data)


class Subscriber:
    def __init__(self) -> None:
        self.items: deque[tuple[str, dict[str, Any]]] = deque()
        self.ready = asyncio.Event()
        self.overflowed = False

    def put(self, kind: str, data: dict[str, Any]) -> None:
        if len(self.items) >= SUBSCRIBER_BACKLOG:
            self.overflowed = True
        else:
            self.items.append((kind, data))
        self.ready.set()


def create_app(worker: EngineWorker, store: TraceStore, limits: Limits = Limits(),
               stopping: Callable[[], bool] = lambda: False) -> Starlette:
    """The application. Its lifespan starts the worker's thread and stops it (cancelling what
    is queued) at shutdown; `stopping()` tells long streams that the server is going down."""
    hub = Hub()

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        def on_event(kind: str, data: dict[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(hub.publish, kind, data)
            except RuntimeError:  # the loop is closed: nobody is listening
                pass

        worker.on_event = on_event
        worker.start()
        try:
            yield
        finally:
            await run_in_threadpool(worker.stop)

    def job_for(trace: RequestTrace) -> tuple[Job, asyncio.Queue[tuple[str, Any]]]:
        loop = asyncio.get_running_loop()
        results: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def notify(kind: str, data: Any) -> None:
            try:
                loop.call_soon_threadsafe(results.put_nowait, (kind, data))
            except RuntimeError:
                pass

        return Job(trace, time.monotonic() + limits.timeout_s, notify), results

    async def completions(request: Request) -> Response:
        try:
            body = await read_json(request, limits.max_body)
            params = await run_in_threadpool(api.parse_completion, body, worker.serving)
        except RequestError as exc:
            return error_response(exc)
        trace = RequestTrace(store.new_id(), params)
        job, results = job_for(trace)
        store.add(trace)
        try:
            worker.submit(job)
        except QueueFull as exc:
            store.discard(trace.id)
            return error_response(RequestError(str(exc), 503, kind="server_busy"),
                                  {"Retry-After": "1"})
        if params.stream:
            return StreamingResponse(stream(job, results), media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        if not await finished_unless_gone(request, job, results):
            return Response(status_code=499)  # nobody is there to read it
        if trace.status == "failed":
            return error_response(api.failure(trace))
        return JSONResponse(api.completion_body(trace))

    async def finished_unless_gone(request: Request, job: Job,
                                   results: asyncio.Queue[tuple[str, Any]]) -> bool:
        """Wait for the job; cancel it and return False if the client disconnects first."""
        async def gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        watcher = asyncio.ensure_future(gone())
        try:
            while True:
                getter = asyncio.ensure_future(results.get())
                done, _ = await asyncio.wait({getter, watcher},
                                             return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    job.cancel()
                    return False
                if getter.result()[0] == "done":
                    return True
        finally:
            watcher.cancel()

    async def stream(job: Job, results: asyncio.Queue[tuple[str, Any]]) -> AsyncIterator[bytes]:
        trace = job.trace
        try:
            while True:
                kind, data = await results.get()
                if kind == "tokens":
                    yield sse(api.stream_chunk(trace, data["text"], data["token_ids"]))
                elif kind == "done":
                    if trace.status == "failed":
                        yield sse(api.failure(trace).body())
                    else:
                        yield sse(api.stream_chunk(trace, "", [], final=True))
                    yield b"data: [DONE]\n\n"
                    return
        finally:
            if not trace.done:
                job.cancel()  # the client went away (the stream was cancelled)

    async def traces(_request: Request) -> Response:
        return JSONResponse({"object": "list", "data": store.summaries()})

    async def trace(request: Request) -> Response:
        trace_id = request.path_params["trace_id"]
        start = request.query_params.get("start", "0")
        if not start.isdigit():
            return error_response(RequestError(f"start must be a position (an int >= 0), got "
                                               f"{start!r}", param="start"))
        try:
            found = store.get(trace_id)
        except TraceNotFound as exc:
            return error_response(RequestError(str(exc), 404, "id", "not_found"))
        body = await run_in_threadpool(found.to_json, int(start))
        return await run_in_threadpool(JSONResponse, body)

    async def events(_request: Request) -> Response:
        sub = Subscriber()
        hub.subscribers.add(sub)

        async def feed() -> AsyncIterator[bytes]:
            try:
                yield sse(worker.health(), "hello")
                while not stopping():
                    try:
                        await asyncio.wait_for(sub.ready.wait(), KEEPALIVE_S)
                    except asyncio.TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    sub.ready.clear()
                    while sub.items:
                        kind, data = sub.items.popleft()
                        yield sse(data, kind)
                    if sub.overflowed:
                        yield sse({"message": f"more than {SUBSCRIBER_BACKLOG} events behind: "
                                              "reconnect"}, "overflow")
                        return
                yield sse({"message": "the server is shutting down"}, "bye")
            finally:
                hub.subscribers.discard(sub)

        return StreamingResponse(feed(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def tokenize(request: Request) -> Response:
        try:
            body = await read_json(request, limits.max_body)
            return JSONResponse(await run_in_threadpool(api.parse_tokenize, body,
                                                        worker.serving))
        except RequestError as exc:
            return error_response(exc)

    async def health(_request: Request) -> Response:
        report = worker.health()
        report["traces"] = {"kept": len(store), "max": store.max_traces}
        report["limits"] = {"max_body": limits.max_body, "timeout_s": limits.timeout_s}
        return JSONResponse(report, status_code=503 if report["status"] != "ok" else 200)

    async def models(_request: Request) -> Response:
        serving = worker.serving
        return JSONResponse({"object": "list", "data": [
            {"id": serving.name, "object": "model", "created": int(worker.started),
             "owned_by": "colibri", "colibri": serving.describe()}]})

    async def http_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(RequestError(str(exc.detail), exc.status_code,
                                           kind="invalid_request_error"))

    async def server_error(_request: Request, exc: Exception) -> Response:
        return error_response(RequestError(f"internal error: {type(exc).__name__}: {exc}", 500,
                                           kind="server_error"))

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/traces", traces, methods=["GET"]),
              Route("/v1/traces/{trace_id}", trace, methods=["GET"]),
              Route("/v1/events", events, methods=["GET"]),
              Route("/tokenize", tokenize, methods=["POST"]),
              Route("/health", health, methods=["GET"]),
              Route("/v1/models", models, methods=["GET"])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: http_error, Exception: server_error})


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: the system picks one; read it back)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(worker: EngineWorker, store: TraceStore, sock: socket.socket, limits: Limits) -> bool:
    """Serve on `sock` until SIGINT or SIGTERM; returns after a graceful shutdown (the worker
    stopped, queued requests answered 503): True, or False when the server did not start."""
    import uvicorn

    server: uvicorn.Server | None = None
    app = create_app(worker, store, limits,
                     stopping=lambda: server is not None and server.should_exit)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=5, log_config=None,
                            limit_concurrency=4 * worker.queue_size + 64)
    server = uvicorn.Server(config)
    # uvicorn raises the signal that stopped it again once it has shut down, with the handler
    # it found: make that one a no-op so the caller's cleanup (the pid file) runs.
    previous = {sig: signal.signal(sig, lambda _s, _f: None)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return bool(server.started)


__all__ = ["Hub", "Limits", "bind", "create_app", "error_response", "read_json", "serve", "sse"]
