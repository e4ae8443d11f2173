"""`colibri serve --http` on loopback: the OpenAI completion shape, token-id prompts, streaming
framing, traces by id (the engine's own routing, bit for bit), tokenize, health, and the bounds:
every bad request is a 4xx JSON error naming its field, bodies and queues are bounded, traces
are evicted with a clear 404, a request's time limit stops it, and a client that goes away
cancels its request."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from colibri.engine import Model, Session, Trace
from colibri.serving.client import ServerClient, parse_sse
from colibri.serving.traces import array_from_json
from colibri.tokens import token_text

from server_helpers import MODEL, RunningServer, post_json, raw_request, start_server
from tiny_models import live_copy, replace_with

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "resources" / "demo" / "demo.colibri"
PROMPT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def model_path(tiny_model_path: Callable[..., Path]) -> Path:
    return tiny_model_path("mixtral", **MODEL)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[RunningServer]:
    """One server for the tests that only add requests to it."""
    running = start_server(model_path, log_dir=tmp_path_factory.mktemp("logs"))
    yield running
    assert running.stop() == 0


def local_run(path: Path, prompt: list[int], n: int) -> tuple[list[int], Trace]:
    """What a fresh greedy run on `path` gives: its tokens and its trace."""
    with Model.open(path) as model:
        session = Session(model, max_context=len(prompt) + n)
        generated = session.generate(prompt, n).generated
        trace = session.trace
        assert trace is not None
        return generated, trace.copy()


def encode(path: Path, text: str) -> list[int]:
    with Model.open(path) as model:
        return list(model.tokenizer.encode(text).ids)


# -- completions ----------------------------------------------------------------------------------


def test_completion_has_the_openai_shape_and_the_greedy_tokens(server: RunningServer,
                                                                model_path: Path) -> None:
    status, body = post_json(server.port, "/v1/completions",
                             {"prompt": PROMPT, "max_tokens": 7, "temperature": 0,
                              "model": "anything"})
    assert status == 200, body
    prompt = encode(model_path, PROMPT)
    want, _ = local_run(model_path, prompt, 7)
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["model"] == model_path.name and isinstance(body["created"], int)
    [choice] = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["logprobs"] is None
    with Model.open(model_path) as model:
        assert choice["text"] == model.tokenizer.decode(want)
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 7,
                             "total_tokens": len(prompt) + 7}
    extra = body["colibri"]
    assert extra["prompt_token_ids"] == prompt and extra["token_ids"] == want
    assert extra["trace"] == f"/v1/traces/{body['id']}" and extra["reloads"] == []
    assert extra["model"]["generation"] == 0 and extra["model"]["context"] == 64


def test_token_id_prompt_equals_the_text_prompt(server: RunningServer, model_path: Path) -> None:
    tokens = server.client.tokenize(PROMPT)
    assert tokens["tokens"] == encode(model_path, PROMPT)
    assert tokens["pieces"] == PROMPT.split() and tokens["count"] == 6
    by_text = server.client.complete(PROMPT, max_tokens=5, temperature=0)
    by_ids = server.client.complete(tokens["tokens"], max_tokens=5, temperature=0)
    assert by_ids["colibri"]["token_ids"] == by_text["colibri"]["token_ids"]
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]


def test_sampling_is_reproducible_by_seed(server: RunningServer) -> None:
    def sample(seed: int) -> list[int]:
        return server.client.complete([3, 4, 5], max_tokens=12, temperature=1.5,
                                      seed=seed)["colibri"]["token_ids"]

    assert sample(7) == sample(7)
    assert len({tuple(sample(s)) for s in range(6)}) > 1
    unseeded = server.client.complete([3, 4, 5], max_tokens=3, temperature=1.0)
    assert isinstance(unseeded["colibri"]["seed"], int)  # drawn, and recorded for a replay


def test_stream_is_server_sent_events_ending_in_done(server: RunningServer) -> None:
    status, headers, raw = raw_request(
        server.port, "POST", "/v1/completions",
        json.dumps({"prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                    "stream": True}).encode())
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n")
    frames = text.split("\n\n")[:-1]
    assert all(f.startswith("data: ") and "\n" not in f for f in frames)
    chunks = [json.loads(f[6:]) for f in frames[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + [
        "length"]
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    whole = server.client.complete(PROMPT, max_tokens=6, temperature=0)
    assert ids == whole["colibri"]["token_ids"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert len({c["id"] for c in chunks}) == 1


# -- traces ---------------------------------------------------------------------------------------


def test_trace_by_id_is_the_engines_routing(server: RunningServer, model_path: Path) -> None:
    prompt = [5, 9, 2, 7]
    body = server.client.complete(prompt, max_tokens=6, temperature=0)
    doc = server.client.trace(body["id"])
    want_tokens, want = local_run(model_path, prompt, 6)
    assert doc["status"] == "finished" and doc["generated"] == want_tokens
    assert doc["n_positions"] == len(prompt) + 6 - 1 == want.n_positions
    assert doc["moe_layers"] == want.moe_layers.tolist()
    for name in Trace.position_fields():  # every engine array, none listed by hand
        got = array_from_json(doc["positions"][name], doc["dtypes"][name], doc["shapes"][name])
        if name in ("phase_ns", "token_ns"):
            assert got.shape == getattr(want, name).shape and (got > 0).any()
        else:
            assert got.tobytes() == getattr(want, name).tobytes(), name
    with Model.open(model_path) as model:
        texts = [token_text(model.tokenizer, t) for t in want.tokens]
    assert doc["positions"]["token_texts"] == texts and texts[:2] == ["sat", "dog"]
    assert len(doc["positions"]["wall_ns"]) == doc["n_positions"]
    assert all(doc["positions"]["logits_finite"])
    # the rows from a position on: what a client following a running request fetches
    tail = server.client.trace(body["id"], start=7)
    assert tail["start"] == 7 and len(tail["positions"]["expert_ids"]) == 2
    assert tail["positions"]["expert_ids"] == doc["positions"]["expert_ids"][7:]
    [listed] = [t for t in server.client.traces() if t["id"] == body["id"]]
    assert listed["completion_tokens"] == 6 and listed["n_positions"] == 9


def test_non_finite_values_are_json_strings(server: RunningServer) -> None:
    body = server.client.complete([1, 2], max_tokens=1, temperature=0)
    status, _headers, raw = raw_request(server.port, "GET", f"/v1/traces/{body['id']}")
    assert status == 200 and b"NaN" in raw  # mixtral has no shared-expert gate: NaN
    doc = json.loads(raw, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON"))
    gate = array_from_json(doc["positions"]["shared_gate"], "float32", [2])
    assert np.isnan(gate).all()


def test_evicted_and_unknown_traces_are_404_with_a_reason(serve: Callable[..., RunningServer],
                                                          model_path: Path) -> None:
    server = serve(model_path, "--traces", "2")
    ids = [server.client.complete([1, 2, 3], max_tokens=2, temperature=0)["id"] for _ in range(3)]
    server.client.trace(ids[2])
    status, _h, raw = raw_request(server.port, "GET", f"/v1/traces/{ids[0]}")
    body = json.loads(raw)
    assert status == 404 and "was evicted" in body["error"]["message"]
    assert "--traces" in body["error"]["message"] and body["error"]["param"] == "id"
    status, _h, raw = raw_request(server.port, "GET", "/v1/traces/cmpl-0000-1")
    assert status == 404 and "no trace cmpl-0000-1" in json.loads(raw)["error"]["message"]
    assert [t["id"] for t in server.client.traces()] == ids[1:]


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, param, words", [
    ({"prompt": "the", "max_tokens": -1}, "max_tokens", "max_tokens must be an int >= 0"),
    ({"prompt": "the", "max_tokens": 1.5}, "max_tokens", "max_tokens must be an int"),
    ({"prompt": "the", "temperature": "hot"}, "temperature", "finite number >= 0"),
    ({"prompt": "the", "temperature": -1}, "temperature", "finite number >= 0"),
    ({"prompt": [1, 2, 999]}, "prompt", "prompt[2]: token id 999 outside the vocabulary [0, 50)"),
    ({"prompt": [1, "x"]}, "prompt", "prompt[1] must be a token id"),
    ({"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
    ({"prompt": []}, "prompt", "prompt is empty"),
    ({"prompt": 5}, "prompt", "a string or a list of token ids"),
    ({}, "prompt", "prompt is required"),
    ({"prompt": [1] * 65}, "prompt", "the prompt has 65 tokens; the context"),
    ({"prompt": [1] * 10, "max_tokens": 60}, "max_tokens", "need 69 positions; the context"),
    ({"prompt": "the", "n": 2}, "n", "n is not supported"),
    ({"prompt": "the", "stop": ["\n"]}, "stop", "stop is not supported"),
    ({"prompt": "the", "top_p": 0.5}, "top_p", "top_p is not supported"),
    ({"prompt": "the", "seed": -3}, "seed", "seed must be an int in [0, 2^63)"),
    ({"prompt": "the", "stream": "yes"}, "stream", "stream must be true or false"),
    ({"prompt": "the", "frobnicate": 1}, "frobnicate", "unknown field 'frobnicate'"),
])
def test_bad_requests_name_the_field(server: RunningServer, body: dict[str, Any], param: str,
                                     words: str) -> None:
    status, doc = post_json(server.port, "/v1/completions", body)
    assert status == 400, doc
    assert doc["error"]["param"] == param and words in doc["error"]["message"]
    assert doc["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("method, path, body, status, words", [
    ("POST", "/v1/completions", b"{not json", 400, "not valid JSON"),
    ("POST", "/v1/completions", b"[1, 2]", 400, "must be a JSON object"),
    ("POST", "/v1/completions", b"[" * 100000 + b"]" * 100000, 400, "not valid JSON"),
    ("GET", "/v1/completions", None, 405, "Method Not Allowed"),
    ("GET", "/nowhere", None, 404, "Not Found"),
    ("GET", "/v1/traces/x?start=-1", None, 400, "start must be a position"),
    ("POST", "/tokenize", b'{"text": "a"}', 400, "unknown field 'text'"),
])
def test_malformed_requests_get_json_errors(server: RunningServer, method: str, path: str,
                                            body: bytes | None, status: int, words: str) -> None:
    got, headers, raw = raw_request(server.port, method, path, body)
    assert got == status and headers["content-type"] == "application/json"
    assert words in json.loads(raw)["error"]["message"]


def test_text_prompt_needs_a_tokenizer(serve: Callable[..., RunningServer],
                                       tiny_model_path: Callable[..., Path]) -> None:
    server = serve(tiny_model_path("mixtral", with_tokenizer=False, **MODEL))
    status, doc = post_json(server.port, "/v1/completions", {"prompt": "the cat"})
    assert status == 400 and doc["error"]["param"] == "prompt"
    assert "has no tokenizer: send the prompt as a list of token ids" in doc["error"]["message"]
    ok = server.client.complete([1, 2], max_tokens=3, temperature=0)
    assert ok["choices"][0]["text"] == "" and len(ok["colibri"]["token_ids"]) == 3


def test_request_body_is_bounded(serve: Callable[..., RunningServer], model_path: Path) -> None:
    server = serve(model_path, "--max-body", "1000")
    big = json.dumps({"prompt": "the " * 400}).encode()
    status, _h, raw = raw_request(server.port, "POST", "/v1/completions", big)
    assert status == 413
    assert "exceeds the limit of 1000 bytes (--max-body)" in json.loads(raw)["error"]["message"]
    # chunked, with no length declared: counted as it arrives
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=iter([big[:600], big[600:]]),
                 encode_chunked=True)
    assert conn.getresponse().status == 413
    conn.close()
    assert server.client.complete([1], max_tokens=1)["usage"]["completion_tokens"] == 1


# -- health ---------------------------------------------------------------------------------------


def test_health_and_models(server: RunningServer, model_path: Path) -> None:
    health = server.client.health()
    assert health["status"] == "ok" and health["pid"] == server.proc.pid
    assert health["model"]["name"] == model_path.name and health["model"]["context"] == 64
    assert health["queue"] == {"waiting": 0, "capacity": 32}
    assert health["reload"] == {"generation": 0, "last": None, "refused": None}
    server.client.complete([1, 2], max_tokens=2)
    assert server.client.health()["served"] == health["served"] + 1
    models = server.client.request("GET", "/v1/models")
    assert [m["id"] for m in models["data"]] == [model_path.name]


# -- load bounds (the demo model: slow enough to keep the engine busy) -----------------------------


def _complete_in_thread(client: ServerClient, results: list[Any], **fields: Any) -> threading.Thread:
    def run() -> None:
        status, doc = post_json(client.port, "/v1/completions", fields)
        results.append((status, doc))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_until(predicate: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_full_queue_is_503(serve: Callable[..., RunningServer]) -> None:
    server = serve(DEMO, "--queue", "1")
    client = server.client
    results: list[Any] = []
    first = _complete_in_thread(client, results, prompt="import os", max_tokens=2046,
                                temperature=0)   # a second or more of engine work
    _wait_until(lambda: client.health()["running"] is not None)
    second = _complete_in_thread(client, results, prompt="def", max_tokens=4, temperature=0)
    _wait_until(lambda: client.health()["queue"]["waiting"] == 1)
    status, headers, raw = raw_request(server.port, "POST", "/v1/completions",
                                       b'{"prompt": "x", "max_tokens": 1}')
    assert status == 503 and headers["retry-after"] == "1"
    error = json.loads(raw)["error"]
    assert "1 requests are waiting (--queue)" in error["message"]
    assert error["type"] == "server_busy"
    first.join(120)
    second.join(120)
    assert sorted(doc["usage"]["completion_tokens"] for _status, doc in results) == [4, 2046]


def test_a_time_limit_stops_a_request_keeping_its_tokens(
        serve: Callable[..., RunningServer]) -> None:
    server = serve(DEMO, "--timeout", "0.3")
    doc = server.client.complete("import os", max_tokens=2046, temperature=0)
    assert doc["choices"][0]["finish_reason"] == "time_limit"
    assert 0 < doc["usage"]["completion_tokens"] < 2046
    assert 0.3e9 <= doc["colibri"]["timings"]["total_ns"] < 5e9
    trace = server.client.trace(doc["id"])
    assert trace["status"] == "finished" and trace["finish_reason"] == "time_limit"
    assert trace["n_positions"] == 2 + doc["usage"]["completion_tokens"] - 1


def test_a_client_that_goes_away_cancels_its_request(serve: Callable[..., RunningServer]) -> None:
    server = serve(DEMO)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "import os", "max_tokens": 2000, "temperature": 0, "stream": True}))
    response = conn.getresponse()
    events = parse_sse(response)
    _kind, first = next(events)
    trace_id = first["id"]
    conn.sock.shutdown(2)
    conn.close()
    _wait_until(lambda: server.client.trace(trace_id)["status"] != "running")
    doc = server.client.trace(trace_id)
    assert doc["status"] == "cancelled" and doc["finish_reason"] == "cancelled"
    assert 0 < len(doc["generated"]) < 2000
    assert server.client.health()["running"] is None


def test_a_model_changed_in_place_is_503_until_a_valid_file_returns(
        serve: Callable[..., RunningServer], model_path: Path, tmp_path: Path) -> None:
    live = live_copy(model_path, tmp_path)
    server = serve(live)
    assert server.client.complete([1, 2], max_tokens=2)["usage"]["completion_tokens"] == 2
    os.truncate(live, 1000)  # rewritten in place: the mapping cannot be trusted any more
    _wait_until(lambda: server.client.health()["status"] == "error")
    status, _h, raw = raw_request(server.port, "GET", "/health")
    health = json.loads(raw)
    assert status == 503 and "changed while mapped and cannot be reopened" in health["error"]
    status, doc = post_json(server.port, "/v1/completions", {"prompt": [1, 2]})
    assert status == 503 and "the model cannot be served" in doc["error"]["message"]
    replace_with(model_path, live)  # a valid file again: taken without a signal
    _wait_until(lambda: server.client.health()["status"] == "ok")
    assert server.client.health()["reload"]["generation"] == 1
    assert server.client.complete([1, 2], max_tokens=2)["usage"]["completion_tokens"] == 2
