"""The per-shard function: the one piece of a profile that runs in a worker, wherever it runs.

`run_shard(job)` routes every window of a shard through `Session.prefill` with tracing on, pulls
the trace with numpy and returns the shard's statistics (`stats.ShardAccumulator.result()`). The
same function runs in the calling process (one worker), in local worker processes and as a Ray
task on any node; the partial it returns depends only on the job, so where it ran never shows
in the result.

Each worker process maps the model file once (`_worker`, cached for the process's life: the
page cache is shared by every worker on a machine) and reuses one session, reset between
windows, since every window starts from an empty context. Sampled windows (global index a
multiple of `jitter_every`) are run again under each jitter variant (`colibri.jitter.Runner`,
the same runs as the jitter lab's) and their selected sets compared with the profile's own.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np

from colibri.engine import Model, Session
from colibri.jitter import Runner, Variant
from colibri.profile.stats import ShardAccumulator, Shape


class ProfileError(Exception):
    """A profile job that cannot go on: the message says why and where."""


@dataclass(frozen=True)
class ProfileSettings:
    """Everything a worker needs besides its windows; all of it but `threads` decides results."""

    model_path: str                    # absolute; every node must read the same file there
    model_bytes: int
    model_digest: str                  # model_identity() of the file the job was planned on
    routing: str = "topk"
    epsilon: float | None = None       # stable routing; None = the model's default_epsilon
    seed: int = 0                      # Gumbel routing
    window: int = 512
    jitter_variants: tuple[str, ...] = ()
    jitter_every: int = 32
    threads: int = 1

    def fingerprint(self) -> str:
        """A hash of every setting that changes the statistics (not the path, not threads)."""
        fields = asdict(self)
        for name in ("model_path", "threads"):
            fields.pop(name)
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ShardJob:
    settings: ProfileSettings
    index: int
    first_window: int                  # global index of the shard's first window
    tokens: np.ndarray                 # [n_tokens] int32, the windows back to back
    offsets: np.ndarray                # [n_windows + 1] int64, window w = tokens[o[w]:o[w+1]]

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    def digest(self) -> str:
        """What the shard's result depends on: settings, window numbering and tokens."""
        h = hashlib.sha256(self.settings.fingerprint().encode())
        h.update(np.int64(self.first_window).tobytes())
        h.update(np.ascontiguousarray(self.offsets, dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(self.tokens, dtype=np.int32).tobytes())
        return h.hexdigest()[:32]


def model_identity(model: Model) -> str:
    """A hash of the file's header and tables (which hold every tensor's CRC-32) and its size:
    two files with the same identity hold the same weights."""
    head = min((t.offset for t in model.tensors), default=model.size)
    h = hashlib.sha256(np.int64(model.size).tobytes())
    h.update(model.bytes()[:head].tobytes())
    return h.hexdigest()[:32]


def moe_layers(model: Model) -> list[int]:
    return [layer for layer in range(model.hparams.n_layers)
            if model.routing(layer).kind == "moe"]


def profile_shape(model: Model, routing: str, n_variants: int) -> Shape:
    hp = model.hparams
    k = hp.n_experts if routing == "soft" else hp.n_experts_active
    return Shape(len(moe_layers(model)), hp.n_experts, k, hp.vocab_size, n_variants)


class _Worker:
    """One process's model mapping, session and jitter runner for one settings."""

    def __init__(self, settings: ProfileSettings) -> None:
        path = settings.model_path
        if not os.path.isfile(path):
            raise ProfileError(f"{path}: no such model file on this node ({os.uname().nodename})")
        self.runner = Runner.open(path, threads=settings.threads)
        model = self.runner.model
        if model.size != settings.model_bytes or model_identity(model) != settings.model_digest:
            self.runner.close()
            raise ProfileError(f"{path} on {os.uname().nodename} is not the model file the job "
                               f"was planned with ({model.size} bytes, expected "
                               f"{settings.model_bytes}, or other contents)")
        hp = model.hparams
        self.epsilon = float(hp.default_epsilon if settings.epsilon is None else settings.epsilon)
        self.session = Session(model, routing=settings.routing,  # type: ignore[arg-type]
                               epsilon=self.epsilon, seed=settings.seed,
                               threads=settings.threads, max_context=settings.window, trace=True)
        self.variants = [Variant.parse(v) for v in settings.jitter_variants]
        self.shape = profile_shape(model, settings.routing, len(self.variants))


@lru_cache(maxsize=1)
def _worker(settings: ProfileSettings) -> _Worker:
    return _Worker(settings)


def release_worker() -> None:
    """Drop this process's cached model and session (the in-process run calls it when done)."""
    _worker.cache_clear()


def run_shard(job: ShardJob, progress: Callable[[int], None] | None = None
              ) -> dict[str, np.ndarray]:
    """The statistics of one shard (see the module docstring). `progress(n_tokens)` is called
    after each window."""
    settings = job.settings
    worker = _worker(settings)
    acc = ShardAccumulator(worker.shape)
    session = worker.session
    for w in range(job.offsets.size - 1):
        tokens = job.tokens[job.offsets[w]:job.offsets[w + 1]]
        session.reset()
        session.prefill(tokens, all_logits=False)
        trace = session.trace
        assert trace is not None
        window = job.first_window + w
        ulp_idx = acc.add_window(window, tokens, trace.expert_ids, trace.expert_weights,
                                 trace.router_logits)
        if worker.variants and window % settings.jitter_every == 0:
            base = np.sort(trace.expert_ids, axis=-1)
            for v, variant in enumerate(worker.variants):
                run = worker.runner.run(tokens, variant, routing=settings.routing,
                                        epsilon=worker.epsilon, seed=settings.seed)
                acc.add_flips(v, (run.sets != base).any(axis=-1), ulp_idx)
            acc.sampled(int(tokens.size))
        if progress is not None:
            progress(int(tokens.size))
    result = acc.result()
    result["digest"] = np.array(job.digest())
    result["index"] = np.int64(job.index)
    return result
