"""`colibri serve` as a process: eight concurrent clients on loopback while the model file is
replaced and SIGUSR1 sent several times (a broken replacement among them) lose and corrupt
nothing: every response is what a fresh greedy run gives on the model it ran on, token by token
across a reload inside it; the pid file is written atomically and removed at exit; the stdin
mode keeps working; without the `serve` extra --http says how to install it."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from colibri.engine import Model, Session
from colibri.serving.client import parse_sse
from colibri.serving.worker import fingerprint

from server_helpers import RunningServer, post_json
from tiny_models import replace_with

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
CLIENTS = 8
VALID_RELOADS = 6


def stream_request(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A streamed completion, checked frame by frame, as the non-streamed body would be."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}))
        response = conn.getresponse()
        if response.status != 200:
            return response.status, json.loads(response.read())
        chunks = list(parse_sse(response))
    finally:
        conn.close()
    assert chunks[-1] == ("message", None), "the stream must end with data: [DONE]"
    final = chunks[-2][1]
    ids = [t for _kind, c in chunks[:-1] for t in c["choices"][0]["token_ids"]]
    assert ids == final["colibri"]["token_ids"], "streamed ids differ from the final chunk's"
    return 200, final


class Reference:
    """Fresh greedy runs on the two models, cached."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.models = {fp: Model.open(p) for fp, p in paths.items()}
        self.cache: dict[tuple[str, tuple[int, ...]], int] = {}

    def next_token(self, fp: str, tokens: list[int]) -> int:
        key = (fp, tuple(tokens))
        if key not in self.cache:
            session = Session(self.models[fp], max_context=64, trace=False)
            self.cache[key] = int(session.prefill(tokens, all_logits=False)[-1].argmax())
        return self.cache[key]

    def generate(self, fp: str, prompt: list[int], n: int) -> list[int]:
        key = (fp, (-1, n, *prompt))
        if key not in self.cache:
            session = Session(self.models[fp], max_context=64, trace=False)
            self.cache[key] = session.generate(prompt, n).generated  # type: ignore[assignment]
        return self.cache[key]  # type: ignore[return-value]


def test_eight_clients_and_reloads_lose_and_corrupt_nothing(
        serve: Callable[..., RunningServer], models: tuple[Path, Path, Path]) -> None:
    live, a, b = models
    server = serve(live, "--queue", "64")
    fps = {fingerprint(Model.open(a)): a, fingerprint(Model.open(b)): b}
    fp_a, fp_b = list(fps)
    results: list[tuple[list[int], int, int, dict[str, Any]]] = []
    failures: list[str] = []
    stop = threading.Event()

    def client(i: int) -> None:
        rng = np.random.default_rng(i)
        deadline = time.monotonic() + 240
        count = 0
        while (not stop.is_set() or count < 4) and count < 400 and time.monotonic() < deadline:
            prompt = rng.integers(0, 50, size=int(rng.integers(1, 12))).tolist()
            n = int(rng.integers(1, 24))
            body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
            try:
                status, doc = (stream_request(server.port, body) if count % 3 == 0
                               else post_json(server.port, "/v1/completions", body))
            except Exception as exc:  # noqa: BLE001 - every failure is reported below
                failures.append(f"client {i}: {type(exc).__name__}: {exc}")
                return
            results.append((prompt, n, status, doc))
            count += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    written = a
    try:
        for k in range(VALID_RELOADS):
            time.sleep(0.3)
            written = b if written == a else a
            replace_with(written, live)
            server.signal(signal.SIGUSR1)
            if k == 2:  # a broken replacement in between: refused, the loaded model kept
                time.sleep(0.3)
                replace_with(CORPUS / "bad_magic.colibri", live)
                server.signal(signal.SIGUSR1)
                deadline = time.monotonic() + 60
                while server.client.health()["reload"]["refused"] is None:
                    assert time.monotonic() < deadline, "the broken file was not refused"
                    time.sleep(0.02)
                # the model stays what was loaded before it
                assert server.client.health()["model"]["fingerprint"] == fingerprint(
                    Model.open(written))
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(300)
    assert not failures, failures[:3]
    health = server.client.health()
    assert health["status"] == "ok" and health["model"]["fingerprint"] == fingerprint(
        Model.open(written))
    # each replace is noticed between tokens, and each signal asks again: one or two reloads
    assert 1 <= health["reload"]["generation"] <= 2 * VALID_RELOADS
    assert "refused" in server.log() and "COL_ERR_BAD_MAGIC" in server.log()

    ref = Reference(fps)
    seen = {fp_a: 0, fp_b: 0}
    inside = 0
    assert len(results) >= CLIENTS * 4
    for prompt, n, status, doc in results:
        assert status == 200, doc
        extra = doc["colibri"]
        generated = extra["token_ids"]
        assert extra["prompt_token_ids"] == prompt and len(generated) == n
        assert doc["choices"][0]["finish_reason"] == "length"
        start_fp = extra["model"]["fingerprint"]
        seen[start_fp] += 1
        if not extra["reloads"]:
            assert generated == ref.generate(start_fp, prompt, n), (start_fp, prompt)
            continue
        inside += 1  # a reload inside the request: each token from the model it ran on
        segments = [(0, start_fp)] + [(r["position"], r["fingerprint"]) for r in extra["reloads"]]
        tokens = list(prompt)
        for j, token in enumerate(generated):
            chosen_at = len(prompt) - 1 + j
            fp = [f for position, f in segments if position <= chosen_at][-1]
            assert token == ref.next_token(fp, tokens), (segments, j)
            tokens.append(token)
    assert seen[fp_a] and seen[fp_b], seen
    # traces of the last requests: complete and consistent with their responses
    for _prompt, n, _status, doc in results[-CLIENTS:]:
        trace = server.client.trace(doc["id"])
        assert trace["status"] == "finished" and trace["generated"] == doc["colibri"]["token_ids"]
        assert trace["n_positions"] == len(trace["request"]["prompt"]) + n - 1
        assert len(trace["positions"]["expert_ids"]) == trace["n_positions"]
    print(f"{len(results)} requests, {inside} with a reload inside, "
          f"{health['reload']['generation']} reloads")


def test_pid_file_is_written_and_removed_at_exit(serve: Callable[..., RunningServer],
                                                 models: tuple[Path, Path, Path],
                                                 tmp_path: Path) -> None:
    live, _a, _b = models
    pid_path = tmp_path / "run" / "colibri.pid"
    pid_path.parent.mkdir()
    server = serve(live, "--pid-file", str(pid_path))
    assert pid_path.read_text() == f"{server.proc.pid}\n"
    assert [p.name for p in pid_path.parent.iterdir()] == ["colibri.pid"]  # no temporary left
    # a second server refuses the file of a live one
    second = subprocess.run([sys.executable, "-m", "colibri.cli", "serve", str(live), "--http",
                             "127.0.0.1:0", "--pid-file", str(pid_path)],
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 1
    assert f"names process {server.proc.pid}, which is running" in second.stderr
    assert pid_path.read_text() == f"{server.proc.pid}\n"
    assert server.stop() == 0  # SIGTERM: a graceful exit
    assert not pid_path.exists()


def test_stdin_mode_serves_and_removes_its_pid_file(models: tuple[Path, Path, Path],
                                                    tmp_path: Path) -> None:
    live, a, _b = models
    pid_path = tmp_path / "stdin.pid"
    out = subprocess.run([sys.executable, "-m", "colibri.cli", "serve", str(live), "-n", "4",
                          "--pid-file", str(pid_path)], input="1,2,3\n\n4,5\n",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    with Model.open(a) as model:
        want = [Session(model, max_context=8).generate(p, 4).generated
                for p in ([1, 2, 3], [4, 5])]
    assert out.stdout.splitlines() == ["tokens: " + ",".join(map(str, w)) for w in want]
    assert not pid_path.exists()


def test_stdin_mode_exits_cleanly_on_sigterm(models: tuple[Path, Path, Path],
                                             tmp_path: Path) -> None:
    live, _a, _b = models
    pid_path = tmp_path / "stdin.pid"
    proc = subprocess.Popen([sys.executable, "-m", "colibri.cli", "serve", str(live),
                             "--pid-file", str(pid_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None and "serving" in proc.stderr.readline()
        assert pid_path.read_text().strip() == str(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert not pid_path.exists()
    finally:
        proc.kill()
        proc.wait()


def test_http_without_the_serve_extra_names_the_install_command(
        models: tuple[Path, Path, Path]) -> None:
    live, _a, _b = models
    code = ("import sys, importlib.util\n"
            "real = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda n, *a: None if n in ('starlette', 'uvicorn') "
            "else real(n, *a)\n"
            "from colibri.cli import main\n"
            f"sys.exit(main(['serve', {str(live)!r}, '--http', '127.0.0.1:0']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1
    assert "pip install 'colibri-moe[serve]'" in out.stderr


def test_a_bad_address_or_a_port_in_use_is_a_clear_error(
        serve: Callable[..., RunningServer], models: tuple[Path, Path, Path]) -> None:
    live, _a, _b = models
    running = serve(live)
    busy = subprocess.run([sys.executable, "-m", "colibri.cli", "serve", str(live), "--http",
                           running.address], capture_output=True, text=True, timeout=120)
    assert busy.returncode == 1 and f"cannot listen on {running.address}" in busy.stderr
    bad = subprocess.run([sys.executable, "-m", "colibri.cli", "serve", str(live), "--http",
                          "localhost"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "expected HOST:PORT" in bad.stderr
