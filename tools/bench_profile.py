#!/usr/bin/env python3
"""Throughput of `colibri profile` against `colibri bench`'s prefill, in the same run.

    .venv/bin/python tools/bench_profile.py [--model FILE] [--threads 1,2] [--rounds 1]

The dataset is this repository's own Python sources (every tracked-looking *.py outside .venv and
build directories, one JSON Lines record per file). For each thread count T the script runs, in
turns, `colibri bench FILE -t T -p 128` (bench's default prompt), `colibri bench FILE -t T -p W`
(W = the profile's window) and `colibri profile` with T worker processes of one thread each,
its default settings (window 512, the default sampled jitter) and with jitter off. The profile's
tokens/s is the whole command's: reading and tokenising the dataset, starting the workers,
every window, the jitter re-runs, the merge and the Parquet writes. Prints each figure and the
ratio profile / bench prefill.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".venv", "build", "build-clang", ".git", "__pycache__"}


def sources_jsonl(out: Path) -> tuple[int, int]:
    """Write every Python source of the repository as one record; (files, bytes)."""
    files = sorted(p for p in ROOT.rglob("*.py") if not SKIP & set(p.relative_to(ROOT).parts))
    size = 0
    with out.open("w", encoding="utf-8") as f:
        for p in files:
            text = p.read_text(encoding="utf-8")
            size += len(text.encode())
            f.write(json.dumps({"path": str(p.relative_to(ROOT)), "text": text}) + "\n")
    return len(files), size


def colibri(*args: str) -> str:
    exe = Path(sys.executable).with_name("colibri")
    result = subprocess.run([str(exe), *args], capture_output=True, text=True, check=True)
    return result.stdout


def bench_prefill(model: str, threads: int, prompt: int) -> float:
    data = json.loads(colibri("bench", model, "-t", str(threads), "-p", str(prompt), "-n", "8",
                              "--json"))
    return float(data["prefill_tok_s"])


def profile(model: str, dataset: Path, threads: int, jitter: bool) -> dict[str, float]:
    out = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    shutil.rmtree(out)
    try:
        args = ["profile", model, "--dataset", str(dataset), "--out", str(out), "--workers",
                str(threads), "--threads", "1", "--json"]
        if not jitter:
            args += ["--jitter-variants", "none"]
        summary = json.loads(colibri(*args))
        return {"tok_s": float(summary["run"]["tokens_per_s"]),
                "tokens": float(summary["totals"]["tokens"]),
                "elapsed_s": float(summary["run"]["elapsed_s"]),
                "window": float(summary["settings"]["window"])}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "resources" / "demo" / "demo.colibri"))
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=1, help="turns per thread count")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-profile-data-") as tmp:
        dataset = Path(tmp) / "sources.jsonl"
        n_files, n_bytes = sources_jsonl(dataset)
        print(f"dataset: {n_files} Python files of this repository, {n_bytes / 1e6:.2f} MB; "
              f"model {os.path.relpath(args.model)}; machine load {os.getloadavg()[0]:.1f}")
        print(f"{'T':>2} {'round':>5} {'bench p128':>11} {'bench pW':>9} {'profile':>9} "
              f"{'no jitter':>9} {'/p128':>6} {'/pW':>6} {'nojit/pW':>8}")
        for threads in (int(t) for t in args.threads.split(",")):
            for r in range(args.rounds):
                b128 = bench_prefill(args.model, threads, 128)
                prof = profile(args.model, dataset, threads, jitter=True)
                window = int(prof["window"])
                bw = bench_prefill(args.model, threads, window)
                plain = profile(args.model, dataset, threads, jitter=False)
                print(f"{threads:>2} {r:>5} {b128:>11.0f} {bw:>9.0f} {prof['tok_s']:>9.0f} "
                      f"{plain['tok_s']:>9.0f} {prof['tok_s'] / b128:>6.2f} "
                      f"{prof['tok_s'] / bw:>6.2f} {plain['tok_s'] / bw:>8.2f}", flush=True)
        print(f"(profile: {int(prof['tokens']):,} tokens, window {window}; pW: bench with a "
              f"{window}-token prompt; tok/s are whole commands, jitter on by default)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
