#!/usr/bin/env python3
"""Two builds of the engine on one model file, in turns: prefill and decode speed of each and
their paired ratios. How docs/performance.md measures a change ("old and new in turns").

Each build is a revision's engine_c (`git archive REV engine_c`), or the working tree's
(uncommitted changes included), compiled in a temporary directory with engine_c/tools/bench_session.c
of the working tree linked against it (it uses the public API only, so it builds against every
revision's library). With --python each build is the revision's whole package instead (the
engine and the Python layer, its extension built by app/colibri/_build_ffi.py), and a turn is its
own `colibri bench` (the figures a user sees, Python's decoding loop included). The two binaries then run alternately, A B, B A, ..., each turn a fresh process
timing --repeats prefills of the same prompt and the decode after each (medians per turn): one pair
of turns sees the machine within seconds, so the paired ratios show a change of 2-3 % on a shared
machine whose speed drifts by 10 % from minute to minute. Prints, per build, the median tokens/s,
and the median and quartiles of the per-pair ratios B / A (above 1: B is faster).

    python tools/bench_builds.py FILE [--a HEAD] [--b worktree] [-p 128] [-n 32] [-t 2] [--turns 8] [-r 3]
                                 [--numerics default|dot-bf16|kv-f16|dot-bf16+kv-f16]
                                 [--python] [--a-cflags=FLAGS] [--b-cflags=FLAGS] [--b-file FILE]

--a-cflags / --b-cflags add compiler flags to one build's engine, so one revision can be measured
against itself with another value of a compile-time constant (`--a HEAD --b HEAD
--b-cflags=-DCOL_PREFETCH_AHEAD=2048`; with the `=`, since the flags start with a dash), which is
how the decision table's "tried" values are measured. --b-file runs B on another file of the same
model (the same weights in another layout, e.g. q8_0 rows against 8-row panels), A on FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKTREE = "worktree"


def build(revision: str, into: Path, cflags: str = "") -> Path:
    """Compile `revision`'s engine (or the working tree's) under `into`, with `cflags` added to the
    engine's; returns its bench_session."""
    engine = into / "engine_c"
    into.mkdir(parents=True)
    if revision == WORKTREE:
        shutil.copytree(ROOT / "engine_c", engine, ignore=shutil.ignore_patterns("build*"))
    else:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "engine_c"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    jobs = str(os.cpu_count() or 1)
    subprocess.run(["make", "-s", "-C", str(engine), "-j", jobs, f"CFLAGS=-O2 -g {cflags}".strip(),
                    "build/libcolibri.a"], check=True)
    binary = into / "bench_session"
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L",
                    "-I", str(engine / "include"), str(ROOT / "engine_c" / "tools" / "bench_session.c"),
                    str(engine / "build" / "libcolibri.a"), "-lm", "-lpthread", "-o", str(binary)], check=True)
    return binary


def build_package(revision: str, into: Path, cflags: str = "") -> Path:
    """`revision`'s whole source tree (or the working tree's) under `into`, its extension built in
    place; returns the directory to put on PYTHONPATH."""
    into.mkdir(parents=True)
    if revision == WORKTREE:
        for part in ("app", "engine_c", "setup.py", "pyproject.toml"):
            source = ROOT / part
            if source.is_dir():
                shutil.copytree(source, into / part, ignore=shutil.ignore_patterns(
                    "build*", "__pycache__", "*.so"))
            else:
                shutil.copy2(source, into / part)
    else:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    env = {**os.environ, "CFLAGS": f"{os.environ.get('CFLAGS', '')} {cflags}".strip()} if cflags else None
    subprocess.run([sys.executable, str(into / "app" / "colibri" / "_build_ffi.py")], check=True,
                   cwd=into, capture_output=True, env=env)
    return into / "app"


def turn_package(app: Path, file: str, args: argparse.Namespace) -> tuple[float, float]:
    """One `colibri bench` process of the package at `app` on `file`: its median prefill and decode tok/s."""
    command = [sys.executable, "-m", "colibri.cli", "bench", file, "-p", str(args.p), "-n",
               str(args.n), "-t", str(args.threads), "-r", str(args.repeats), "--probe-mb", "64",
               "--no-trace-check", "--json"]
    if args.kernels != "best":
        command += ["--kernels", args.kernels]
    if args.numerics != "default":
        command += ["--numerics", args.numerics]
    env = {**os.environ, "PYTHONPATH": str(app)}
    r = json.loads(subprocess.run(command, check=True, capture_output=True, text=True,
                                  env=env).stdout)
    return r["prefill_tok_s"], r["decode_tok_s"]


def turn(binary: Path, file: str, args: argparse.Namespace) -> tuple[float, float]:
    """One process of `binary` on `file`: the median prefill tokens/s and decode tokens/s of its repeats."""
    out = subprocess.run([str(binary), file, "--prompt", str(args.p), "--decode", str(args.n),
                          "--threads", str(args.threads), "--repeats", str(args.repeats),
                          "--kernels", args.kernels, "--numerics", args.numerics], check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    return args.p / statistics.median(r["prefill_seconds"]), args.n / statistics.median(r["decode_seconds"])


def quartiles(values: list[float]) -> tuple[float, float, float]:
    v = sorted(values)
    return v[len(v) // 4], statistics.median(v), v[(3 * len(v)) // 4]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--a", default="HEAD", help=f"reference build: a git revision or '{WORKTREE}' (default HEAD)")
    ap.add_argument("--b", default=WORKTREE, help=f"build compared with it (default: the {WORKTREE})")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens")
    ap.add_argument("-n", type=int, default=32, help="decoded tokens after each prefill")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--kernels", default="best", choices=("best", "portable", "avx2", "avx512f", "avx512", "amx"))
    ap.add_argument("--numerics", default="default", choices=("default", "dot-bf16", "kv-f16", "dot-bf16+kv-f16"),
                    help="the numerics both builds run (dot-bf16: bf16 weights by bf16 dot products; kv-f16: "
                         "the KV cache in halves, ABI 17 on)")
    ap.add_argument("--turns", type=int, default=8, help="turns of each build (processes)")
    ap.add_argument("-r", "--repeats", type=int, default=3, help="prefills (and decodes) per turn")
    ap.add_argument("--python", action="store_true",
                    help="build whole packages and time their `colibri bench` (the Python layer too)")
    ap.add_argument("--a-cflags", default="", metavar="FLAGS", help="compiler flags added to A's engine (--a-cflags=-DNAME=VALUE)")
    ap.add_argument("--b-cflags", default="", metavar="FLAGS", help="compiler flags added to B's engine (--b-cflags=-DNAME=VALUE)")
    ap.add_argument("--b-file", default=None, metavar="FILE",
                    help="the model file B runs (default: the same file as A)")
    args = ap.parse_args(argv)
    if args.p < 1 or args.n < 1 or args.turns < 1 or args.repeats < 1:
        ap.error("-p, -n, --turns and -r must be at least 1")

    with tempfile.TemporaryDirectory(prefix="colibri-builds-") as tmp:
        try:
            make, run = (build_package, turn_package) if args.python else (build, turn)
            binaries = {name: make(rev, Path(tmp) / name, flags) for name, rev, flags in
                        (("a", args.a, args.a_cflags), ("b", args.b, args.b_cflags))}
        except subprocess.CalledProcessError as exc:
            print(f"bench_builds: building failed: {' '.join(map(str, exc.cmd))}", file=sys.stderr)
            return 1
        runs: dict[str, list[tuple[float, float]]] = {"a": [], "b": []}
        files = {"a": args.file, "b": args.b_file or args.file}
        for i in range(args.turns):
            for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
                runs[name].append(run(binaries[name], files[name], args))

    print(f"{Path(args.file).name}: {args.p}-token prefill and {args.n} decoded tokens, {args.threads} thread(s), "
          f"{args.turns} turns of {args.repeats} repeats; A = {args.a}{' ' + args.a_cflags if args.a_cflags else ''}, "
          f"B = {args.b}{' ' + args.b_cflags if args.b_cflags else ''}"
          + (f" on {Path(args.b_file).name}" if args.b_file else "")
          + (" (colibri bench of each package)" if args.python else ""))
    for index, label in ((0, "prefill"), (1, "decode ")):
        a = [r[index] for r in runs["a"]]
        b = [r[index] for r in runs["b"]]
        low, mid, high = quartiles([y / x for x, y in zip(a, b)])
        print(f"{label}  A {statistics.median(a):9.1f} tok/s, B {statistics.median(b):9.1f} tok/s; "
              f"B / A {mid:.3f} (per pair of turns, quartiles {low:.3f}-{high:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
