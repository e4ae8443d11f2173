"""PhiMoE (`phimoe`, Phi-3.5-MoE): sparsemixer routing (transformers' eval path: the best logit,
then the best of the rest, each weighted by a softmax over the logits within 2 *
router_jitter_noise of it, always two experts); LayerNorm with bias for every norm; q/k/v/o
biases (attention_bias) and an LM-head bias (lm_head_bias); Mixtral's experts and optional
sliding window on every layer; default RoPE, or Phi-3.5's LongRoPE as transformers 5.23 runs it
for PhiMoE (the short factors divide the frequencies at every length, cos and sin times
short_mscale, long_mscale past original_max_position_embeddings). Experts per expert as block_sparse_moe.experts.E.w1/w2/w3 with the
router block_sparse_moe.gate, or fused under mlp.experts with the router mlp.router."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from colibri.families import common
from colibri.families.common import Architecture, Config, ConversionError, Planner
from colibri.families.mixtral import sliding_window
from colibri.fileformat import (ARCH_PHIMOE, FLAG_O_BIAS, FLAG_OUTPUT_BIAS, FLAG_QKV_BIAS,
                                LAYER_MOE, NORM_KIND_LAYER_BIAS, ROPE_LONGROPE,
                                SCORING_SPARSEMIXER, SELECT_LOGITS, RouteRule)

MODEL_TYPE = "phimoe"
ALIASES = {"num_experts": "num_local_experts", "num_local_experts": "num_experts"}
DEFAULTS: dict[str, Any] = dict(
    vocab_size=32064, hidden_size=4096, intermediate_size=6400, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, hidden_act="silu",
    max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False, sliding_window=None, num_experts_per_tok=2, num_local_experts=16,
    router_jitter_noise=0.01, attention_bias=False, lm_head_bias=False, rope_theta=1e6)

# sparsemixer picks two experts whatever num_experts_per_tok says (its top_k argument is unused)
SPARSEMIXER_K = 2


def longrope(cfg: Config, head_dim: int, max_context: int, notes: list[str]
             ) -> tuple[common.Rope, np.ndarray, int] | None:
    """PhiMoE's LongRoPE as PhimoeRotaryEmbedding computes it (None for another RoPE type):
    inv_freq = 1 / (short_factor * theta^(2i/d)) whatever the length (it never asks for the long
    factors), cos and sin times short_mscale while the forward's last position is below
    original_max_position_embeddings, else long_mscale. Returns the RoPE fields, the factors
    and the context the file may declare: beyond original_max_position_embeddings with two
    different mscales transformers' result depends on how the tokens are batched, so the context
    stops there."""
    params = cfg.raw.get("rope_parameters") or cfg.raw.get("rope_scaling") or {}
    if not isinstance(params, dict) or params.get("rope_type", params.get("type")) != "longrope":
        return None
    theta = common.positive_number(params.get("rope_theta", cfg.raw.get(
        "rope_theta", cfg.defaults["rope_theta"])), "rope_theta")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConversionError("config.json: partial_rotary_factor with PhiMoE's LongRoPE is not "
                              "supported (transformers rotates every dimension)")
    short = params.get("short_factor")
    if not isinstance(short, list) or len(short) != head_dim // 2:
        raise ConversionError(f"config.json: LongRoPE short_factor = {short!r}, expected a list "
                              f"of {head_dim // 2} numbers (head_dim / 2)")
    factors = np.array([common.positive_number(v, "LongRoPE short_factor") for v in short],
                       dtype=np.float32)
    short_mscale, long_mscale = (common.positive_number(params.get(k), f"LongRoPE {k}")
                                 for k in ("short_mscale", "long_mscale"))
    original = params.get("original_max_position_embeddings",
                          cfg.raw.get("original_max_position_embeddings"))
    if isinstance(original, bool) or not isinstance(original, int) or original < 1:
        raise ConversionError(f"config.json: LongRoPE original_max_position_embeddings = "
                              f"{original!r}, expected an integer >= 1")
    if long_mscale != short_mscale and max_context > original:
        notes.append(f"LongRoPE: long_mscale {long_mscale} differs from short_mscale "
                     f"{short_mscale}, which transformers uses up to "
                     f"original_max_position_embeddings {original}; the context is {original}")
        max_context = original
    return common.Rope(ROPE_LONGROPE, theta, attn_factor=short_mscale), factors, max_context


def architecture(cfg: Config) -> Architecture:
    common.silu_only(cfg)
    n_experts = cfg.int("num_local_experts")
    if n_experts < SPARSEMIXER_K:
        raise ConversionError(f"config.json: num_local_experts = {n_experts}; sparsemixer "
                              f"chooses {SPARSEMIXER_K} experts")
    notes = []
    top_k = cfg.int("num_experts_per_tok")
    if top_k != SPARSEMIXER_K:
        notes.append(f"num_experts_per_tok {top_k}: PhiMoE's sparsemixer routes every token to "
                     f"{SPARSEMIXER_K} experts whatever it says; stored as {SPARSEMIXER_K}")
    hp = common.base_hparams(cfg, ARCH_PHIMOE, n_experts, SPARSEMIXER_K,
                             cfg.int("intermediate_size"), 0)
    flags = hp.flags
    if cfg.flag("attention_bias"):
        flags |= FLAG_QKV_BIAS | FLAG_O_BIAS  # q, k, v and o alike
    if cfg.flag("lm_head_bias"):
        flags |= FLAG_OUTPUT_BIAS
    long = longrope(cfg, hp.head_dim, hp.max_context, notes)
    rope, constants = (common.rope(cfg), {}) if long is None else (long[0], {
        "rope_freq_factors": long[1]})
    hp = replace(common.apply_rope(hp, rope), flags=flags, norm_kind=NORM_KIND_LAYER_BIAS,
                 sliding_window=sliding_window(cfg),
                 max_context=hp.max_context if long is None else long[2])
    rule = RouteRule(scoring=SCORING_SPARSEMIXER, select_on=SELECT_LOGITS,
                     sparsemixer_eps=cfg.number("router_jitter_noise"))
    n = hp.n_layers
    return Architecture(hp, [LAYER_MOE] * n, [rule] * n,
                        common.attention_masks(n, [hp.sliding_window > 0] * n), notes,
                        constants=constants)


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    common.norms(p, a, layer)
    common.gqa_attention(p, a, layer)
    base = f"model.layers.{layer}"
    # the per-expert save names the block `block_sparse_moe` and the router `gate`; in memory
    # (and the fused save) they are `mlp` and `router`
    fused = p.has(f"{base}.mlp.experts.gate_up_proj") or p.has(f"{base}.mlp.experts.down_proj")
    router = f"{base}.mlp.router.weight" if fused or p.has(f"{base}.mlp.router.weight") \
        else f"{base}.block_sparse_moe.gate.weight"
    common.router(p, a, layer, router)
    common.routed_experts(p, a, layer, f"{base}.block_sparse_moe", common.MIXTRAL_EXPERT_NAMES,
                          fused_prefix=f"{base}.mlp")
