#!/usr/bin/env python3
"""What serving costs: the engine thread's work per token, and HTTP's per request.

Three measurements on the same greedy requests:
  direct / worker  in this process, interleaved repeat by repeat (drift in the machine's load
                   hits both alike): `Session.generate` on a traced session, against
                   `colibri.serving.worker.EngineWorker` running the same requests (what it adds:
                   the per-position trace copies and token texts, the streamed text, progress
                   events, the reload poll between tokens). Tokens per second and the ratio
                   (of medians, and the median of per-repeat ratios).
  http             one client against `colibri serve --http` on loopback: each request's wall
                   time less the server's own time for it (queue + prefill + decode, from the
                   response) is what HTTP, JSON and the hand-over between threads cost. Comparing
                   tokens per second across processes is avoided on purpose: on a loaded machine
                   a process that sleeps between requests is scheduled differently from one
                   that never sleeps.
  http x C         C clients at once against the same server: the throughput relative to one
                   client (the engine runs one request at a time; above 1 means the queue keeps
                   it busy while HTTP work overlaps).

    python tools/bench_serve.py [--model FILE] [--requests 16] [--prompt-tokens 32]
                                [--new 64] [--clients 8] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "resources" / "demo" / "demo.colibri"


def start_server(model: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "colibri.cli", "serve", str(model),
                                 "--http", "127.0.0.1:0", "--queue", "256"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=out,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"127\.0\.0\.1:(\d+)", log.read_text())
        if found:
            return proc, int(found.group(1))
        if proc.poll() is not None:
            raise SystemExit(f"colibri serve failed:\n{log.read_text()}")
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("colibri serve did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEMO)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import numpy as np

    from colibri.engine import Model, Session
    from colibri.reload import HotModel
    from colibri.serving.client import ServerClient
    from colibri.serving.traces import CompletionParams, RequestTrace
    from colibri.serving.worker import EngineWorker, Job

    rng = np.random.default_rng(0)
    model = Model.open(args.model)
    prompts = [rng.integers(0, model.hparams.vocab_size, args.prompt_tokens).tolist()
               for _ in range(args.requests)]
    context = args.prompt_tokens + args.new
    session = Session(model, max_context=context, trace=True)
    worker = EngineWorker(HotModel(args.model, model), context=context, log=lambda line: None)
    worker.start()
    counts: dict[str, list[int]] = {"direct": [], "worker": []}

    def direct() -> float:
        t0 = time.perf_counter()
        for p in prompts:
            session.reset()
            counts["direct"].append(len(session.generate(p, args.new).generated))
        return time.perf_counter() - t0

    def in_worker() -> float:
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            done = threading.Event()
            trace = RequestTrace(f"bench-{i}", CompletionParams(tuple(p), args.new, 0.0, 0,
                                                                False))
            worker.submit(Job(trace, float("inf"),
                              lambda kind, _d, done=done: kind == "done" and done.set()))
            done.wait()
            counts["worker"].append(len(trace.generated))
        return time.perf_counter() - t0

    direct(), in_worker()  # warm both
    if counts["direct"] != counts["worker"]:
        raise SystemExit("the worker and the direct run generated different token counts")
    tokens = sum(counts["direct"][:args.requests])
    rates: dict[str, list[float]] = {"direct": [], "worker": []}
    for _ in range(args.repeats):
        rates["direct"].append(tokens / direct())
        rates["worker"].append(tokens / in_worker())
    worker.stop()

    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(args.model, Path(tmp) / "serve.log")
        client = ServerClient("127.0.0.1", port, timeout=600)
        overhead_ms: list[float] = []

        def one(p: list[int]) -> None:
            t0 = time.perf_counter_ns()
            body = client.complete(p, max_tokens=args.new, temperature=0)
            wall = time.perf_counter_ns() - t0
            t = body["colibri"]["timings"]
            overhead_ms.append((wall - t["queue_ns"] - t["prefill_ns"] - t["decode_ns"]) / 1e6)

        def sequential() -> float:
            t0 = time.perf_counter()
            for p in prompts:
                one(p)
            return time.perf_counter() - t0

        def concurrent() -> float:
            todo = list(prompts)
            lock = threading.Lock()

            def run() -> None:
                while True:
                    with lock:
                        if not todo:
                            return
                        p = todo.pop()
                    one(p)

            threads = [threading.Thread(target=run) for _ in range(args.clients)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return time.perf_counter() - t0

        try:
            sequential()  # warm
            overhead_ms.clear()
            gain = []
            for _ in range(args.repeats):
                alone = sequential()
                kept = len(overhead_ms)
                together = concurrent()
                del overhead_ms[kept:]  # concurrent requests also wait on each other's HTTP
                gain.append(alone / together)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)

    base = statistics.median(rates["direct"])
    print(f"{args.model.name}: {args.requests} requests of {args.prompt_tokens} prompt + up to "
          f"{args.new} new tokens ({tokens} generated), {args.repeats} repeats, "
          f"{session.kernels} kernels")
    print(f"{'in process':<12} {'tok/s':>9} {'ratio':>7} {'paired':>7}")
    for name, values in rates.items():
        paired = statistics.median(v / d for v, d in zip(values, rates["direct"]))
        print(f"{name:<12} {statistics.median(values):>9.1f} "
              f"{statistics.median(values) / base:>7.3f} {paired:>7.3f}")
    print(f"http, one client: {statistics.median(overhead_ms):.2f} ms per request beyond the "
          f"server's own time (p90 {np.percentile(overhead_ms, 90):.2f} ms, "
          f"{len(overhead_ms)} requests)")
    print(f"http x {args.clients} clients: throughput {statistics.median(gain):.3f}x one client's "
          f"(median of {args.repeats} paired repeats)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
