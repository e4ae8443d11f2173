"""ERNIE 4.5 MoE (`ernie4_5_moe`): a softmax over every expert plus moe_statics'
e_score_correction_bias for the choice, the chosen probabilities divided by max(their sum,
moe_norm_min); shared experts; MoE on the layers moe_layer_start_index..moe_layer_end_index whose
(L+1) is a multiple of moe_layer_interval, dense elsewhere; RoPE interleaved; tied embeddings by
default."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from colibri.families import common
from colibri.families.common import Architecture, Config, ConversionError, Planner
from colibri.fileformat import (ARCH_ERNIE4_5_MOE, LAYER_DENSE, LAYER_MOE, NORM_SUM_CLAMPED,
                                ROPE_INTERLEAVED, SHARED_NONE, SHARED_PLAIN, RouteRule)

MODEL_TYPE = "ernie4_5_moe"
ALIASES = {"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"}
DEFAULTS: dict[str, Any] = dict(
    vocab_size=103424, bos_token_id=1, eos_token_id=2, hidden_size=2560,
    intermediate_size=12288, num_hidden_layers=28, num_attention_heads=20, num_key_value_heads=4,
    max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True, use_bias=False,
    moe_intermediate_size=1536, moe_k=6, moe_num_experts=64, moe_num_shared_experts=2,
    moe_layer_start_index=1, moe_layer_end_index=-1, moe_layer_interval=1, moe_norm_min=1e-12,
    rope_theta=500000.0)


def architecture(cfg: Config) -> Architecture:
    common.refuse(cfg, "use_bias", "biases on every projection, the MLPs' included")
    n_layers = cfg.int("num_hidden_layers")
    start = cfg.int("moe_layer_start_index", minimum=0)
    end = cfg.get("moe_layer_end_index")
    end = n_layers - 1 if end == -1 else cfg.int("moe_layer_end_index", minimum=0)
    interval = cfg.int("moe_layer_interval")
    kinds = [LAYER_MOE if (i + 1) % interval == 0 and start <= i <= end else LAYER_DENSE
             for i in range(min(n_layers, 1025))]
    hp = common.base_hparams(cfg, ARCH_ERNIE4_5_MOE, cfg.int("moe_num_experts"),
                             cfg.int("moe_k"), cfg.int("moe_intermediate_size"),
                             cfg.int("intermediate_size") if LAYER_DENSE in kinds else 0)
    if LAYER_MOE not in kinds:
        raise ConversionError("config.json: no layer is MoE (moe_layer_start_index, "
                              "moe_layer_end_index, moe_layer_interval)")
    n_shared = cfg.int("moe_num_shared_experts", minimum=0)
    hp = replace(common.apply_rope(hp, common.rope(cfg)), rope_layout=ROPE_INTERLEAVED,
                 d_ff_shared=hp.d_ff_expert * n_shared)
    rule = RouteRule(correction_bias=True, normalize=NORM_SUM_CLAMPED,
                     norm_eps=cfg.number("moe_norm_min"),
                     shared=SHARED_PLAIN if n_shared else SHARED_NONE)
    return Architecture(hp, kinds, [rule if k == LAYER_MOE else None for k in kinds],
                        common.attention_masks(hp.n_layers, None))


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    prefix = common.layer_start(p, a, layer)
    if not prefix:
        return
    # moe_statics sits under the router in memory, beside it in the per-expert save
    statics = next((f"{pre}.moe_statics.e_score_correction_bias"
                    for pre in (prefix, f"{prefix}.gate")
                    if p.has(f"{pre}.moe_statics.e_score_correction_bias")),
                   f"{prefix}.moe_statics.e_score_correction_bias")
    common.moe_block(p, a, layer, prefix, statics, bias_source_shape=(1, a.hp.n_experts))
