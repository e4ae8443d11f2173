"""DeepSeek-V2 (`deepseek_v2`): a softmax over every expert, top-k (`greedy`) or top-k within
the topk_group groups with the best expert (`group_limited_greedy`), the weights scaled by
routed_scaling_factor and never renormalised (transformers 5.23 ignores norm_topk_prob here);
shared experts; the first first_k_dense_replace layers dense; multi-head latent attention with
interleaved RoPE (a complex multiply) on the rope part. Also the shared body of DeepSeek-V3."""

from __future__ import annotations

from dataclasses import replace
import math
from typing import Any, Callable

from colibri.families import common
from colibri.families.common import Architecture, Config, ConversionError, Planner
from colibri.fileformat import (ARCH_DEEPSEEK_V2, ATTENTION_MLA, FLAG_O_BIAS, FLAG_QKV_BIAS,
                                GROUP_MAX, GROUP_NONE, LAYER_DENSE, LAYER_MOE, NORM_NONE,
                                ROPE_DEFAULT, ROPE_INTERLEAVED, SHARED_NONE, SHARED_PLAIN,
                                RouteRule)

MODEL_TYPE = "deepseek_v2"
ALIASES = {"num_experts": "n_routed_experts", "num_local_experts": "n_routed_experts"}
DEFAULTS: dict[str, Any] = dict(
    vocab_size=102400, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=None, max_position_embeddings=2048,
    rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    attention_bias=False, mlp_bias=False, first_k_dense_replace=0, kv_lora_rank=512,
    q_lora_rank=1536, n_group=None, n_routed_experts=64, n_shared_experts=2,
    qk_nope_head_dim=128, qk_rope_head_dim=64, routed_scaling_factor=1.0, topk_group=None,
    topk_method="greedy", v_head_dim=128, num_experts_per_tok=None, moe_intermediate_size=1407,
    rope_theta=10000.0)

# The epsilon of q_a_layernorm and kv_a_layernorm: built without one, so 1e-6 whatever
# rms_norm_eps says.
LATENT_NORM_EPS = 1e-6


def route_rule(cfg: Config, n_experts: int, top_k: int, shared: int) -> RouteRule:
    method = cfg.get("topk_method")
    scale = cfg.number("routed_scaling_factor", strict=True)
    if method == "greedy":
        return RouteRule(scale=scale, shared=shared)
    if method != "group_limited_greedy":
        raise ConversionError(f"config.json: topk_method = {method!r} not supported "
                              "(supported: 'greedy', 'group_limited_greedy')")
    n_group, topk_group = cfg.int("n_group"), cfg.int("topk_group")
    if n_experts % n_group or topk_group > n_group or \
            topk_group * (n_experts // n_group) < top_k:
        raise ConversionError(f"config.json: n_group {n_group} / topk_group {topk_group} do not "
                              f"fit {n_experts} experts and num_experts_per_tok {top_k}")
    return RouteRule(n_groups=n_group, n_groups_kept=topk_group,
                     group_score=GROUP_MAX if n_group > 1 else GROUP_NONE,
                     normalize=NORM_NONE, scale=scale, shared=shared)


def _mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def deepseek_architecture(cfg: Config, arch: int,
                          rule: Callable[[Config, int, int, int], RouteRule]) -> Architecture:
    """What DeepSeek-V2 and -V3 configs share: layer kinds, shared experts, MLA and its RoPE."""
    common.refuse(cfg, "mlp_bias", "biases on the dense and shared-expert projections")
    nope, r = cfg.int("qk_nope_head_dim"), cfg.int("qk_rope_head_dim")
    top_k = cfg.get("num_experts_per_tok")
    if top_k is None:
        raise ConversionError("config.json: num_experts_per_tok is not set (it has no default)")
    n_experts = cfg.int("n_routed_experts")
    hp = common.base_hparams(cfg, arch, n_experts, cfg.int("num_experts_per_tok"),
                             cfg.int("moe_intermediate_size"), cfg.int("intermediate_size"),
                             head_dim=nope + r)
    if hp.n_kv_heads != hp.n_heads:
        raise ConversionError(f"config.json: num_key_value_heads {hp.n_kv_heads} != "
                              f"num_attention_heads {hp.n_heads}: MLA expands its latent to "
                              "every head")
    first_dense = cfg.int("first_k_dense_replace", minimum=0)
    kinds = [LAYER_DENSE if i < first_dense else LAYER_MOE for i in range(hp.n_layers)]
    n_shared = cfg.int("n_shared_experts", minimum=0) if cfg.get("n_shared_experts") else 0
    shared = SHARED_PLAIN if n_shared else SHARED_NONE
    r_cfg = common.rope(cfg)
    q_lora = cfg.get("q_lora_rank")
    hp = replace(r_cfg.apply(hp), d_ff_dense=hp.d_ff_dense if LAYER_DENSE in kinds else 0,
                 d_ff_shared=hp.d_ff_expert * n_shared, attention=ATTENTION_MLA,
                 q_lora_rank=0 if q_lora is None else cfg.int("q_lora_rank"),
                 kv_lora_rank=cfg.int("kv_lora_rank"), qk_nope_head_dim=nope,
                 qk_rope_head_dim=r, v_head_dim=cfg.int("v_head_dim"), rotary_dim=r,
                 rope_layout=ROPE_INTERLEAVED, latent_norm_eps=LATENT_NORM_EPS)
    if cfg.flag("attention_bias"):
        hp = replace(hp, flags=hp.flags | FLAG_QKV_BIAS | FLAG_O_BIAS)  # q_a, kv_a and o
    # the softmax scale, times YaRN's mscale squared as DeepSeek's attention applies it
    scaling = (nope + r) ** -0.5
    mscale_all = r_cfg.params.get("mscale_all_dim") or 0
    if r_cfg.type != ROPE_DEFAULT and mscale_all:
        m = _mscale(common.positive_number(r_cfg.params.get("factor"), "RoPE factor"),
                    common.positive_number(mscale_all, "mscale_all_dim"))
        scaling = scaling * m * m
    hp = replace(hp, attn_scale=scaling)
    route = rule(cfg, n_experts, hp.n_experts_active, shared)
    return Architecture(hp, kinds, [route if k == LAYER_MOE else None for k in kinds],
                        common.attention_masks(hp.n_layers, None))


def architecture(cfg: Config) -> Architecture:
    return deepseek_architecture(cfg, ARCH_DEEPSEEK_V2, route_rule)


def deepseek_layer(p: Planner, a: Architecture, layer: int, correction_bias: str | None) -> None:
    """One DeepSeek layer's tensors; `correction_bias`: the bias's name under the layer, if any."""
    prefix = common.layer_start(p, a, layer, common.mla_attention)
    if prefix:
        common.moe_block(p, a, layer, prefix,
                         correction_bias and f"model.layers.{layer}.{correction_bias}")


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    deepseek_layer(p, a, layer, None)
