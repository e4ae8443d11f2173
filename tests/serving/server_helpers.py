"""A real `colibri serve --http` in a subprocess on loopback, for the server and attach tests.

`start_server(path, *args)` starts one on a free port (--http 127.0.0.1:0; the port is read from
its first log line) with its log in a file, and returns a `RunningServer`: its process, address,
a `ServerClient`, the log, and `stop()` (SIGTERM, then the exit code). Raw HTTP for tests that
look at bytes: `raw_request`. `MODEL`: the tiny_model options of the model the server tests serve.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from colibri.serving.client import ServerClient

# The served model: two MoE layers of 4 experts, top-2, a word-level tokenizer, a context of 64
# (tiny_models). Here, not in conftest.py: `from conftest import` finds whichever conftest.py
# was loaded first.
MODEL = dict(n_layers=2, n_experts=4, top_k=2)
START_TIMEOUT_S = 60
_ADDRESS = re.compile(r"on http://127\.0\.0\.1:(\d+) ")


@dataclass
class RunningServer:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def client(self) -> ServerClient:
        return ServerClient("127.0.0.1", self.port, timeout=60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the server did not stop on SIGTERM:\n{self.log()}") from None


def start_server(path: Path | str, *args: str, log_dir: Path) -> RunningServer:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"serve-{time.monotonic_ns()}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "colibri.cli", "serve", str(path), "--http", "127.0.0.1:0",
             *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = _ADDRESS.search(log_path.read_text(errors="replace"))
        if found:
            return RunningServer(proc, int(found.group(1)), log_path)
        if proc.poll() is not None:
            raise AssertionError(f"colibri serve exited {proc.returncode}:\n"
                                 f"{log_path.read_text(errors='replace')}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"colibri serve did not start:\n{log_path.read_text(errors='replace')}")


def raw_request(port: int, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body bytes) of one request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return (response.status, {k.lower(): v for k, v in response.getheaders()},
                response.read())
    finally:
        conn.close()


def post_json(port: int, path: str, doc: Any) -> tuple[int, Any]:
    status, _headers, body = raw_request(port, "POST", path, json.dumps(doc).encode(),
                                         {"Content-Type": "application/json"})
    return status, json.loads(body)
