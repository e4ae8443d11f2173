"""GLM-4.5 / 4.6 (`glm4_moe`): DeepSeek-V3's router (sigmoid, e_score_correction_bias, groups by
their top-2 sums, norm_topk_prob, routed_scaling_factor), shared experts and
first_k_dense_replace dense layers, on grouped-query attention with q/k/v biases
(attention_bias), optional per-head q/k RMSNorm (use_qk_norm) and RoPE on the first
partial_rotary_factor of each head (0.5 by default), paired as halves."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from colibri.families import common
from colibri.families.common import Architecture, Config, Planner
from colibri.families.deepseek_v3 import route_rule
from colibri.fileformat import (ARCH_GLM4_MOE, FLAG_QK_NORM_HEAD, FLAG_QKV_BIAS, LAYER_DENSE,
                                LAYER_MOE, SHARED_NONE, SHARED_PLAIN)

MODEL_TYPE = "glm4_moe"
ALIASES = {"num_local_experts": "n_routed_experts", "num_experts": "n_routed_experts"}
DEFAULTS: dict[str, Any] = dict(
    vocab_size=151552, hidden_size=4096, intermediate_size=10944, num_hidden_layers=46,
    num_attention_heads=96, num_key_value_heads=8, max_position_embeddings=131072,
    rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
    moe_intermediate_size=1408, num_experts_per_tok=8, n_shared_experts=1, n_routed_experts=128,
    routed_scaling_factor=1.0, n_group=1, topk_group=1, first_k_dense_replace=1,
    norm_topk_prob=True, use_qk_norm=False, bos_token_id=None, eos_token_id=None,
    rope_theta=10000.0, partial_rotary_factor=0.5)


def architecture(cfg: Config) -> Architecture:
    first_dense = cfg.int("first_k_dense_replace", minimum=0)
    hp = common.base_hparams(cfg, ARCH_GLM4_MOE, cfg.int("n_routed_experts"),
                             cfg.int("num_experts_per_tok"), cfg.int("moe_intermediate_size"),
                             cfg.int("intermediate_size"))
    kinds = [LAYER_DENSE if i < first_dense else LAYER_MOE for i in range(hp.n_layers)]
    hp = common.apply_rope(hp, common.rope(cfg))
    flags = hp.flags
    if cfg.flag("attention_bias"):
        flags |= FLAG_QKV_BIAS  # q, k and v; o_proj never has one
    if cfg.flag("use_qk_norm"):
        flags |= FLAG_QK_NORM_HEAD
    n_shared = cfg.int("n_shared_experts", minimum=0)
    hp = replace(hp, flags=flags, d_ff_dense=hp.d_ff_dense if LAYER_DENSE in kinds else 0,
                 d_ff_shared=hp.d_ff_expert * n_shared)
    rule = route_rule(cfg, hp.n_experts, hp.n_experts_active,
                      SHARED_PLAIN if n_shared else SHARED_NONE)
    return Architecture(hp, kinds, [rule if k == LAYER_MOE else None for k in kinds],
                        common.attention_masks(hp.n_layers, None))


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    prefix = common.layer_start(p, a, layer)
    if prefix:
        common.moe_block(p, a, layer, prefix, f"{prefix}.gate.e_score_correction_bias")
