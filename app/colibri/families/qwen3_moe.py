"""Qwen3-MoE (`qwen3_moe`): softmax over every expert, top-k, renormalised iff norm_topk_prob;
dense layers by mlp_only_layers and decoder_sparse_step; per-head q/k RMSNorm before RoPE;
attention_bias on q, k, v and o; a sliding window on every layer or none (it reuses
MixtralModel)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from colibri.families import common
from colibri.families.common import Architecture, Config, ConversionError, Planner
from colibri.fileformat import (ARCH_QWEN3_MOE, FLAG_O_BIAS, FLAG_QK_NORM_HEAD, FLAG_QKV_BIAS,
                                LAYER_DENSE, LAYER_MOE, NORM_NONE, NORM_SUM, RouteRule)

MODEL_TYPE = "qwen3_moe"
ALIASES = {"num_experts": "num_local_experts", "num_local_experts": "num_experts"}
DEFAULTS: dict[str, Any] = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
    num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=32768,
    rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
    use_sliding_window=False, sliding_window=4096, decoder_sparse_step=1,
    moe_intermediate_size=768, num_experts_per_tok=8, num_experts=128, norm_topk_prob=False,
    mlp_only_layers=None, bos_token_id=None, eos_token_id=None, rope_theta=10000.0)


def qwen_kinds(cfg: Config, n_layers: int) -> list[int]:
    """Qwen's rule: layer L is MoE iff L is not in mlp_only_layers and (L+1) % decoder_sparse_step
    == 0."""
    mlp_only = set(cfg.int_list("mlp_only_layers"))
    step = cfg.int("decoder_sparse_step")
    return [LAYER_MOE if i not in mlp_only and (i + 1) % step == 0 else LAYER_DENSE
            for i in range(n_layers)]


def window_size(cfg: Config) -> int:
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ConversionError(f"config.json: sliding_window = {window!r}, expected an integer "
                              ">= 1")
    return window


def architecture(cfg: Config) -> Architecture:
    n_layers = cfg.int("num_hidden_layers")
    kinds = qwen_kinds(cfg, min(n_layers, 1025))
    hp = common.base_hparams(cfg, ARCH_QWEN3_MOE, cfg.int("num_experts"),
                             cfg.int("num_experts_per_tok"), cfg.int("moe_intermediate_size"),
                             cfg.int("intermediate_size") if LAYER_DENSE in kinds else 0)
    hp = common.apply_rope(hp, common.rope(cfg))
    flags = hp.flags | FLAG_QK_NORM_HEAD
    if cfg.get("attention_bias"):
        flags |= FLAG_QKV_BIAS | FLAG_O_BIAS
    sliding = bool(cfg.get("use_sliding_window"))  # sliding_window is dropped otherwise
    hp = replace(hp, flags=flags, sliding_window=window_size(cfg) if sliding else 0)
    rule = RouteRule(normalize=NORM_SUM if cfg.get("norm_topk_prob") else NORM_NONE)
    return Architecture(hp, kinds, [rule if k == LAYER_MOE else None for k in kinds],
                        common.attention_masks(hp.n_layers, [sliding] * hp.n_layers))


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    prefix = common.layer_start(p, a, layer)
    if prefix:
        common.moe_block(p, a, layer, prefix)
