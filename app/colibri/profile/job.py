"""A profile job from start to end: plan, run the shards that are not done yet, merge, write.

    request = ProfileRequest(model, dataset, out_dir, ...)
    outcome = run_profile(request, progress)

1. The model is opened (and validated) once here; the dataset is read and tokenised with the
   model's tokenizer into windows (`dataset`), and the windows are cut into shards of about
   `shard_tokens` tokens (a window is never split).
2. The profile directory holds `manifest.json` (the settings), `shards/shard-NNNNNN.npz` (one
   file per finished shard, with the digest of its settings and tokens) and, once complete, the
   tables (`tables.TABLES`, Parquet) and `summary.json`. A directory made with other settings
   is refused; in one made with the same settings every shard whose file holds the expected
   digest is kept, so a run that was stopped (Ctrl+C, a crash, a killed machine) resumes where
   it stopped and a changed dataset recomputes only the shards that changed.
3. The pending shards run on a backend: in this process (one worker), in local worker processes
   (`--workers N`, each mapping the model file), or as Ray tasks (`colibri.profile.ray_backend`).
   Each finished shard is written at once, atomically (`colibri.files.atomic_write`), by this
   process; an interrupted run keeps every shard it finished.
4. The shards' partials are merged in shard order (`stats.merge`) and the tables and summary
   written, each atomically, `summary.json` last: its presence marks a complete profile.
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import os
import queue
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from colibri.engine import Model
from colibri.errors import ColibriError
from colibri.files import atomic_write, atomic_write_bytes
from colibri.jitter import parse_variants
from colibri.numerics import NumericsError
from colibri.profile import DEFAULT_VARIANTS
from colibri.profile.dataset import Corpus, DatasetError, detect_format, read_documents, tokenize
from colibri.profile.shard import (ProfileError, ProfileSettings, ShardJob, model_identity,
                                   moe_layers, profile_shape, release_worker, run_shard)
from colibri.profile.stats import merge
from colibri.profile.tables import TABLES, build_tables
from colibri.values import CancelFlag, Cancelled, Progress, never_cancelled, no_progress

SCHEMA = "colibri.profile/1"
MANIFEST = "manifest.json"
SUMMARY = "summary.json"
SHARD_DIR = "shards"


class Interrupted(Cancelled):
    """The run stopped early (Ctrl+C, SIGTERM or a cancel); finished shards are kept on disk."""

    def __init__(self, done: int, total: int, out_dir: str) -> None:
        super().__init__(f"interrupted: {done} of {total} shards finished and kept in {out_dir}; "
                         "run the same command again to resume")
        self.done, self.total = done, total


@dataclass
class ProfileRequest:
    model: str
    dataset: str
    out_dir: str
    fmt: str | None = None                   # None/'auto': from the dataset's extension
    field: str | None = None                 # JSON Lines / Parquet text field ('text')
    window: int = 512
    shard_tokens: int = 16384
    max_tokens: int | None = None
    routing: str = "topk"
    epsilon: float | None = None
    seed: int = 0
    jitter_variants: Sequence[str] = DEFAULT_VARIANTS
    jitter_every: int = 32
    workers: int | None = None               # None: the CPU count (Ray cluster: CPUs / threads)
    threads: int = 1
    ray: str | None = None                   # None: local; 'local' or a Ray cluster address


@dataclass
class ProfileOutcome:
    out_dir: str
    summary: dict[str, Any]
    shards: int
    resumed: int                             # shards found finished on disk
    tokens_run: int                          # tokens this run computed
    elapsed_s: float
    files: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Planning


def plan_shards(corpus: Corpus, shard_tokens: int) -> list[tuple[int, int]]:
    """Consecutive (first, end) window ranges of about shard_tokens tokens each."""
    shards = []
    first = 0
    offsets = corpus.offsets
    for w in range(corpus.n_windows):
        if offsets[w + 1] - offsets[first] >= shard_tokens or w == corpus.n_windows - 1:
            shards.append((first, w + 1))
            first = w + 1
    return shards


def make_job(settings: ProfileSettings, corpus: Corpus, index: int, span: tuple[int, int]
             ) -> ShardJob:
    first, end = span
    lo, hi = int(corpus.offsets[first]), int(corpus.offsets[end])
    return ShardJob(settings, index, first, corpus.tokens[lo:hi],
                    corpus.offsets[first:end + 1] - lo)


def _check_request(req: ProfileRequest) -> list[str]:
    """Argument errors, as ValueError; returns the canonical jitter variant names."""
    for name in ("window", "shard_tokens", "jitter_every", "workers", "threads"):
        value = getattr(req, name)
        if name == "workers" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name.replace('_', '-')} must be an int >= 1, got {value!r}")
    if req.max_tokens is not None and req.max_tokens < 1:
        raise ValueError(f"max-tokens must be >= 1, got {req.max_tokens}")
    specs = [s.strip() for s in req.jitter_variants if s.strip()]
    if not specs:
        return []
    try:  # the jitter lab's parser: canonical names, duplicates dropped, kernels checked
        return [v.name for v in parse_variants(",".join(specs))]
    except NumericsError as exc:
        raise ValueError(f"--jitter-variants: {exc}") from None


# ---------------------------------------------------------------------------------------------
# The profile directory


def shard_path(out_dir: str, index: int) -> str:
    return os.path.join(out_dir, SHARD_DIR, f"shard-{index:06d}.npz")


def _prepare_dir(out_dir: str, manifest: dict[str, Any]) -> None:
    path = os.path.join(out_dir, MANIFEST)
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                old = json.load(f)
        except (OSError, ValueError) as exc:
            raise ProfileError(f"{path}: unreadable manifest ({exc}); remove the directory or "
                               "choose another --out") from None
        if old.get("fingerprint") != manifest["fingerprint"]:
            differ = [k for k in sorted(manifest["settings"])
                      if old.get("settings", {}).get(k) != manifest["settings"][k]]
            raise ProfileError(
                f"{out_dir} holds a profile made with other settings (different: "
                f"{', '.join(differ) or 'the model file'}); choose another --out or remove it")
    elif os.path.isdir(out_dir) and os.listdir(out_dir):
        raise ProfileError(f"{out_dir} is not empty and holds no profile ({MANIFEST} missing); "
                           "choose another --out")
    os.makedirs(os.path.join(out_dir, SHARD_DIR), exist_ok=True)
    atomic_write_bytes(path, json.dumps(manifest, indent=1, sort_keys=True).encode())


def write_shard(out_dir: str, index: int, result: dict[str, np.ndarray]) -> None:
    atomic_write(shard_path(out_dir, index), lambda f: np.savez(f, **result))


def read_shard(path: str, digest: str | None = None) -> dict[str, np.ndarray] | None:
    """A finished shard's partial, or None when the file is missing, unreadable or holds a
    different digest (then the shard runs again)."""
    if not os.path.exists(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            partial = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, KeyError):
        return None
    if digest is not None and str(partial.get("digest", "")) != digest:
        return None
    return partial


# ---------------------------------------------------------------------------------------------
# Backends: each runs `jobs`, calls write(job, result) as each finishes and advance(n_tokens) per
# window (or per shard), and raises KeyboardInterrupt when cancelled() turns true.

WriteFn = Callable[[ShardJob, dict[str, np.ndarray]], None]
AdvanceFn = Callable[[int], None]


def _run_here(jobs: list[ShardJob], write: WriteFn, advance: AdvanceFn,
              cancelled: CancelFlag) -> None:
    try:
        for job in jobs:
            if cancelled():
                raise KeyboardInterrupt
            write(job, run_shard(job, advance))
    finally:
        release_worker()


def _worker_main(tasks: Any, results: Any) -> None:
    """A local worker process: run shards from `tasks` until None, report on `results`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers on Ctrl+C
    while True:
        job = tasks.get()
        if job is None:
            return
        try:
            result = run_shard(job, lambda n: results.put(("window", n, None)))
            results.put(("done", job.index, result))
        except Exception as exc:  # as a plain message: not every exception unpickles
            results.put(("error", job.index, str(exc) if isinstance(exc, ProfileError)
                         else f"{type(exc).__name__}: {exc}"))


def _run_pool(jobs: list[ShardJob], workers: int, write: WriteFn, advance: AdvanceFn,
              cancelled: CancelFlag) -> None:
    """`workers` processes (spawned: the parent may hold threads) take shards from one queue;
    on a stop or an error every one of them is killed, so nothing outlives the run."""
    ctx = mp.get_context("spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_worker_main, args=(tasks, results), daemon=True)
             for _ in range(min(workers, len(jobs)))]
    for proc in procs:
        proc.start()
    by_index = {job.index: job for job in jobs}
    for item in [*jobs, *[None] * len(procs)]:
        tasks.put(item)
    try:
        remaining = len(jobs)
        while remaining:
            if cancelled():
                raise KeyboardInterrupt
            try:
                kind, index, value = results.get(timeout=0.2)
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise ProfileError(f"a worker process died (exit code {dead[0]})") from None
                continue
            if kind == "window":
                advance(index)
            elif kind == "error":
                raise ProfileError(f"shard {index}: {value}")
            else:
                write(by_index[index], value)
                remaining -= 1
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            proc.join(timeout=10)
        for q in (tasks, results):   # never wait on a pipe whose reader was killed
            q.cancel_join_thread()
            q.close()


# ---------------------------------------------------------------------------------------------
# The job


def _dataset_summary(req: ProfileRequest, corpus: Corpus) -> dict[str, Any]:
    kind = detect_format(req.dataset, req.fmt)
    return {"path": os.path.abspath(req.dataset), "format": kind,
            "field": None if kind == "text" else (req.field or "text"),
            "records": corpus.n_records}


def run_profile(req: ProfileRequest, progress: Progress = no_progress,
                cancelled: CancelFlag = never_cancelled) -> ProfileOutcome:
    """Run (or resume) the profile job of `req`; see the module docstring. `progress(done,
    total)` counts tokens (the first report's `done`: tokens of shards already on disk). Raises
    DatasetError for a dataset that cannot be profiled, ProfileError for a job that cannot run,
    ColibriError for a model that does not open, Interrupted when stopped early."""
    started = time.perf_counter()
    variants = _check_request(req)
    model_path = os.path.abspath(req.model)
    model = Model.open(model_path)
    try:
        layers = moe_layers(model)
        if not layers:
            raise ProfileError(f"{req.model}: no MoE layer, nothing to profile")
        tokenizer = model.tokenizer
        if tokenizer is None:
            raise ProfileError(f"{req.model} has no tokenizer; a profile needs one to tokenise "
                               "the dataset")
        window = min(req.window, model.hparams.max_context)
        settings = ProfileSettings(model_path, model.size, model_identity(model), req.routing,
                                   req.epsilon, req.seed, window, tuple(variants),
                                   req.jitter_every, req.threads)
        shape = profile_shape(model, req.routing, len(variants))
        hp = model.hparams
        vocab = hp.vocab_size
        model_info = {"name": os.path.basename(model_path), "path": model_path,
                      "bytes": model.size, "arch": model.arch, "moe_layers": layers,
                      "n_experts": hp.n_experts, "k": shape.k, "vocab_size": vocab,
                      "identity": settings.model_digest}
    finally:
        model.close()

    corpus = tokenize(read_documents(req.dataset, req.fmt, req.field), tokenizer, window,
                      vocab, req.dataset, req.max_tokens)
    spans = plan_shards(corpus, req.shard_tokens)
    settings_summary = {"window": window, "shard_tokens": req.shard_tokens,
                        "max_tokens": req.max_tokens, "routing": req.routing,
                        "epsilon": req.epsilon, "seed": req.seed,
                        "jitter_variants": variants, "jitter_every": req.jitter_every,
                        "dataset": _dataset_summary(req, corpus)["path"],
                        "format": detect_format(req.dataset, req.fmt),
                        "field": _dataset_summary(req, corpus)["field"]}
    manifest = {"schema": SCHEMA, "fingerprint": settings.fingerprint(),
                "model": model_info["name"], "settings": settings_summary}
    out_dir = os.path.abspath(req.out_dir)
    _prepare_dir(out_dir, manifest)

    jobs = [make_job(settings, corpus, i, span) for i, span in enumerate(spans)]
    pending = [job for job in jobs
               if read_shard(shard_path(out_dir, job.index), job.digest()) is None]
    resumed = len(jobs) - len(pending)
    finished = [resumed]

    def write(job: ShardJob, result: dict[str, np.ndarray]) -> None:
        write_shard(out_dir, job.index, result)
        finished[0] += 1

    tokens_run = sum(job.n_tokens for job in pending)
    workers = req.workers or (1 if req.ray not in (None, "local") else os.cpu_count() or 1)
    run_started = time.perf_counter()
    done = [corpus.n_tokens - tokens_run]

    def advance(n_tokens: int) -> None:
        done[0] += n_tokens
        progress(done[0], corpus.n_tokens, "")

    progress(done[0], corpus.n_tokens, "")
    try:
        if pending:
            if req.ray is not None:
                from colibri.profile.ray_backend import run_ray
                run_ray(pending, req.ray, req.workers, req.threads, write, advance, cancelled)
            elif workers == 1 or len(pending) == 1:
                _run_here(pending, write, advance, cancelled)
            else:
                _run_pool(pending, workers, write, advance, cancelled)
    except KeyboardInterrupt:
        raise Interrupted(finished[0], len(jobs), out_dir) from None
    run_s = time.perf_counter() - run_started

    def finished_shards() -> Iterator[dict[str, np.ndarray]]:
        for job in jobs:
            partial = read_shard(shard_path(out_dir, job.index), job.digest())
            if partial is None:
                raise ProfileError(f"{shard_path(out_dir, job.index)} vanished or changed "
                                   "during the run; run again to recompute it")
            yield partial

    merged = merge(finished_shards())
    tables = build_tables(merged, shape, layers, variants, tokenizer, corpus)
    files = write_tables(out_dir, tables)
    elapsed = time.perf_counter() - started
    summary = {
        "schema": SCHEMA, "model": model_info, "dataset": _dataset_summary(req, corpus),
        "settings": {k: v for k, v in settings_summary.items()
                     if k not in ("dataset", "format", "field")},
        "totals": {"tokens": int(merged["n_tokens"]), "windows": int(merged["n_windows"]),
                   "cells": int(merged["n_tokens"]) * len(layers),
                   "sampled_windows": int(merged["n_sampled_windows"]),
                   "sampled_tokens": int(merged["n_sampled_tokens"]), "shards": len(jobs)},
        "files": files,
        "run": {"backend": "local" if req.ray is None else f"ray {req.ray}",
                "workers": workers, "threads": req.threads, "resumed_shards": resumed,
                "tokens_run": tokens_run, "run_s": round(run_s, 3),
                "elapsed_s": round(elapsed, 3),
                "tokens_per_s": round(tokens_run / elapsed, 1) if elapsed > 0 else None},
    }
    atomic_write_bytes(os.path.join(out_dir, SUMMARY),
                       json.dumps(summary, indent=1, sort_keys=True).encode())
    return ProfileOutcome(out_dir, summary, len(jobs), resumed, tokens_run, elapsed, files)


def write_tables(out_dir: str, tables: dict[str, Any]) -> list[str]:
    import pyarrow.parquet as pq

    files = []
    for name in TABLES:
        path = os.path.join(out_dir, f"{name}.parquet")

        def write(f: Any, table: Any = tables[name]) -> None:
            buf = io.BytesIO()
            pq.write_table(table, buf)
            f.write(buf.getvalue())

        atomic_write(path, write)
        files.append(f"{name}.parquet")
    return files


__all__ = ["DEFAULT_VARIANTS", "DatasetError", "Interrupted", "ProfileError", "ProfileOutcome",
           "ProfileRequest", "plan_shards", "read_shard", "run_profile"]
