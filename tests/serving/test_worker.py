"""The server's engine thread and trace store in-process, where timing can be made exact: a
reload between two tokens of a request continues it on the new model from the tokens so far, a
broken replacement is refused once and the model kept, a request whose time limit passed in the
queue is refused, the queue is bounded, and the trace store keeps what its bounds allow."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from colibri.engine import Model, Session
from colibri.reload import HotModel
from colibri.serving.traces import (CompletionParams, RequestTrace, TraceNotFound, TraceStore,
                                    array_from_json, array_to_json)
from colibri.serving.worker import PROMPT_PIECE, EngineWorker, Job, QueueFull, fingerprint

from tiny_models import replace_with

CORPUS = Path(__file__).resolve().parents[1] / "corpus"


def run_job(worker: EngineWorker, params: CompletionParams,
            on_notify: Callable[[str, Any], None] = lambda k, d: None,
            deadline: float = float("inf")) -> RequestTrace:
    trace = RequestTrace("cmpl-test-1", params)
    done = threading.Event()

    def notify(kind: str, data: Any) -> None:
        on_notify(kind, data)
        if kind == "done":
            done.set()

    worker.submit(Job(trace, deadline, notify))
    assert done.wait(60)
    return trace


def greedy(path: Path, tokens: list[int]) -> int:
    """The greedy next token after `tokens` on a fresh session of `path`."""
    with Model.open(path) as model:
        return int(Session(model, max_context=64).prefill(tokens)[-1].argmax())


def test_a_reload_between_tokens_continues_the_request_on_the_new_model(
        models: tuple[Path, Path, Path]) -> None:
    live, a, b = models
    hot = HotModel(live)
    lines: list[str] = []
    worker = EngineWorker(hot, log=lines.append)
    worker.start()

    def after_first_token(kind: str, data: Any) -> None:
        if kind == "tokens" and data["token_ids"] and not hot.generation and not hot.pending:
            replace_with(b, live)   # on the engine thread, between two engine calls
            hot.request()

    prompt = [3, 4, 5, 6]
    try:
        trace = run_job(worker, CompletionParams(tuple(prompt), 6, 0.0, 0, True),  # streamed
                        after_first_token)
    finally:
        worker.stop()
    assert trace.status == "finished" and len(trace.generated) == 6
    # the first token was chosen after the prompt on A; position 4 onward ran on B
    assert trace.reloads == [{"position": 4, "generation": 1, "path": str(live),
                              "fingerprint": fingerprint(Model.open(b))}]
    assert trace.model["fingerprint"] == fingerprint(Model.open(a))
    tokens = list(prompt)
    for j, token in enumerate(trace.generated):
        assert token == greedy(a if j == 0 else b, tokens), f"token {j}"
        tokens.append(token)
    # the trace's rows are what each model computed where it ran
    with Model.open(a) as model_a:
        session = Session(model_a, max_context=64)
        session.prefill(prompt)
        rows_a = session.trace.copy()
    assert trace.array("expert_ids")[:4].tobytes() == rows_a.expert_ids.tobytes()
    with Model.open(b) as model_b:
        session = Session(model_b, max_context=64)
        session.prefill(tokens[:-1])
        rows_b = session.trace.copy()
    assert trace.array("router_logits")[4:].tobytes() == rows_b.router_logits[4:].tobytes()
    assert any("reloaded" in line and "at position 4" in line for line in lines)


def test_a_broken_replacement_is_refused_once_and_the_model_kept(
        models: tuple[Path, Path, Path]) -> None:
    live, a, _b = models
    hot = HotModel(live)
    lines: list[str] = []
    worker = EngineWorker(hot, log=lines.append)
    worker.start()
    try:
        replace_with(CORPUS / "bad_magic.colibri", live)   # noticed with no signal
        params = CompletionParams((1, 2, 3), 4, 0.0, 0, False)
        for _ in range(5):  # every request and token polls: the refusal is not retried
            trace = run_job(worker, params)
            assert trace.status == "finished" and trace.reloads == []
        health = worker.health()
    finally:
        worker.stop()
    assert health["status"] == "ok" and health["reload"]["generation"] == 0
    assert "COL_ERR_BAD_MAGIC at 0x0" in health["reload"]["refused"]
    assert sum("refused" in line for line in lines) == 1
    assert health["model"]["fingerprint"] == fingerprint(Model.open(a))


def test_a_request_whose_time_limit_passed_in_the_queue_is_refused(
        models: tuple[Path, Path, Path]) -> None:
    live, _a, _b = models
    worker = EngineWorker(HotModel(live), log=lambda line: None)
    worker.start()
    try:
        trace = run_job(worker, CompletionParams((1, 2), 3, 0.0, 0, False), deadline=0.0)
    finally:
        worker.stop()
    assert trace.status == "failed" and trace.error_status == 503
    assert "time limit passed while it waited in the queue" in (trace.error or "")
    assert trace.generated == []


def test_the_queue_is_bounded_and_shutdown_answers_what_waits(
        models: tuple[Path, Path, Path]) -> None:
    live, _a, _b = models
    worker = EngineWorker(HotModel(live), queue_size=2, log=lambda line: None)  # not started
    done: list[str] = []
    jobs = [Job(RequestTrace(f"cmpl-t-{i}", CompletionParams((1,), 1, 0.0, 0, False)),
                float("inf"), lambda kind, _d, i=i: done.append(f"{i} {kind}"))
            for i in range(3)]
    worker.submit(jobs[0])
    worker.submit(jobs[1])
    with pytest.raises(QueueFull, match="2 requests are waiting"):
        worker.submit(jobs[2])
    worker.stop()
    assert done == ["0 done", "1 done"]
    assert [j.trace.error_status for j in jobs[:2]] == [503, 503]
    assert "shutting down" in (jobs[0].trace.error or "")


# -- the store and the JSON of arrays -------------------------------------------------------------


def test_arrays_round_trip_through_json_bit_for_bit() -> None:
    values = np.array([[1.5, np.nan], [np.inf, -np.inf], [np.float32(0.1), -0.0]], np.float32)
    back = array_from_json(array_to_json(values), "float32", [2])
    assert back.tobytes() == values.tobytes()
    assert array_to_json(values)[1] == ["Infinity", "-Infinity"]
    ids = np.arange(6, dtype=np.int32).reshape(3, 2)
    assert array_from_json(array_to_json(ids), "int32", [2]).tobytes() == ids.tobytes()
    assert array_from_json([], "uint64", [4, 5]).shape == (0, 4, 5)
    with pytest.raises(ValueError, match="expected"):
        array_from_json([[1, 2, 3]], "int32", [2])


def test_the_store_evicts_the_least_recently_used_finished_traces() -> None:
    store = TraceStore(max_traces=2)
    traces = [RequestTrace(store.new_id(), CompletionParams((1,), 1, 0.0, 0, False))
              for _ in range(5)]
    store.add(traces[0])
    store.add(traces[1])
    traces[0].finish("length")
    traces[1].finish("length")
    store.get(traces[0].id)           # now the most recently used
    store.add(traces[2])              # evicts traces[1], the least recently used
    assert store.get(traces[0].id) is traces[0]
    with pytest.raises(TraceNotFound, match="was evicted"):
        store.get(traces[1].id)
    store.add(traces[3])              # evicts traces[0]: finished
    store.add(traces[4])              # over the bound, but queued or running traces stay
    assert [t["id"] for t in store.summaries()] == [t.id for t in traces[2:]]
    with pytest.raises(TraceNotFound, match="no trace cmpl-elsewhere-1 on this server"):
        store.get("cmpl-elsewhere-1")


def test_a_long_prompt_is_cancelled_between_its_pieces() -> None:
    """A prompt runs in engine calls of PROMPT_PIECE positions, and the cancel flag is read
    between them: a client that goes away during a long prompt's prefill stops it there."""
    demo = Path(__file__).resolve().parents[2] / "resources" / "demo" / "demo.colibri"
    jobs: list[Job] = []

    def on_event(kind: str, _data: Any) -> None:
        if kind == "progress" and jobs:   # after the first engine call
            jobs[0].cancel()

    worker = EngineWorker(HotModel(demo), log=lambda line: None, on_event=on_event)
    worker.start()
    prompt = tuple(3 + i % 1000 for i in range(3 * PROMPT_PIECE))
    trace = RequestTrace("cmpl-t-1", CompletionParams(prompt, 4, 0.0, 0, False))
    done = threading.Event()
    jobs.append(Job(trace, float("inf"), lambda kind, _d: done.set() if kind == "done" else None))
    worker.submit(jobs[0])
    try:
        assert done.wait(60)
    finally:
        worker.stop()
    assert trace.status == "cancelled" and trace.generated == []
    assert trace.n_positions == PROMPT_PIECE


def test_stopping_cancels_the_running_request() -> None:
    demo = Path(__file__).resolve().parents[2] / "resources" / "demo" / "demo.colibri"
    started = threading.Event()
    done = threading.Event()
    worker = EngineWorker(HotModel(demo), log=lambda line: None,
                          on_event=lambda kind, _d: started.set() if kind == "started" else None)
    worker.start()
    trace = RequestTrace("cmpl-t-1", CompletionParams((1, 2), 2046, 0.0, 0, False))
    worker.submit(Job(trace, float("inf"),
                      lambda kind, _d: done.set() if kind == "done" else None))
    assert started.wait(60)
    worker.stop()
    assert done.wait(10) and trace.status == "cancelled"
    assert len(trace.generated) < 2046
