"""OLMoE (`olmoe`): softmax over every expert, top-k, renormalised iff norm_topk_prob; every
layer MoE with Mixtral's experts (intermediate_size); RMSNorm over the whole projected q and k,
then clip_qkv."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from colibri.families import common
from colibri.families.common import Architecture, Config, Planner
from colibri.fileformat import (ARCH_OLMOE, FLAG_O_BIAS, FLAG_QK_NORM_FULL, FLAG_QKV_BIAS,
                                LAYER_MOE, NORM_NONE, NORM_SUM, RouteRule)

MODEL_TYPE = "olmoe"
ALIASES = {"num_experts": "num_local_experts", "num_local_experts": "num_experts"}
DEFAULTS: dict[str, Any] = dict(
    vocab_size=50304, hidden_size=2048, intermediate_size=2048, num_hidden_layers=16,
    num_attention_heads=16, num_key_value_heads=None, max_position_embeddings=4096,
    rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=50279, tie_word_embeddings=False,
    attention_bias=False, clip_qkv=None, num_experts_per_tok=8, num_experts=64,
    norm_topk_prob=False, rope_theta=10000.0)


def architecture(cfg: Config) -> Architecture:
    hp = common.base_hparams(cfg, ARCH_OLMOE, cfg.int("num_experts"),
                             cfg.int("num_experts_per_tok"), cfg.int("intermediate_size"), 0)
    hp = common.apply_rope(hp, common.rope(cfg))
    flags = hp.flags | FLAG_QK_NORM_FULL
    if cfg.get("attention_bias"):
        flags |= FLAG_QKV_BIAS | FLAG_O_BIAS  # attention_bias covers q, k, v and o
    clip = cfg.get("clip_qkv")
    hp = replace(hp, flags=flags,
                 clip_qkv=0.0 if clip is None else common.positive_number(clip, "clip_qkv"))
    rule = RouteRule(normalize=NORM_SUM if cfg.get("norm_topk_prob") else NORM_NONE)
    n = hp.n_layers
    return Architecture(hp, [LAYER_MOE] * n, [rule] * n, common.attention_masks(n, None))


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    common.norms(p, a, layer)
    common.gqa_attention(p, a, layer)
    prefix = f"model.layers.{layer}.mlp"
    common.router(p, a, layer, f"{prefix}.gate.weight")
    common.routed_experts(p, a, layer, prefix)
