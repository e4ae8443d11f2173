"""`colibri serve`: a long-running engine for one model file, on stdin or over HTTP.

Without --http: one prompt per stdin line (comma-separated token ids), -n tokens each, one
`tokens: ...` line out per prompt. With --http HOST:PORT: the HTTP API of colibri.serving (OpenAI
completions with routing traces, tokenize, health), which needs the `serve` extra.

Both modes hot-reload: `kill -USR1 PID` after an atomic replace of FILE (or a replace noticed
between tokens) swaps the new model in between requests or tokens once it validates; a broken
replacement is refused and the loaded model kept (colibri.reload). --pid-file writes the
process id atomically at start and removes the file at exit (SIGINT or SIGTERM included).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from types import FrameType
from typing import Any

from colibri.cli.common import (EXIT_OK, add_file, add_generate, add_routing, add_threads, error,
                                fail, open_model, token_ids)
from colibri.files import atomic_write_bytes

SERVE_EPILOG = """\
HTTP API (--http): POST /v1/completions (OpenAI shape; "prompt" as text or token ids,
max_tokens, temperature, seed, stream), GET /v1/traces/{id} (the routing trace of a response's
id), GET /v1/traces, GET /v1/events (server-sent events), POST /tokenize, GET /health,
GET /v1/models. Requests run one at a time, in arrival order, on one engine session. See
docs/serving.md."""

INSTALL_HINT = "colibri serve --http needs the 'serve' extra: pip install 'colibri-moe[serve]'"


@contextmanager
def pid_file(path: str | None) -> Iterator[None]:
    """Write this process's id to `path` (atomically) for the duration; remove it after, unless
    another process has written its own id there since. Refuses a file naming a live process."""
    if path is None:
        yield
        return
    other = _pid_in(path)
    if other is not None and other != os.getpid() and _alive(other):
        fail(f"{path} names process {other}, which is running: stop it or remove the file")
    atomic_write_bytes(path, f"{os.getpid()}\n".encode())
    try:
        yield
    finally:
        if _pid_in(path) == os.getpid():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _pid_in(path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            text = f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _exit_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(EXIT_OK)


def http_address(text: str) -> tuple[str, int]:
    """argparse type of --http: HOST:PORT, [IPv6]:PORT or :PORT (loopback); port 0 picks one."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:8080), got {text!r}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def cmd_serve(args: argparse.Namespace) -> int:
    if args.http is not None:
        return serve_http(args)
    return serve_stdin(args)


def serve_stdin(args: argparse.Namespace) -> int:
    """One prompt per stdin line (token ids), greedy generation of -n tokens, `tokens: ...` out."""
    from colibri.engine import Session
    from colibri.generation import History
    from colibri.reload import HotModel, on_sigusr1, session_swapper

    model = open_model(args.file)
    hot = HotModel(args.file, model)

    def new_session(m: Any) -> Any:
        return Session(m, routing=args.routing, epsilon=args.epsilon, seed=args.seed,
                       threads=args.threads, trace=False)

    swap = session_swapper(hot, new_session, error)
    with pid_file(args.pid_file):
        restore = on_sigusr1(hot)
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            session = new_session(model)
            print(f"serving {args.file} (pid {os.getpid()})", file=sys.stderr, flush=True)
            for line in sys.stdin:
                if not line.strip():
                    continue
                try:
                    prompt = token_ids(line.strip())
                    session = swap(session, History(), False) or session
                    session.reset()
                    generation = session.generate(prompt, args.generate,
                                                  eos=hot.model.hparams.eos_token_id, swap=swap)
                    session = generation.session
                except (argparse.ArgumentTypeError, ValueError) as exc:
                    error(str(exc))
                    continue
                print("tokens: " + ",".join(map(str, generation.generated)), flush=True)
        finally:
            signal.signal(signal.SIGTERM, previous)
            restore()
    return EXIT_OK


def serve_http(args: argparse.Namespace) -> int:
    if find_spec("starlette") is None or find_spec("uvicorn") is None:
        fail(INSTALL_HINT)
    from colibri.reload import HotModel, on_sigusr1
    from colibri.serving.http import Limits, bind, serve
    from colibri.serving.traces import TraceStore
    from colibri.serving.worker import EngineWorker

    for name in ("context", "queue", "traces", "max_body"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.timeout > 0 or args.trace_memory < 1:
        fail("--timeout must be > 0 and --trace-memory >= 1")
    model = open_model(args.file)
    hot = HotModel(args.file, model)
    worker = EngineWorker(hot, routing=args.routing, epsilon=args.epsilon, seed=args.seed,
                          threads=args.threads, context=args.context, queue_size=args.queue,
                          log=error)
    store = TraceStore(args.traces, args.trace_memory << 20)
    host, port = args.http
    try:
        sock = bind(host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    with pid_file(args.pid_file):
        restore = on_sigusr1(hot)
        try:
            bound_host, bound_port = sock.getsockname()[:2]
            shown = f"[{bound_host}]" if ":" in bound_host else bound_host
            print(f"serving {args.file} on http://{shown}:{bound_port} (pid {os.getpid()}, "
                  f"context {worker.serving.context}, {worker.kernels} kernels)",
                  file=sys.stderr, flush=True)
            started = serve(worker, store, sock, Limits(args.max_body, args.timeout))
        finally:
            restore()
            sock.close()
    if not started:
        fail("the HTTP server did not start")
    return EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve a model: prompts from stdin (token ids per line), "
                                     "or an HTTP API with --http; SIGUSR1 hot-reloads FILE",
                       epilog=SERVE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_file(p)
    add_generate(p, 16, "tokens per prompt (stdin mode)")
    add_routing(p, seed="Gumbel routing seed")
    add_threads(p)
    p.add_argument("--pid-file", metavar="PATH",
                   help="write the process id here (atomically); removed at exit")
    http = p.add_argument_group("HTTP")
    http.add_argument("--http", type=http_address, metavar="HOST:PORT",
                      help="serve the HTTP API here (port 0: any free port, printed at start)")
    http.add_argument("--context", type=int, default=4096, metavar="N",
                      help="positions a request may use, at most the model's (default 4096)")
    http.add_argument("--queue", type=int, default=32, metavar="N",
                      help="requests waiting for the engine before 503 (default 32)")
    http.add_argument("--timeout", type=float, default=120.0, metavar="S",
                      help="time limit of a request from arrival, queue included (default 120)")
    http.add_argument("--max-body", type=int, default=1 << 20, metavar="BYTES",
                      help="largest request body (default 1 MiB)")
    http.add_argument("--traces", type=int, default=256, metavar="N",
                      help="routing traces kept, least recently used evicted (default 256)")
    http.add_argument("--trace-memory", type=int, default=256, metavar="MIB",
                      help="memory of kept traces (default 256 MiB)")
    p.set_defaults(func=cmd_serve)


__all__ = ["add_commands", "cmd_serve", "http_address", "pid_file"]
