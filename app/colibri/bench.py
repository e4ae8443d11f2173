"""`colibri bench`: prefill and decode speed of a .colibri file against this machine's own
read-bandwidth limit, measured in the same run.

The prefill computes the last position's logits only (what a generation needs; the LM head over
every prompt position would be another 20 % of a 128-token prefill of the 0.64 B bench model).

Decode on a CPU is bound by memory bandwidth: tokens/s cannot exceed the read bandwidth divided
by the bytes of weights one token reads (attention, router, the k selected experts, shared
experts, dense MLPs, the LM head). The report states that byte count (from the tensor table),
the effective GB/s reached, the probe's GB/s and the fraction of the limit; figures are medians
of `repeats` runs so a busy neighbour on a shared machine moves them less, and the probe runs
after every repeat (the best reading is the limit). A model whose weights fit in the last-level
cache decodes from the cache, not from memory, so it can run above that limit; the report says so.

A numerics variant (`numerics`, colibri.numerics) is timed against the default computation: a
second session with the default numerics runs the same prefill and decode in turns with it within
every repeat, and the report gives the variant's time as a multiple of the default's (the median
of the repeats' ratios, with the lowest and highest), which one run on a shared machine measures
far better than two runs minutes apart.

Prefill is bound by arithmetic instead: the report gives the multiply-adds one prompt token costs
(colibri.compute, from the file's shapes), split by the instruction the run's kernel path makes
them with, and the compute probe's multiply-adds per second for each (same threads, between the
repeats like the bandwidth probe): the prefill limit is what the prefill would reach at those
rates, and the fraction of it is the median over repeats, each against the better probe beside it.

On more than one thread the report also gives how the decode's weight products split over the
threads, from the engine's own counts (Session.thread_stats): each thread's share of the
multiply-adds, and how many of the batches handed to every thread the workers entered. A repeat
whose worker the machine ran late shows there, beside its low fraction of the limit.

Memory: the peak RSS is measured over the runs only (Linux: the peak is reset after each probe
through /proc/self/clear_refs and read before the next), so the probe's buffer (`--probe-mb`,
1 GiB by default, larger than any cache) is not counted. The peak is split into what the process
held before the model was opened (the interpreter, numpy and the libraries the CLI imports), the
resident pages of the mapped model file (/proc/self/smaps) and the rest: the sessions' memory
(the engine's own figure, `Session.memory_estimate`, is given beside it), the worker threads'
stacks and the arrays the runs return. Of the mapped file's resident pages, the report gives the
share mapped 2 MiB at a time (smaps FilePmdMapped): the engine asks for them, but a file the page
cache already held in 4 KiB pages keeps those, and decode reads it a few % slower.
"""

from __future__ import annotations

import os
import resource
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from colibri import compute
from colibri.engine import ABI_VERSION, Model, Session, ThreadStats, measure_read_bandwidth, measure_read_latency
from colibri.fileformat import FLAG_TIED_EMBEDDINGS
from colibri.generation import Generation

if TYPE_CHECKING:
    from colibri.formats.gguf_file import GGUFFile

_EXPERT_MATS = ("moe_w1", "moe_w2", "moe_w3", "moe_w1_bias", "moe_w2_bias", "moe_w3_bias")


def phase_bytes(model: Model) -> dict[str, int]:
    """Bytes of weights one decoded token reads in each part of the step: the attention
    projections, the feed-forward (router, the k selected experts, shared experts, dense MLPs) and
    what runs outside the layers (the embedding row, the final norm, the LM head). LongRoPE's
    frequency factors are not counted: the session's RoPE table is made from them once."""
    hp = model.hparams
    parts = {"attention": 0, "feed-forward": 0, "outside layers": 0}
    for t in model.tensors:
        base = t.name.rsplit(".", 1)[-1]
        if t.name == "rope_freq_factors":
            continue
        if t.name == "token_embd":
            parts["outside layers"] += t.nbytes // hp.vocab_size + (t.nbytes if hp.flags & FLAG_TIED_EMBEDDINGS else 0)
        elif not t.name.startswith("layers."):
            parts["outside layers"] += t.nbytes
        elif base.startswith("attn_"):
            parts["attention"] += t.nbytes
        elif base in _EXPERT_MATS:
            parts["feed-forward"] += t.nbytes * hp.n_experts_active // hp.n_experts
        else:
            parts["feed-forward"] += t.nbytes
    return parts


def weight_bytes_per_token(model: Model) -> int:
    """Bytes of weights one decoded token reads with top-k routing: every tensor except the
    embedding table (one row is read, plus the whole table when it is also the LM head) and
    k / n_experts of each stacked expert tensor."""
    return sum(phase_bytes(model).values())


def gguf_weight_bytes_per_token(f: GGUFFile) -> int:
    """The same count for a GGUF file, from its tensor table, as llama.cpp reads it: every
    tensor except the embedding table (one row, plus the whole table when there is no
    `output.weight`, i.e. it is also the LM head) and `{arch}.expert_used_count /
    {arch}.expert_count` of each stacked expert tensor (`*_exps`); LongRoPE's factors
    (`rope_factors_*`, a few hundred floats) are left out as in the import's count, and the
    multi-token-prediction layers after the last decoder layer (`{arch}.nextn_predict_layers`)
    are not read."""
    arch = f.architecture
    n_experts = int(f.get(f"{arch}.expert_count", 0) or 0)
    top_k = int(f.get(f"{arch}.expert_used_count", 0) or 0)
    n_layers = (int(f.get(f"{arch}.block_count", 0) or 0)
                - int(f.get(f"{arch}.nextn_predict_layers", 0) or 0))
    tied = "output.weight" not in f
    total = 0
    for t in f.tensors:
        parts = t.name.split(".")
        if t.name.startswith("rope_factors_") or (
                parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) >= n_layers):
            continue
        if t.name == "token_embd.weight":
            total += t.row_bytes + (t.nbytes if tied else 0)
        elif "_exps." in t.name and n_experts:
            total += t.nbytes * top_k // n_experts
        else:
            total += t.nbytes
    return total


def kv_bytes_per_token(model: Model, first: int, n: int, element_bytes: int = 4) -> int:
    """Bytes of KV cache the steps at positions first..first+n-1 read, on average: every layer's
    keys and values (`element_bytes` each: 4 for f32, 2 for the `kv-f16` numerics) of the positions it attends to (all before it and itself, the sliding
    window of a sliding layer, or the chunk so far of a chunked one); with latent attention
    (MLA) one row of kv_lora_rank + qk_rope_head_dim per position serves as keys and values. Not
    counted in the limit, which is about weights, but at long contexts it is what the attention
    heads wait on."""
    hp = model.hparams
    row = ((hp.kv_lora_rank + hp.qk_rope_head_dim) if hp.attention == 1
           else 2 * hp.n_kv_heads * hp.head_dim) * element_bytes
    return row * compute.attended_keys(model, first, n) // n


def phase_breakdown(model: Model, session: Session, first: int, n: int, kv_bytes: int = 0
                    ) -> dict[str, dict[str, float]]:
    """Median milliseconds per decoded token of each part of the step (from the trace's phase
    timings of positions first..first+n-1) and the bandwidth each part reached over the bytes
    it reads, its weights and, for attention, `kv_bytes` of KV cache a token: a part well below
    the others is where a step loses time to something other than reading memory."""
    trace = session.trace
    assert trace is not None
    phases = trace.phase_ns[first:first + n].astype(np.float64) / 1e6  # [n, layers, phase]
    per_token = phases.sum(axis=1)                                       # [n, phase]
    token_ms = trace.token_ns[first:first + n].astype(np.float64) / 1e6
    ms = {"attention": float(np.median(per_token[:, 0])),
          "feed-forward": float(np.median(per_token[:, 1] + per_token[:, 2] + per_token[:, 3])),
          "outside layers": float(np.median(token_ms - per_token[:, 4]))}
    nbytes = phase_bytes(model)
    nbytes["attention"] += kv_bytes
    return {part: {"ms": ms[part], "mb": nbytes[part] / 1e6,
                   "gb_s": nbytes[part] / (ms[part] * 1e6) if ms[part] > 0 else float("nan")}
            for part in ms}


@dataclass
class BenchResult:
    file: str
    kernels: str
    numerics: str  # the numerics variant's spec ('default': the exact computation)
    threads: int
    prompt_tokens: int
    decode_tokens: int
    repeats: int
    prefill_tok_s: float
    decode_tok_s: float
    decode_ms_per_token: float
    weight_bytes_per_token: int
    kv_bytes_per_token: int  # average over the decoded positions; not in the limit
    effective_gb_s: float
    probe_gb_s: float
    limit_tok_s: float
    fraction_of_limit: float
    # the slowest and fastest repeat (fraction: lowest and highest), so a reader sees how far a
    # shared machine moved the medians above
    prefill_tok_s_range: tuple[float, float]
    decode_tok_s_range: tuple[float, float]
    fraction_of_limit_range: tuple[float, float]
    trace_on_decode_tok_s: float
    trace_cost: float       # 1 - untraced / traced decode time: the median over repeats of the pairs run in turns
    peak_rss_mb: float      # over the runs, without the probe's buffer (see probe_mb)
    mapped_rss_mb: float    # of which the resident pages of the mapped model file
    peak_rss_excludes_probe: bool  # False where the peak cannot be reset (not Linux)
    probe_mb: float         # the bandwidth probe's buffer
    model_bytes: int        # every tensor of the file
    cache_bytes: int        # the last-level cache (0: unknown)
    session_bytes: int      # one session's memory beyond the mapped weights (the engine's estimate)
    phases: dict[str, dict[str, float]]  # from the traced run; empty without it
    # a numerics variant's cost: the default computation run in turns with it (None for the
    # default itself), and the median over repeats of variant time / default time, with the
    # lowest and highest repeat
    default_prefill_tok_s: float | None = None
    default_decode_tok_s: float | None = None
    prefill_cost: float | None = None
    decode_cost: float | None = None
    prefill_cost_range: tuple[float, float] | None = None
    decode_cost_range: tuple[float, float] | None = None
    # the compute limit of the prefill (colibri.compute): multiply-adds per prompt token by the
    # arithmetic that makes them, the best probe of each (multiply-adds/s), the tok/s those rates
    # allow and the prefill's fraction of it (median over repeats, lowest and highest); None where
    # the path's arithmetic has no probe (portable, bf16 on AMX tiles)
    prefill_macs_per_token: dict[str, float] | None = None
    compute_probe: dict[str, float] | None = None
    prefill_limit_tok_s: float | None = None
    prefill_fraction_of_limit: float | None = None
    prefill_fraction_of_limit_range: tuple[float, float] | None = None
    baseline_rss_mb: float = 0.0  # of peak_rss_mb, the process before the model was opened (0: unknown)
    n_sessions: int = 1     # sessions alive during the runs (timed, traced, default numerics)
    engine_abi: int = 0     # the engine's ABI version (since 13, q8_0/q4_0 products in block order)
    # of mapped_rss_mb, the pages mapped 2 MiB at a time (Linux smaps FilePmdMapped; None where
    # unknown): decode streams them with a TLB entry per 2 MiB instead of per 4 KiB
    mapped_huge_mb: float | None = None
    trace_cost_range: tuple[float, float] | None = None  # trace_cost's lowest and highest repeat (None: no traced run)
    # memory's latency (ns a dependent load over the probe's buffer) before the runs and after
    # them: a step's short reads wait on it, and it moves with the machine apart from bandwidth
    latency_ns: tuple[float, float] | None = None
    # how the decode's weight products split over the threads (Session.thread_stats; None on one
    # thread): each thread's share of the multiply-adds, the calling thread first (median over
    # repeats), the workers' share together in the repeats (lowest and highest), the batches a
    # decoded token hands to every thread, and the share of them the workers entered (the lowest
    # worker's, median over repeats): a worker the machine runs late leaves its work to the caller
    decode_thread_shares: tuple[float, ...] | None = None
    decode_worker_share_range: tuple[float, float] | None = None
    decode_batches_per_token: float | None = None
    decode_batches_entered: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def last_level_cache_bytes() -> int:
    """Size of the largest (last-level) CPU cache cpu0 sees, from Linux sysfs; 0 if unknown."""
    best = (0, 0)
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((index / "level").read_text())
            text = (index / "size").read_text().strip().upper()
            kind = (index / "type").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not text:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        size = int(text.rstrip("KMG")) * scale
        best = max(best, (level, size))
    return best[1]


def resident_bytes() -> int:
    """This process's resident set now (Linux /proc/self/status VmRSS); 0 where unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class PeakMemory:
    """The peak resident set of this process over chosen stretches of time (Linux), and how much
    of it a given file's mapping holds. Elsewhere `reset` does nothing and the peak is the
    process's lifetime peak (`resettable` False)."""

    def __init__(self, mapped_path: str) -> None:
        self.mapped_path = os.path.realpath(mapped_path)
        self.peak_bytes = 0
        self.mapped_bytes = 0
        self.mapped_huge_bytes: int | None = None
        self.resettable = self._clear()

    @staticmethod
    def _clear() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:   # "5": reset the peak RSS to now
                f.write("5")
            return True
        except OSError:
            return False

    def reset(self) -> None:
        """Start a new stretch: forget the peak so far (a probe's buffer)."""
        if self.resettable:
            self._clear()

    def sample(self) -> None:
        """Fold the peak of the stretch since the last reset into `peak_bytes`."""
        peak = 0
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
        except (OSError, ValueError):
            peak = 0
        if not peak or not self.resettable:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.peak_bytes = max(self.peak_bytes, peak)
        resident, huge = self._mapped()
        if resident >= self.mapped_bytes:
            self.mapped_bytes, self.mapped_huge_bytes = resident, huge

    def _mapped(self) -> tuple[int, int | None]:
        """The file's mapping: resident bytes, and of them those mapped by 2 MiB pages (None where
        smaps does not say)."""
        total, huge, inside = 0, None, False
        try:
            lines = Path("/proc/self/smaps").read_text().splitlines()
        except OSError:
            return 0, None
        for line in lines:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields[0]) > 8 and not fields[0].endswith(":"):
                inside = len(fields) >= 6 and os.path.realpath(fields[-1]) == self.mapped_path
            elif inside and fields and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
            elif inside and fields and fields[0] == "FilePmdMapped:":
                huge = (huge or 0) + int(fields[1]) * 1024
        return total, huge


def thread_split(before: list[ThreadStats], after: list[ThreadStats]) -> tuple[list[float], int, float]:
    """Between two readings of Session.thread_stats: each thread's share of the multiply-adds,
    the batches handed to every thread, and the share of them the least present worker entered."""
    macs = [a.multiply_adds - b.multiply_adds for a, b in zip(after, before)]
    batches = [a.batches - b.batches for a, b in zip(after, before)]
    total = sum(macs)
    entered = min(batches[1:]) / batches[0] if batches[0] else 1.0
    return [m / total if total else 0.0 for m in macs], batches[0], entered


def paired_ratio(times: list[float], base: list[float]) -> tuple[float, tuple[float, float]]:
    """The median over repeats of times[i] / base[i], and the lowest and highest: each pair ran in
    the same repeat, in turns, so a machine whose speed drifts between repeats moves both sides of
    a ratio alike, where a ratio of the two medians would take one side from another repeat."""
    ratios = [t / b for t, b in zip(times, base)]
    return statistics.median(ratios), (min(ratios), max(ratios))


def run_bench(path: str, prompt: int = 128, n: int = 64, threads: int = 1, repeats: int = 3,
              probe_bytes: int = 1 << 30, trace_check: bool = True,
              kernels: str | None = None, numerics: str | None = None) -> BenchResult:
    # numpy.random (5.7 MiB resident once imported) is a library the process holds, not the runs'
    rng = np.random.default_rng(0)
    baseline = resident_bytes()
    model = Model.open(path)
    hp = model.hparams
    tokens = rng.integers(0, hp.vocab_size, size=prompt).astype(np.int32)
    ctx = min(hp.max_context, prompt + n + 8)
    session = Session(model, threads=threads, max_context=ctx, trace=False, kernels=kernels,
                      numerics=numerics)
    # a variant is timed against the default computation, in turns within each repeat
    default = None if session.numerics.is_default else Session(
        model, threads=threads, max_context=ctx, trace=False, kernels=kernels)
    # warm: page the whole file in and let the workers settle
    for warm in (session, default):
        if warm is not None:
            warm.generate(tokens[: min(prompt, 8)], 5, eos=None)

    prefill_s, decode_s, traced_s = [], [], []
    default_prefill_s: list[float] = []
    default_decode_s: list[float] = []
    phase_runs: list[dict[str, dict[str, float]]] = []
    memory = PeakMemory(path)
    kv_bytes = kv_bytes_per_token(model, prompt, n, 2 if session.numerics.kv == "f16" else 4)
    macs = compute.arithmetic_macs(compute.prefill_macs(model, prompt), compute.colibri_arithmetic(
        session.kernels, "dot-bf16" in session.numerics.spec.split("+")))
    arithmetics = sorted(macs) if macs else []
    probes = [measure_read_bandwidth(probe_bytes, threads, 3)]
    compute_probes = [compute.probe(arithmetics, threads, session.kernels)]
    latencies = [measure_read_latency(probe_bytes)]
    memory.reset()
    traced = Session(model, threads=threads, max_context=ctx, trace=True, kernels=kernels,
                     numerics=numerics) if trace_check else None
    # prompt, then n steps: the prompt's positions and n decoded ones (eos ignored)
    splits: list[tuple[list[float], int, float]] = []

    def untraced_run() -> None:
        session.reset()
        # the prompt, then the decode run with no callback between positions (the engine's
        # greedy loop, colibri.generation), from the thread counts the prompt left
        generation = Generation(session, tokens, n + 1, eos=None)
        generation.advance()
        after_prompt = session.thread_stats()
        generation.run()
        prefill_s.append(generation.prefill_ns / 1e9)
        decode_s.append(generation.decode_ns / 1e9)
        if threads > 1:
            splits.append(thread_split(after_prompt, session.thread_stats()))

    def traced_run() -> None:  # same prompt and positions: only tracing differs
        assert traced is not None
        traced.reset()
        traced_s.append(traced.generate(tokens, n + 1, eos=None).decode_ns / 1e9)
        phase_runs.append(phase_breakdown(model, traced, prompt, n, kv_bytes))

    def default_run() -> None:  # the same work under the default numerics
        assert default is not None
        default.reset()
        generation = default.generate(tokens, n + 1, eos=None)
        default_prefill_s.append(generation.prefill_ns / 1e9)
        default_decode_s.append(generation.decode_ns / 1e9)

    runs = [untraced_run] + ([traced_run] if traced is not None else []) + (
        [default_run] if default is not None else [])
    for rep in range(repeats):
        # interleaved, each repeat in another order, so that running first or last biases no side
        for run in runs[rep % len(runs):] + runs[:rep % len(runs)]:
            run()
        # the probe runs between the repeats, so each decode run has a reading taken just before
        # and just after it; a busy neighbour can only lower a reading, so the better one counts
        memory.sample()
        probes.append(measure_read_bandwidth(probe_bytes, threads, 3))
        compute_probes.append(compute.probe(arithmetics, threads, session.kernels))
        if rep == repeats - 1:
            latencies.append(measure_read_latency(probe_bytes))
        memory.reset()
    wb = weight_bytes_per_token(model)
    fractions = [wb * n / d / max(probes[i], probes[i + 1]) for i, d in enumerate(decode_s)]
    def best(rates: list[dict[str, float | None]]) -> dict[str, float | None]:
        return {a: max((r[a] or 0.0) for r in rates) or None for a in arithmetics}
    pre_limits = [compute.limit_tok_s(macs, best(compute_probes[i:i + 2])) for i in range(len(prefill_s))]
    pre_fractions = [prompt / p / lim for p, lim in zip(prefill_s, pre_limits) if lim]
    best_rates = best(compute_probes)
    pre_limit = compute.limit_tok_s(macs, best_rates)

    bw = max(probes)
    pre = statistics.median(prefill_s)
    dec = statistics.median(decode_s)
    dec_tok_s = n / dec
    limit = bw / wb
    traced_tok_s = n / statistics.median(traced_s) if traced_s else float("nan")
    cost: dict[str, Any] = {}
    if default is not None:
        pre_cost, pre_range = paired_ratio(prefill_s, default_prefill_s)
        dec_cost, dec_range = paired_ratio(decode_s, default_decode_s)
        cost = dict(default_prefill_tok_s=prompt / statistics.median(default_prefill_s),
                    default_decode_tok_s=n / statistics.median(default_decode_s),
                    prefill_cost=pre_cost, decode_cost=dec_cost,
                    prefill_cost_range=pre_range, decode_cost_range=dec_range)
    # untraced / traced decode time, per repeat; tracing's cost is 1 - that
    untraced, untraced_range = paired_ratio(decode_s, traced_s) if traced_s else (float("nan"), None)
    split: dict[str, Any] = {}
    if splits:
        workers = [sum(shares[1:]) for shares, _, _ in splits]
        split = dict(
            decode_thread_shares=tuple(statistics.median(shares[t] for shares, _, _ in splits)
                                       for t in range(len(splits[0][0]))),
            decode_worker_share_range=(min(workers), max(workers)),
            decode_batches_per_token=statistics.median(batches for _, batches, _ in splits) / n,
            decode_batches_entered=statistics.median(entered for _, _, entered in splits))
    return BenchResult(
        file=path, kernels=session.kernels, numerics=session.numerics.spec, engine_abi=ABI_VERSION, threads=threads,
        prompt_tokens=prompt, decode_tokens=n,
        repeats=repeats, prefill_tok_s=prompt / pre, decode_tok_s=dec_tok_s,
        decode_ms_per_token=1000.0 * dec / n, weight_bytes_per_token=wb,
        kv_bytes_per_token=kv_bytes,
        effective_gb_s=wb * dec_tok_s / 1e9, probe_gb_s=bw / 1e9, limit_tok_s=limit,
        fraction_of_limit=statistics.median(fractions), trace_on_decode_tok_s=traced_tok_s,
        prefill_tok_s_range=(prompt / max(prefill_s), prompt / min(prefill_s)),
        decode_tok_s_range=(n / max(decode_s), n / min(decode_s)),
        fraction_of_limit_range=(min(fractions), max(fractions)),
        trace_cost=1.0 - untraced,
        trace_cost_range=(1.0 - untraced_range[1], 1.0 - untraced_range[0]) if untraced_range else None,
        peak_rss_mb=memory.peak_bytes / 2**20, mapped_rss_mb=memory.mapped_bytes / 2**20,
        mapped_huge_mb=None if memory.mapped_huge_bytes is None else memory.mapped_huge_bytes / 2**20,
        latency_ns=(latencies[0], latencies[-1]),
        baseline_rss_mb=baseline / 2**20,
        peak_rss_excludes_probe=memory.resettable, probe_mb=probe_bytes / 2**20,
        model_bytes=sum(t.nbytes for t in model.tensors), cache_bytes=last_level_cache_bytes(),
        session_bytes=Session.memory_estimate(model, threads=threads, max_context=ctx, trace=False,
                                              numerics=numerics),
        n_sessions=1 + (traced is not None) + (default is not None),
        phases={part: {key: statistics.median(run[part][key] for run in phase_runs)
                       for key in ("ms", "mb", "gb_s")} for part in phase_runs[0]} if phase_runs else {},
        prefill_macs_per_token=macs, compute_probe=best_rates if pre_limit else None,
        prefill_limit_tok_s=pre_limit, **split,
        prefill_fraction_of_limit=statistics.median(pre_fractions) if pre_fractions else None,
        prefill_fraction_of_limit_range=(min(pre_fractions), max(pre_fractions)) if pre_fractions else None,
        **cost)


def latency_lines(r: BenchResult) -> list[str]:
    if r.latency_ns is None:
        return []
    before, after = r.latency_ns
    return [f"memory latency       {before:9.1f} ns    (same run, dependent loads in random order over "
            f"{r.probe_mb:.0f} MiB; before the runs, {after:.1f} after)"]


def _span(lo_hi: tuple[float, float], scale: float = 1.0) -> str:
    return f"{scale * lo_hi[0]:.1f}-{scale * lo_hi[1]:.1f}"


def limit_note(r: BenchResult) -> str:
    """Why a decode may beat the bandwidth limit, in words (empty when nothing needs saying)."""
    mb = r.model_bytes / 1e6
    if r.cache_bytes and r.model_bytes <= r.cache_bytes:
        return (f"the model's {mb:.1f} MB of weights fit in this machine's "
                f"{r.cache_bytes / 2**20:.0f} MiB last-level cache: decode reads them from the "
                "cache, not from memory, so it is not bandwidth-bound and the limit does not "
                "bind (a model larger than the cache is)")
    if r.fraction_of_limit > 1:
        cache = f" of {r.cache_bytes / 2**20:.0f} MiB" if r.cache_bytes else ""
        return ("above 100%: part of the weights stayed in the last-level cache"
                f"{cache} between tokens, or the probe ran at a slower moment than the decode")
    return ""


def memory_note(r: BenchResult) -> str:
    probe = (f"the {r.probe_mb:.0f} MiB bandwidth probe's buffer not counted"
             if r.peak_rss_excludes_probe else
             f"including the {r.probe_mb:.0f} MiB bandwidth probe's buffer (--probe-mb)")
    rest = r.peak_rss_mb - r.mapped_rss_mb - r.baseline_rss_mb
    sessions = r.n_sessions * r.session_bytes / 2**20
    return (f"{r.baseline_rss_mb:.1f} MiB of it the process before the model was opened "
            f"(the interpreter and its libraries), {r.mapped_rss_mb:.1f} MiB the mapped model file, "
            f"{rest:.1f} MiB the rest: {r.n_sessions} session(s), {sessions:.1f} MiB together, the worker "
            f"threads' stacks and the runs' arrays; {probe}")


def huge_page_lines(r: BenchResult) -> list[str]:
    """How much of the resident mapped file is in 2 MiB pages: a file whose pages came into the
    page cache some other way than through the engine's mapping (written just before, or read by
    another program's 4 KiB faults) may keep 4 KiB ones, and decode reads it a few % slower."""
    if r.mapped_huge_mb is None or r.mapped_rss_mb <= 0:
        return []
    share = 100 * r.mapped_huge_mb / r.mapped_rss_mb
    return [f"2 MiB pages          {share:9.1f}%  of the mapped file's {r.mapped_rss_mb:.1f} MiB resident "
            "(the rest 4 KiB pages, as the page cache held the file; 4 KiB pages decode a few % slower)"]


def trace_lines(r: BenchResult) -> list[str]:
    """The traced decode and what tracing cost it, from the repeats that ran both in turns."""
    spread = "" if r.trace_cost_range is None else (
        f"; repeats {100 * r.trace_cost_range[0]:+.1f} to {100 * r.trace_cost_range[1]:+.1f}%")
    return [f"decode, trace on     {r.trace_on_decode_tok_s:9.1f} tok/s  (cost {100 * r.trace_cost:+.1f}%, the median "
            f"of the repeats' pairs run in turns{spread})"]


def cost_lines(r: BenchResult) -> list[str]:
    """A numerics variant's cost against the default computation run in turns with it."""
    if r.decode_cost is None or r.prefill_cost is None or r.decode_cost_range is None \
            or r.prefill_cost_range is None:
        return []
    return [f"prefill, default     {r.default_prefill_tok_s:9.1f} tok/s  (exact numerics, in turns: the variant "
            f"takes {r.prefill_cost:.2f}x its time; repeats {r.prefill_cost_range[0]:.2f}-"
            f"{r.prefill_cost_range[1]:.2f}x)",
            f"decode, default      {r.default_decode_tok_s:9.1f} tok/s  (exact numerics, in turns: the variant "
            f"takes {r.decode_cost:.2f}x its time; repeats {r.decode_cost_range[0]:.2f}-"
            f"{r.decode_cost_range[1]:.2f}x)"]


def compute_lines(r: BenchResult) -> list[str]:
    """The prefill against the compute limit of the arithmetic its path uses."""
    if not r.prefill_macs_per_token:
        return ["prefill limit              -  (no compute probe for this path's arithmetic)"]
    total = sum(r.prefill_macs_per_token.values())
    split = ", ".join(f"{macs / 1e6:.1f} M {how}" for how, macs in sorted(
        r.prefill_macs_per_token.items(), key=lambda kv: -kv[1]))
    lines = [f"multiply-adds/token  {total / 1e6:9.1f} M  ({split}; the LM head of the last position)"]
    if r.compute_probe and r.prefill_limit_tok_s and r.prefill_fraction_of_limit is not None \
            and r.prefill_fraction_of_limit_range is not None:
        rates = ", ".join(f"{how} {rate / 1e9:.1f}" for how, rate in r.compute_probe.items() if rate)
        lines += [f"compute probe        {rates} G multiply-adds/s  (same run, {r.threads} thread(s), best)",
                  f"prefill limit        {r.prefill_limit_tok_s:9.1f} tok/s  (best probes)",
                  f"of the limit         {100 * r.prefill_fraction_of_limit:9.1f}%  (prefill; median over repeats; "
                  f"repeats {_span(r.prefill_fraction_of_limit_range, 100.0)}%)"]
    else:
        lines.append("prefill limit              -  (no compute probe for this path's arithmetic)")
    return lines


def thread_lines(r: BenchResult) -> list[str]:
    """How the decode's products split over the threads (none on one thread)."""
    if not r.decode_thread_shares or r.decode_worker_share_range is None \
            or r.decode_batches_per_token is None or r.decode_batches_entered is None:
        return []
    shares = " / ".join(f"{100 * share:.1f}" for share in r.decode_thread_shares)
    return [f"threads' work        {shares} %  (of the decode's multiply-adds, calling thread first, median; "
            f"the workers' {_span(r.decode_worker_share_range, 100.0)} % in the repeats)",
            f"shared batches       {r.decode_batches_per_token:9.1f} a token  (handed to every thread; the workers "
            f"entered {100 * r.decode_batches_entered:.1f} %)"]


def format_result(r: BenchResult) -> str:
    note = limit_note(r)
    return "\n".join([
        f"file                 {r.file}",
        f"kernels              {r.kernels}, {r.threads} thread(s)"
        + ("" if r.numerics == "default" else f", numerics {r.numerics}") + f"; engine ABI {r.engine_abi}",
        f"prefill              {r.prefill_tok_s:9.1f} tok/s  ({r.prompt_tokens} tokens, the last position's logits, "
        f"median of {r.repeats}; repeats {_span(r.prefill_tok_s_range)})",
        f"decode               {r.decode_tok_s:9.1f} tok/s  {r.decode_ms_per_token:.2f} ms/token ({r.decode_tokens} tokens; "
        f"repeats {_span(r.decode_tok_s_range)})",
        *cost_lines(r),
        f"weights per token    {r.weight_bytes_per_token / 1e6:9.1f} MB",
        f"KV cache per token   {r.kv_bytes_per_token / 1e6:9.2f} MB  (read by the heads, average over the decoded "
        "positions; not in the limit)",
        f"effective bandwidth  {r.effective_gb_s:9.2f} GB/s",
        f"probe bandwidth      {r.probe_gb_s:9.2f} GB/s  (same run, {r.threads} thread(s), best of {r.repeats + 1} probes)",
        *latency_lines(r),
        f"decode limit         {r.limit_tok_s:9.1f} tok/s  (best probe)",
        f"of the limit         {100 * r.fraction_of_limit:9.1f}%  (median over repeats, each against "
        f"the better probe beside it; repeats {_span(r.fraction_of_limit_range, 100.0)}%)",
        *([f"                     {note}"] if note else []),
        *thread_lines(r),
        *compute_lines(r),
        *trace_lines(r),
        f"session memory       {r.session_bytes / 2**20:9.2f} MiB (estimate, beyond the mapped weights)",
        f"peak RSS             {r.peak_rss_mb:9.1f} MiB  ({memory_note(r)})",
        *huge_page_lines(r),
        *(f"  {part:18s} {v['ms']:8.2f} ms/token  {v['mb']:8.1f} MB  {v['gb_s']:6.1f} GB/s  (traced run)"
          for part, v in r.phases.items()),
        *(["  (attention's bytes: its weights and the KV cache)"] if r.phases else []),
    ])
