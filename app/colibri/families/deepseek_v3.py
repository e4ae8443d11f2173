"""DeepSeek-V3 (`deepseek_v3`; Kimi-K2-style checkpoints too): sigmoid scores, the
e_score_correction_bias added for the choice only, experts in n_group groups of which the
topk_group with the best top-2 sums are eligible, weights renormalised (norm_topk_prob, + 1e-20)
and scaled by routed_scaling_factor; shared experts; the first first_k_dense_replace layers
dense; multi-head latent attention with RoPE interleaved (rope_interleave) on the rope part."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from colibri.families import common, deepseek_v2
from colibri.families.common import Architecture, Config, ConversionError, Planner
from colibri.fileformat import (ARCH_DEEPSEEK_V3, GROUP_NONE, GROUP_TOP2_SUM, NORM_NONE, NORM_SUM,
                                ROPE_HALVES, ROPE_INTERLEAVED, SCORING_SIGMOID, RouteRule)

MODEL_TYPE = "deepseek_v3"
ALIASES = {"num_local_experts": "n_routed_experts", "num_experts": "n_routed_experts"}
DEFAULTS: dict[str, Any] = dict(
    vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
    num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
    n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536,
    qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4,
    num_experts_per_tok=8, first_k_dense_replace=3, norm_topk_prob=True,
    max_position_embeddings=4096, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=1,
    tie_word_embeddings=False, rope_interleave=True, attention_bias=False, rope_theta=10000.0)


def route_rule(cfg: Config, n_experts: int, top_k: int, shared: int) -> RouteRule:
    """DeepSeek-V3's router (also GLM-4.5's): always the grouped path; n_group 1 is no limit."""
    n_group = cfg.int("n_group")
    topk_group = cfg.int("topk_group")
    if n_experts % n_group:
        raise ConversionError(f"config.json: n_group {n_group} does not divide the "
                              f"{n_experts} routed experts")
    if topk_group > n_group or topk_group * (n_experts // n_group) < top_k:
        raise ConversionError(f"config.json: topk_group {topk_group} of n_group {n_group} cannot "
                              f"hold num_experts_per_tok {top_k}")
    grouped = n_group > 1
    return RouteRule(scoring=SCORING_SIGMOID, correction_bias=True,
                     n_groups=n_group, n_groups_kept=topk_group if grouped else 1,
                     group_score=GROUP_TOP2_SUM if grouped else GROUP_NONE,
                     normalize=NORM_SUM if cfg.get("norm_topk_prob") else NORM_NONE,
                     norm_eps=1e-20 if cfg.get("norm_topk_prob") else 0.0,
                     scale=cfg.number("routed_scaling_factor", strict=True), shared=shared)


def architecture(cfg: Config) -> Architecture:
    a = deepseek_v2.deepseek_architecture(cfg, ARCH_DEEPSEEK_V3, route_rule)
    a.hp = replace(a.hp, rope_layout=ROPE_INTERLEAVED if cfg.flag("rope_interleave")
                   else ROPE_HALVES)
    return a


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    deepseek_v2.deepseek_layer(p, a, layer, "mlp.gate.e_score_correction_bias")
