"""The server's engine thread: one thread owns the model's `Session` and runs requests in arrival
order from a bounded queue.

`EngineWorker.submit(job)` only queues (`QueueFull` when the queue holds `queue_size` requests);
the event loop never waits on the engine. The thread takes one job at a time, resets the session
and runs the request through a `colibri.generation.Generation` (the one decoding loop), one
engine call at a time (a prompt in pieces of PROMPT_PIECE positions, the engine's prefill block,
so that a long prompt is not one call), and after each call copies the new trace rows into the
job's `RequestTrace` and tells the job what it produced (`job.notify`, from this thread: the HTTP
side hands it to its event loop). Between calls it checks the job's cancel flag (the client went
away) and time limit; a stopped request keeps what it produced.

Hot reload is `colibri.reload`'s, exactly as `colibri serve` on stdin: between requests, while
idle (every `POLL_S`), and between tokens of a request (the generation's swap hook), a SIGUSR1 or
a replaced file swaps the new model in once it validates; a broken replacement is refused and the
loaded model kept (`health()` says why). A swap inside a request continues it on the new model
from the tokens so far; the request's trace records the position and the model generation.

`on_event(kind, data)` (called on this thread) reports what a monitor follows: 'queued',
'started', 'progress' (at most every PROGRESS_S per request), 'finished', 'reload' and
'reload_refused'.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from colibri.engine import Model, Session
from colibri.errors import ColibriError, ColibriFileChangedError
from colibri.generation import Generation, History
from colibri.reload import HotModel, session_swapper
from colibri.serving.traces import RequestTrace
from colibri.tokens import token_text

POLL_S = 0.25       # how often an idle worker looks for a reload
PROGRESS_S = 0.1    # the most often a running request reports progress
PROMPT_PIECE = 256  # prompt positions an engine call: the engine's prefill block (COL_BATCH)

Notify = Callable[[str, Any], None]


class QueueFull(Exception):
    """The request queue is full: the server is busy (HTTP 503)."""


@dataclass(frozen=True)
class ServingModel:
    """The model being served, as the event loop may read it (replaced whole on a reload)."""

    model: Model
    generation: int
    context: int            # positions a request may use: min(--context, the model's)
    tokenizer: Any          # a tokenizers.Tokenizer, or None (absent or unloadable)
    fingerprint: str        # see fingerprint()

    @property
    def name(self) -> str:
        return os.path.basename(self.model.path)

    @property
    def vocab_size(self) -> int:
        return self.model.hparams.vocab_size

    def describe(self) -> dict[str, Any]:
        hp = self.model.hparams
        return {"name": self.name, "path": self.model.path, "arch": self.model.arch,
                "generation": self.generation, "fingerprint": self.fingerprint,
                "size": self.model.size,
                "n_layers": hp.n_layers, "n_experts": hp.n_experts,
                "n_experts_active": hp.n_experts_active, "vocab_size": hp.vocab_size,
                "max_context": hp.max_context, "context": self.context,
                "has_tokenizer": self.tokenizer is not None}


def fingerprint(model: Model) -> str:
    """Which file is served, in 8 hex digits: the CRC-32 of the tensor table, which holds every
    tensor's CRC-32 (two versions of a path differ here)."""
    table = model.sections["tensor_table"]
    return f"{zlib.crc32(model.bytes()[table.offset:table.end]):08x}"


def serving_model(model: Model, generation: int, context: int) -> ServingModel:
    try:
        tokenizer = model.tokenizer
    except ColibriError:
        tokenizer = None
    return ServingModel(model, generation, min(context, model.hparams.max_context), tokenizer,
                        fingerprint(model))


class Job:
    """One request on its way through the worker: its trace, its deadline (time.monotonic), and
    `notify(kind, data)` for what it produces: ('tokens', {'token_ids': new ids, 'text': the text
    they add}) for a streamed request, and ('done', None)."""

    def __init__(self, trace: RequestTrace, deadline: float, notify: Notify) -> None:
        self.trace = trace
        self.deadline = deadline
        self.notify = notify
        self.cancelled = False   # a plain flag: set from the event loop, read between calls

    def cancel(self) -> None:
        self.cancelled = True


class EngineWorker:
    """The engine thread (see the module docstring)."""

    def __init__(self, hot: HotModel, *, routing: str = "topk", epsilon: float | None = None,
                 seed: int = 0, threads: int = 1, context: int = 4096, queue_size: int = 32,
                 log: Callable[[str], None] = print,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.hot = hot
        self.routing, self.epsilon, self.seed, self.threads = routing, epsilon, seed, threads
        self.max_context = context
        self.log = log
        self.on_event = on_event
        self.queue_size = queue_size
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self.serving = serving_model(hot.model, hot.generation, context)
        self._before_swap: Callable[[], None] | None = None   # set while a request runs
        self._session = self._new_session(hot.model)   # raises for a bad --routing/--threads
        self.kernels = self._session.kernels
        self._swap = session_swapper(hot, self._new_session, self._report)
        self._reported: str | None = None
        self.error: str | None = None            # why the model cannot be served now
        self.last_reload: dict[str, Any] | None = None
        self.reload_refused: str | None = None
        self.running: str | None = None          # id of the request being run
        self._current: Job | None = None
        self.served = 0
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="colibri-engine", daemon=True)

    # -- control (any thread) ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel the running request and every queued one, and join the thread."""
        self._stop.set()
        current = self._current
        if current is not None:
            current.cancel()
        for job in self._drain():
            job.cancel()
            job.trace.fail("the server is shutting down", 503)
            self._done(job)
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, job: Job) -> None:
        """Queue a job; QueueFull when the queue is full. Call it from one thread (the event
        loop's)."""
        if self._stop.is_set():
            raise QueueFull("the server is shutting down")
        if self._queue.full():  # only the event loop puts: room now is room below
            raise QueueFull(f"the server is busy: {self.queue_size} requests are waiting "
                            f"(--queue)")
        self._event("queued", job.trace.summary())  # before the thread can say 'started'
        self._queue.put_nowait(job)

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    def health(self) -> dict[str, Any]:
        serving = self.serving
        return {"status": "error" if self.error else "ok", "error": self.error,
                "model": serving.describe(), "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started, 3),
                "routing": {"mode": self.routing, "epsilon": self.epsilon, "seed": self.seed,
                            "threads": self.threads, "kernels": self.kernels},
                "queue": {"waiting": self.waiting, "capacity": self.queue_size},
                "running": self.running, "served": self.served,
                "reload": {"generation": self.hot.generation, "last": self.last_reload,
                           "refused": self.reload_refused}}

    # -- the thread -------------------------------------------------------------------------------

    def _drain(self) -> list[Job]:
        jobs = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return jobs
            if job is not None:
                jobs.append(job)

    def _main(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                self._between_requests()
                continue
            if job is None:
                break
            self._between_requests()
            self._run(job)
        self._session.close()

    def _new_session(self, model: Model) -> Session:
        if self._before_swap is not None:  # a reload inside a request: save its rows first
            self._before_swap()
        return Session(model, routing=self.routing,  # type: ignore[arg-type]
                       epsilon=self.epsilon, seed=self.seed, threads=self.threads,
                       max_context=min(self.max_context, model.hparams.max_context), trace=True)

    def _report(self, line: str) -> None:
        self._reported = line
        self.log(line)

    def _swapped(self, fresh: Session | None, position: int) -> Session | None:
        """After the swap hook ran: adopt a new session, or record a refused reload."""
        if fresh is not None:
            self._session = fresh
            self.serving = serving_model(self.hot.model, self.hot.generation, self.max_context)
            self.kernels = fresh.kernels
            self.last_reload = {"generation": self.hot.generation, "at": time.time(),
                                "position": position, "request": self.running}
            self.reload_refused = None
            self.error = None
            self._event("reload", {"generation": self.hot.generation, "path": self.hot.path,
                                   "request": self.running, "position": position})
        elif self._reported is not None:
            self.reload_refused = self._reported
            self._event("reload_refused", {"message": self._reported})
        return fresh

    def _between_requests(self) -> None:
        """Poll for a reload; a file changed in place with no valid replacement makes the model
        unusable until one appears (reported once per distinct reason)."""
        self._reported = None
        try:
            self._swapped(self._swap(self._session, History(), False), 0)
        except ColibriFileChangedError as exc:
            if self.error != str(exc):
                self.error = str(exc)
                self.log(f"cannot serve: {exc}")
            return
        if self.error is not None and self._reported is None:
            self.error = None

    def _job_swap(self, trace: RequestTrace) -> Callable[[Session, History, bool],
                                                         Session | None]:
        def swap(session: Session, history: History, changed: bool) -> Session | None:
            self._reported = None
            fresh = self._swapped(self._swap(session, history, changed), len(history))
            if fresh is not None:
                trace.reloads.append({"position": len(history),
                                      "generation": self.hot.generation, "path": self.hot.path,
                                      "fingerprint": self.serving.fingerprint})
            return fresh
        return swap

    def _event(self, kind: str, data: dict[str, Any]) -> None:
        if self.on_event is not None:
            self.on_event(kind, data)

    def _done(self, job: Job) -> None:
        job.notify("done", None)
        trace = job.trace
        self._event("finished", trace.summary())
        t = trace.timings
        outcome = trace.error if trace.status == "failed" else trace.finish_reason
        self.log(f"{trace.id} {trace.status} ({outcome}): {len(trace.params.prompt)} prompt + "
                 f"{len(trace.generated)} tokens in {t['total_ns'] / 1e6:.1f} ms (queue "
                 f"{t['queue_ns'] / 1e6:.1f} ms), model generation "
                 f"{trace.model.get('generation', '-')}")

    def _run(self, job: Job) -> None:
        trace, params = job.trace, job.trace.params
        if job.cancelled:
            trace.finish("cancelled", "cancelled")
            return self._done(job)
        if time.monotonic() > job.deadline:
            trace.fail(f"the request's time limit passed while it waited in the queue "
                       f"({self.waiting} requests behind it)", 503)
            return self._done(job)
        if self.error is not None:
            trace.fail(f"the model cannot be served: {self.error}", 503)
            return self._done(job)
        serving = self.serving
        if params.n_positions > serving.context:
            trace.fail(f"prompt ({len(params.prompt)} tokens) and max_tokens "
                       f"({params.max_tokens}) need {params.n_positions} positions; the "
                       f"context of {serving.name} (generation {serving.generation}) is "
                       f"{serving.context}", 400, "max_tokens")
            return self._done(job)
        self.running, self._current = trace.id, job
        try:
            self._generate(job, serving)
        except ColibriError as exc:
            trace.fail(f"the engine failed: {exc}", 500)
        except Exception as exc:  # the thread must outlive any one request
            trace.fail(f"internal error: {type(exc).__name__}: {exc}", 500)
        finally:
            self.running, self._current = None, None
            self.served += 1
        self._done(job)

    def _generate(self, job: Job, serving: ServingModel) -> None:
        trace, params = job.trace, job.trace.params
        session = self._session
        session.reset()
        live = session.trace
        assert live is not None
        decoding = "sample" if params.temperature > 0 else "greedy"
        trace.begin(live, serving.model.hparams.n_layers, serving.describe(),
                    {"routing": self.routing, "epsilon": self.epsilon, "seed": self.seed,
                     "threads": self.threads, "kernels": self.kernels, "decoding": decoding})
        self._event("started", trace.summary())
        tokenizer = serving.tokenizer
        gen = Generation(session, params.prompt, params.max_tokens, decoding=decoding,
                         temperature=params.temperature, seed=params.seed,
                         eos=serving.model.hparams.eos_token_id, swap=self._job_swap(trace))
        text = _Detokenizer(tokenizer)

        def copy_rows() -> None:
            """The rows processed so far into the trace (before a reload too: the old session
            holds them)."""
            rows = gen.session.trace
            assert rows is not None
            first, stop = trace.n_positions, gen.positions
            trace.add_rows(rows, stop, [token_text(tokenizer, int(t))
                                        for t in rows.tokens[first:stop]])

        self._before_swap = copy_rows
        last_progress = 0.0
        stopped = ""
        try:
            while not gen.finished:
                if job.cancelled or time.monotonic() > job.deadline:
                    stopped = "cancelled" if job.cancelled else "time_limit"
                    gen.stop()
                    break
                positions = gen.advance(PROMPT_PIECE)
                assert gen.last_logits is not None
                trace.note_call(positions, gen.call_ns, bool(np.isfinite(gen.last_logits).all()))
                if len(gen.generated) > len(trace.generated):
                    if params.stream:  # a whole response waits for 'done' alone
                        job.notify("tokens", {"token_ids": gen.generated[len(trace.generated):],
                                              "text": text.add(gen.generated)})
                    trace.generated = list(gen.generated)
                now = time.monotonic()
                if now - last_progress >= PROGRESS_S:
                    last_progress = now
                    copy_rows()
                    self._event("progress", trace.summary())
            copy_rows()
        except ColibriFileChangedError as exc:
            self.error = str(exc)
            self.log(f"cannot serve: {exc}")
            trace.fail(f"the model file changed in place and cannot be reopened: {exc}", 503)
            return
        finally:
            self._before_swap = None
            self._session = gen.session
            trace.timings["prefill_ns"] = gen.prefill_ns
            trace.timings["decode_ns"] = gen.decode_ns
        trace.generated = list(gen.generated)
        rest = text.flush(trace.generated) if params.stream else ""
        if rest:
            job.notify("tokens", {"token_ids": [], "text": rest})
        trace.text = str(tokenizer.decode(trace.generated)) if tokenizer is not None else ""
        if stopped == "cancelled":
            trace.finish("cancelled", "cancelled")
        else:
            trace.finish(stopped or {"finished": "length", "eos": "stop"}.get(gen.reason,
                                                                              gen.reason))


class _Detokenizer:
    """The text each new token adds, decoding a short window (the previous token's and the new
    ones') instead of everything so far; text ending in a partial character (U+FFFD) waits for
    the next token. Without a tokenizer there is no text."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.prefix = 0   # start of the window: gives the new tokens their context
        self.read = 0     # tokens whose text was sent

    def add(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        decode = self.tokenizer.decode
        before = str(decode(ids[self.prefix:self.read]))
        after = str(decode(ids[self.prefix:]))
        if len(after) <= len(before) or after.endswith("\ufffd") or \
                not after.startswith(before):
            return ""
        self.prefix, self.read = self.read, len(ids)
        return after[len(before):]

    def flush(self, ids: list[int]) -> str:
        """At the end: whatever the last tokens add, partial characters included."""
        if self.tokenizer is None or self.read >= len(ids):
            return ""
        before = str(self.tokenizer.decode(ids[self.prefix:self.read]))
        after = str(self.tokenizer.decode(ids[self.prefix:]))
        self.read = len(ids)
        return after[len(before):] if after.startswith(before) else ""


__all__ = ["EngineWorker", "Job", "QueueFull", "ServingModel", "fingerprint", "serving_model"]
