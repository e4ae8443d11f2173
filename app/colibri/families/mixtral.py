"""Mixtral (`mixtral`): softmax over every expert, top-k, always renormalised; every layer MoE;
an optional sliding window on every layer. Experts per expert as block_sparse_moe.experts.E.w1/
w2/w3 (w1 the gate), or fused under mlp.experts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from colibri.families import common
from colibri.families.common import Architecture, Config, ConversionError, Planner
from colibri.fileformat import ARCH_MIXTRAL, LAYER_MOE, NORM_SUM, RouteRule

MODEL_TYPE = "mixtral"
ALIASES = {"num_experts": "num_local_experts", "num_local_experts": "num_experts"}
DEFAULTS: dict[str, Any] = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, head_dim=None,
    max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False, sliding_window=None, num_experts_per_tok=2,
    num_local_experts=8, rope_theta=1e6)


def sliding_window(cfg: Config) -> int:
    """MixtralModel uses the sliding mask on every layer iff sliding_window is not None."""
    window = cfg.get("sliding_window")
    if window is None or window == 0:
        return 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ConversionError(f"config.json: sliding_window = {window!r}, expected null or "
                              "an integer >= 0")
    return window


def architecture(cfg: Config) -> Architecture:
    hp = common.base_hparams(cfg, ARCH_MIXTRAL, cfg.int("num_experts"),
                             cfg.int("num_experts_per_tok"), cfg.int("intermediate_size"), 0)
    hp = replace(common.apply_rope(hp, common.rope(cfg)), sliding_window=sliding_window(cfg))
    n = hp.n_layers
    return Architecture(hp, [LAYER_MOE] * n, [RouteRule(normalize=NORM_SUM)] * n,
                        common.attention_masks(n, [hp.sliding_window > 0] * n))


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    common.norms(p, a, layer)
    common.gqa_attention(p, a, layer)
    # per-expert checkpoints name the block `block_sparse_moe`, the fused form `mlp`
    base = f"model.layers.{layer}"
    fused = p.has(f"{base}.mlp.experts.gate_up_proj") or p.has(f"{base}.mlp.experts.down_proj")
    pre = next((pre for pre in ("block_sparse_moe", "mlp") if p.has(f"{base}.{pre}.gate.weight")),
               "mlp" if fused else "block_sparse_moe")
    common.router(p, a, layer, f"{base}.{pre}.gate.weight")
    common.routed_experts(p, a, layer, f"{base}.{pre}", common.MIXTRAL_EXPERT_NAMES,
                          fused_prefix=f"{base}.mlp")
