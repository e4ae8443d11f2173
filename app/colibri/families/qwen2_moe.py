"""Qwen2-MoE (`qwen2_moe`): softmax over every expert, top-k, renormalised iff norm_topk_prob;
a shared expert scaled by sigmoid(shared_expert_gate . x); dense layers by mlp_only_layers and
decoder_sparse_step; q/k/v biases (qkv_bias); sliding windows on the layers that
Qwen2MoeConfig's layer_types make sliding."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from colibri.families import common
from colibri.families.common import Architecture, Config, ConversionError, Planner
from colibri.families.qwen3_moe import qwen_kinds, window_size
from colibri.fileformat import (ARCH_QWEN2_MOE, FLAG_QKV_BIAS, LAYER_DENSE, LAYER_MOE, NORM_NONE,
                                NORM_SUM, SHARED_NONE, SHARED_SIGMOID_GATE, RouteRule)

MODEL_TYPE = "qwen2_moe"
ALIASES = {"num_experts": "num_local_experts", "num_local_experts": "num_experts"}
DEFAULTS: dict[str, Any] = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
    num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=32768,
    rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
    sliding_window=4096, max_window_layers=28, decoder_sparse_step=1,
    moe_intermediate_size=1408, shared_expert_intermediate_size=5632, num_experts_per_tok=4,
    num_experts=60, norm_topk_prob=False, mlp_only_layers=None, qkv_bias=True,
    layer_types=None, bos_token_id=None, eos_token_id=None, rope_theta=10000.0)


def sliding_layers(cfg: Config, n_layers: int) -> list[bool]:
    if not cfg.get("use_sliding_window"):
        return [False] * n_layers  # sliding_window is dropped unless use_sliding_window
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        # Qwen2MoeConfig.__post_init__'s rule when layer_types is not given.
        mwl = cfg.int("max_window_layers", minimum=0)
        layer_types = ["sliding_attention" if (i + 1) % 2 and i < mwl else "full_attention"
                       for i in range(n_layers)]
    if not isinstance(layer_types, list) or len(layer_types) != n_layers:
        raise ConversionError(f"config.json: layer_types = {layer_types!r}, expected a list "
                              f"of {n_layers} layer type names")
    return [t == "sliding_attention" for t in layer_types]


def architecture(cfg: Config) -> Architecture:
    n_layers = cfg.int("num_hidden_layers")
    kinds = qwen_kinds(cfg, min(n_layers, 1025))
    hp = common.base_hparams(cfg, ARCH_QWEN2_MOE, cfg.int("num_experts"),
                             cfg.int("num_experts_per_tok"), cfg.int("moe_intermediate_size"),
                             cfg.int("intermediate_size") if LAYER_DENSE in kinds else 0)
    hp = replace(common.apply_rope(hp, common.rope(cfg)),
                 d_ff_shared=cfg.int("shared_expert_intermediate_size", minimum=0))
    if cfg.get("qkv_bias"):
        hp = replace(hp, flags=hp.flags | FLAG_QKV_BIAS)  # q/k/v biases, never an o bias
    sliding = sliding_layers(cfg, hp.n_layers)
    if any(sliding):
        hp = replace(hp, sliding_window=window_size(cfg))
    rule = RouteRule(normalize=NORM_SUM if cfg.get("norm_topk_prob") else NORM_NONE,
                     shared=SHARED_SIGMOID_GATE if hp.d_ff_shared else SHARED_NONE)
    return Architecture(hp, kinds, [rule if k == LAYER_MOE else None for k in kinds],
                        common.attention_masks(hp.n_layers, sliding))


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    prefix = common.layer_start(p, a, layer)
    if not prefix:
        return
    common.moe_block(p, a, layer, prefix, shared="shared_expert")
    if a.rule(layer).shared != SHARED_NONE:
        p.single(f"layers.{layer}.shared_gate", f"{prefix}.shared_expert_gate.weight",
                 (1, a.hp.d_model))
