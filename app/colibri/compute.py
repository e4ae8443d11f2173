"""The compute limit of a prefill: the multiply-adds one prompt token costs, split by the
arithmetic that makes them, against the machine's multiply-add throughput for each (the compute
probe, `colibri.engine.measure_compute`).

A prefill of P tokens multiplies every weight it reads by P activation rows, so past a few dozen
tokens it is bound by arithmetic, not by memory. Its multiply-adds per token come from the file's
shapes: every matrix of the attention projections, the router, the shared experts and dense MLPs,
k / n_experts of each stacked expert tensor, the LM head once for the last position (1 / P of it
per token), and the attention heads' scores and weighted values over the keys each position sees.
Which instruction makes them depends on the weight's dtype and the engine's numerics: f32, f16
and exact bf16 weights (activations kept f32) multiply with f32 FMA, `dot-bf16` (and llama.cpp's
bf16) with bf16 pair dot products, q8_0 and q4_0 with int8 dot products; the heads with f32 FMA.
The limit is P over the time the arithmetic takes at the probed rates: no kernel can beat it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from colibri.engine import BLOCK_DTYPE_NAMES, Model, measure_compute
from colibri.fileformat import BF16_NAMES, FLAG_TIED_EMBEDDINGS, LAYER_CHUNKED, LAYER_SLIDING

_EXPERT_MATS = ("moe_w1", "moe_w2", "moe_w3")
HEADS = "heads"  # the attention heads' products (f32, whatever the weights' dtype)


def prefill_macs(model: Model, prompt: int) -> dict[str, float]:
    """Multiply-adds per token of a `prompt`-token prefill computing the last position's logits,
    by the dtype of the weights they multiply ('f32', 'bf16', 'q8_0', ...) and HEADS. Vectors
    (norms, biases) and the embedding lookup make none; a tied embedding is the LM head."""
    hp = model.hparams
    out: dict[str, float] = {}

    def add(kind: str, macs: float) -> None:
        out[kind] = out.get(kind, 0.0) + macs

    names = {t.name for t in model.tensors}
    for t in model.tensors:
        base = t.name.rsplit(".", 1)[-1]
        if len(t.shape) < 2 or base.endswith("_bias") or t.name == "rope_freq_factors":
            continue
        elements = 1
        for d in t.shape:
            elements *= d
        if t.name == "token_embd":
            if "output" not in names and hp.flags & FLAG_TIED_EMBEDDINGS:
                add(t.dtype, elements / prompt)  # tied: the LM head, last position only
        elif t.name == "output":
            add(t.dtype, elements / prompt)
        elif base in _EXPERT_MATS:
            add(t.dtype, elements * hp.n_experts_active / hp.n_experts)
        else:
            add(t.dtype, elements)
    add(HEADS, _head_macs(model, prompt))
    return out


def _head_macs(model: Model, prompt: int) -> float:
    """Scores and weighted values of every query head over the keys each position attends to,
    per token of the prompt."""
    hp = model.hparams
    if hp.attention == 1:  # latent: keys of kv_lora_rank + rope dims, values of kv_lora_rank
        per_key = hp.n_heads * (2 * hp.kv_lora_rank + hp.qk_rope_head_dim)
    else:
        per_key = hp.n_heads * (hp.head_dim + (hp.v_head_dim or hp.head_dim))
    return per_key * attended_keys(model, 0, prompt) / prompt


def attended_keys(model: Model, first: int, n: int) -> int:
    """Keys the positions first..first+n-1 attend to, summed over positions and layers: all before
    a position and itself, the sliding window of a sliding layer, or the chunk so far of a chunked
    one."""
    hp = model.hparams
    total = 0
    for layer in range(hp.n_layers):
        mask = model.routing(layer).attention
        for pos in range(first, first + n):
            if mask == LAYER_SLIDING and hp.sliding_window > 0:
                total += min(pos + 1, hp.sliding_window)
            elif mask == LAYER_CHUNKED and hp.attention_chunk_size > 0:
                total += pos % hp.attention_chunk_size + 1
            else:
                total += pos + 1
    return total


def colibri_arithmetic(kernels: str, dot_bf16: bool) -> Callable[[str], str | None]:
    """The arithmetic Colibri's kernel path `kernels` multiplies each dtype's weights with (None:
    not probed: bf16 rows on the AMX tiles; bf16x16 panels run the vector kernels there)."""
    def arithmetic(kind: str) -> str | None:
        if kind in BLOCK_DTYPE_NAMES:
            return "int8 dot"
        if kind in BF16_NAMES.values():
            if dot_bf16:
                return "bf16 dot"
            return None if kernels == "amx" and kind == "bf16" else "f32 FMA"
        return "f32 FMA"
    return arithmetic


def llamacpp_arithmetic(kind: str) -> str | None:
    """The arithmetic llama.cpp and ik_llama.cpp multiply each dtype's weights with on a CPU with
    AVX512-BF16: bf16 rows by bf16 dot products (the activations rounded to bf16), q8_0 and q4_0
    by int8 dot products against q8 activations, the rest in f32."""
    if kind in BLOCK_DTYPE_NAMES:
        return "int8 dot"
    return "bf16 dot" if kind in BF16_NAMES.values() else "f32 FMA"


def arithmetic_macs(macs: Mapping[str, float],
                    arithmetic: Callable[[str], str | None]) -> dict[str, float] | None:
    """`prefill_macs` regrouped by arithmetic; None if some of it has no probe."""
    out: dict[str, float] = {}
    for kind, n in macs.items():
        how = arithmetic(kind)
        if how is None:
            return None
        out[how] = out.get(how, 0.0) + n
    return out


def probe(arithmetics: list[str], threads: int, kernels: str | None = None,
          repeats: int = 5) -> dict[str, float | None]:
    """Multiply-adds per second of each arithmetic on this machine, same threads."""
    return {a: measure_compute(a, threads, kernels, repeats) for a in arithmetics}


def limit_tok_s(macs: Mapping[str, float] | None, rates: Mapping[str, float | None]) -> float | None:
    """Prompt tokens per second if every multiply-add ran at its probed rate (None: no probe)."""
    if not macs:
        return None
    seconds = 0.0
    for how, n in macs.items():
        rate = rates.get(how)
        if not rate:
            return None
        seconds += n / rate
    return 1.0 / seconds if seconds > 0 else None
