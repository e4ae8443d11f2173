"""Small randomly initialised Hugging Face MoE models, the reference Colibri is measured against.

Test-only: imports torch and transformers. Each `Variant` is one family with one set of shapes and
switches (odd sizes, several KV-head groups, top-k > 1, with and without renormalisation, shared
experts, dense layers, tied and untied heads, sliding window, qkv clipping; for the families of
format version 2 the options of issue 20's table: group-limited routing, correction biases,
scaling factors, latent attention with and without q_lora_rank, partial and interleaved RoPE,
YaRN). `build` makes the model with a fixed seed, then re-draws the parameters and buffers whose
default initialisation would hide bugs: router weights large enough that routing is decisive,
norm weights away from 1, biases (correction biases included) non-zero.

`run` records what transformers routed: the router logits and the chosen experts (from the
routers' own outputs), the selection scores the family's rule ranks, and the kept groups.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    family: str
    config: dict[str, Any]
    # the family's rule chooses otherwise than a plain top-k of the router logits somewhere in
    # the conformance prompt (a correction bias, a group limit or sigmoid scores at work), so
    # the test would see a rule computed wrong
    rule_matters: bool = False

    def __str__(self) -> str:
        return self.name


_COMMON = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
               bos_token_id=None, eos_token_id=None, pad_token_id=None)

VARIANTS = [
    Variant("mixtral-base", "mixtral", dict(_COMMON, intermediate_size=96, num_local_experts=4,
                                            num_experts_per_tok=2)),
    Variant("mixtral-odd-tied-window", "mixtral", dict(
        _COMMON, vocab_size=97, hidden_size=60, num_attention_heads=6, num_key_value_heads=3,
        head_dim=10, intermediate_size=36, num_local_experts=5, num_experts_per_tok=3,
        num_hidden_layers=3, tie_word_embeddings=True, sliding_window=8, rope_theta=1e6)),
    Variant("qwen2_moe-shared-dense", "qwen2_moe", dict(
        _COMMON, num_hidden_layers=3, intermediate_size=80, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
        decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=False)),
    Variant("qwen2_moe-odd-renorm-tied", "qwen2_moe", dict(
        _COMMON, vocab_size=101, hidden_size=56, num_attention_heads=7, num_key_value_heads=1,
        intermediate_size=72, moe_intermediate_size=24, shared_expert_intermediate_size=40,
        num_experts=6, num_experts_per_tok=3, decoder_sparse_step=2, norm_topk_prob=True,
        num_hidden_layers=4, tie_word_embeddings=True)),
    Variant("qwen3_moe-base", "qwen3_moe", dict(
        _COMMON, hidden_size=48, head_dim=16, intermediate_size=96, moe_intermediate_size=32,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)),
    Variant("qwen3_moe-bias-dense-tied", "qwen3_moe", dict(
        _COMMON, vocab_size=111, hidden_size=40, num_attention_heads=6, num_key_value_heads=2,
        head_dim=12, intermediate_size=50, moe_intermediate_size=20, num_experts=5,
        num_experts_per_tok=2, norm_topk_prob=False, attention_bias=True, mlp_only_layers=[0],
        num_hidden_layers=3, tie_word_embeddings=True)),
    Variant("olmoe-base", "olmoe", dict(_COMMON, intermediate_size=32, num_experts=4,
                                        num_experts_per_tok=2)),
    Variant("olmoe-clip-renorm-odd", "olmoe", dict(
        _COMMON, vocab_size=89, hidden_size=36, num_attention_heads=6, num_key_value_heads=3,
        intermediate_size=28, num_experts=6, num_experts_per_tok=3, norm_topk_prob=True,
        clip_qkv=0.8, attention_bias=True, tie_word_embeddings=True, num_hidden_layers=3)),
    Variant("deepseek_v3-groups-qlora", "deepseek_v3", dict(
        _COMMON, num_hidden_layers=3, num_key_value_heads=4, intermediate_size=96,
        moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
        topk_group=1, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16,
        q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        norm_topk_prob=True, routed_scaling_factor=2.5, rope_interleave=True), rule_matters=True),
    Variant("deepseek_v3-flat-yarn-halves", "deepseek_v3", dict(
        _COMMON, vocab_size=97, hidden_size=48, num_attention_heads=3, num_key_value_heads=3,
        intermediate_size=64, moe_intermediate_size=24, n_routed_experts=6,
        num_experts_per_tok=3, n_group=1, topk_group=1, n_shared_experts=2,
        first_k_dense_replace=0, kv_lora_rank=12, q_lora_rank=None, qk_nope_head_dim=10,
        qk_rope_head_dim=6, v_head_dim=14, norm_topk_prob=False, routed_scaling_factor=1.0,
        rope_interleave=False, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 1.0}),
        rule_matters=True),
    Variant("deepseek_v2-greedy", "deepseek_v2", dict(
        _COMMON, num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=32,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, topk_method="greedy")),
    Variant("deepseek_v2-grouped-qlora-scaled", "deepseek_v2", dict(
        _COMMON, num_hidden_layers=3, num_key_value_heads=4, intermediate_size=80,
        moe_intermediate_size=24, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2,
        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=20, qk_nope_head_dim=12,
        qk_rope_head_dim=8, v_head_dim=12, topk_method="group_limited_greedy", n_group=2,
        topk_group=1, routed_scaling_factor=16.0), rule_matters=True),
    Variant("glm4_moe-qknorm-bias-groups", "glm4_moe", dict(
        _COMMON, num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32,
        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
        first_k_dense_replace=1, use_qk_norm=True, attention_bias=True, norm_topk_prob=True,
        routed_scaling_factor=1.5), rule_matters=True),
    Variant("glm4_moe-plain-quarter-rotary-tied", "glm4_moe", dict(
        _COMMON, hidden_size=48, head_dim=16, intermediate_size=64, moe_intermediate_size=24,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=2,
        first_k_dense_replace=0, use_qk_norm=False, attention_bias=False, norm_topk_prob=False,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25}), rule_matters=True),
    Variant("ernie4_5_moe-shared-tied", "ernie4_5_moe", dict(
        _COMMON, intermediate_size=96, moe_intermediate_size=32, moe_num_experts=4, moe_k=2,
        moe_num_shared_experts=1, moe_layer_start_index=1), rule_matters=True),
    Variant("ernie4_5_moe-interval-untied", "ernie4_5_moe", dict(
        _COMMON, num_hidden_layers=4, vocab_size=101, intermediate_size=72,
        moe_intermediate_size=20, moe_num_experts=6, moe_k=3, moe_num_shared_experts=0,
        moe_layer_start_index=0, moe_layer_end_index=2, moe_layer_interval=2,
        tie_word_embeddings=False), rule_matters=True),
    # GptOssConfig's own YaRN (factor 32 over 4096 positions, truncate false), even layers
    # sliding; a swiglu_limit the experts' gates and ups reach, so the clamp is at work
    Variant("gpt_oss-yarn-alternating-clamped", "gpt_oss", dict(
        _COMMON, head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=4, swiglu_limit=0.6, attention_bias=True)),
    Variant("gpt_oss-default-rope-odd-tied", "gpt_oss", dict(
        _COMMON, vocab_size=97, hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
        head_dim=10, num_hidden_layers=3, intermediate_size=40, num_local_experts=5,
        num_experts_per_tok=3, sliding_window=6, swiglu_alpha=1.0,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        attention_bias=False, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0})),
    # Llama4TextConfig's layout at small scale: MoE every second layer, layer 3 without RoPE
    # (no_rope_layer_interval 4) with the query temperature tuned from position 3 on
    # (floor_scale 4), chunks of 8 on the RoPE layers, top-1 with the weight on the input
    Variant("llama4-interleaved-nope-chunked-top1", "llama4", dict(
        _COMMON, num_hidden_layers=4, head_dim=16, intermediate_size=32,
        intermediate_size_mlp=96, num_local_experts=4, num_experts_per_tok=1,
        interleave_moe_layer_step=2, attention_chunk_size=8, floor_scale=4)),
    Variant("llama4-top2-llama3-rope-bias-tied", "llama4", dict(
        _COMMON, vocab_size=97, hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
        head_dim=8, num_hidden_layers=3, intermediate_size=24, intermediate_size_mlp=40,
        num_local_experts=5, num_experts_per_tok=2, moe_layers=[0, 2],
        no_rope_layers=[1, 0, 1], layer_types=["chunked_attention", "full_attention",
                                                "full_attention"], attention_chunk_size=16,
        use_qk_norm=False, floor_scale=8, attn_scale=0.3, attention_bias=True,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 8.0,
                         "original_max_position_embeddings": 64})),
]

_CLASSES = {
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
    "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
    "olmoe": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM),
    "deepseek_v2": (transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM),
    "deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM),
    "glm4_moe": (transformers.Glm4MoeConfig, transformers.Glm4MoeForCausalLM),
    "ernie4_5_moe": (transformers.Ernie4_5_MoeConfig, transformers.Ernie4_5_MoeForCausalLM),
    "gpt_oss": (transformers.GptOssConfig, transformers.GptOssForCausalLM),
    "llama4": (transformers.Llama4TextConfig, transformers.Llama4ForCausalLM),
}
# Router weights by family (`mlp.gate` in most, `mlp.router` in GPT-OSS, Llama 4's router)
_ROUTER_WEIGHTS = ("mlp.gate.weight", "mlp.router.weight", "feed_forward.router.weight")


def build(variant: Variant, seed: int = 0) -> torch.nn.Module:
    """The variant's model in float32, eval mode, eager attention, with decisive random weights."""
    config_cls, model_cls = _CLASSES[variant.family]
    config = config_cls(**variant.config)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(_ROUTER_WEIGHTS):  # the router: spread logits so routing is decisive
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
            elif name.endswith("sinks"):  # GPT-OSS: a sink as large as the attention scores
                param.copy_(torch.randn(param.shape, generator=generator))
            elif "norm" in name:
                param.copy_(1.0 + 0.3 * torch.randn(param.shape, generator=generator))
            elif name.endswith("bias"):  # ERNIE's moe_statics correction bias among them
                param.copy_(0.2 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.08)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3 / GLM: a buffer, zeros
                buffer.copy_(0.2 * torch.randn(buffer.shape, generator=generator))
    return model


def round_like_converter(model: torch.nn.Module, dtype: str) -> None:
    """Round in place exactly the parameters the converter stores in `dtype` (docs/format.md:
    every tensor of 2 or more dimensions except the router, ERNIE's [1, E] correction bias,
    stored 1-D, and GPT-OSS's expert biases, kept f32), so the f32 reference runs on the same
    values the 16-bit file holds."""
    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim >= 2 and not name.endswith(_ROUTER_WEIGHTS + ("correction_bias", "_bias")):
                param.copy_(param.to(torch_dtype).to(torch.float32))


def save(model: torch.nn.Module, directory: Path) -> Path:
    model.save_pretrained(directory)
    return directory


@dataclasses.dataclass
class Reference:
    logits: np.ndarray            # [positions, vocab]
    router_logits: np.ndarray     # [positions, moe_layers, n_experts]
    expert_ids: np.ndarray        # [positions, moe_layers, k] what transformers chose
    selection_scores: np.ndarray  # [positions, moe_layers, n_experts] what its rule ranked
    chosen_groups: np.ndarray     # [positions, moe_layers, kept groups], 0 wide without groups
    generated: list[int]          # greedy continuation


def _routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The MoE layers' router modules, in layer order."""
    return [m for m in model.modules()
            if type(m).__name__.endswith(("TopkRouter", "TopKRouter", "Llama4Router"))]


def _logits_and_chosen(router: torch.nn.Module, out: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """A router's logits [T, E] and chosen experts [T, k] from its output: (logits, weights,
    indices) in every family but Llama 4, whose router returns (scores, logits) and chose the
    top-k of the logits."""
    if type(router).__name__ == "Llama4Router":
        return out[1], torch.topk(out[1], router.top_k, dim=-1)[1]
    return out[0], out[2]


def _selection_and_groups(router: torch.nn.Module, logits: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The values the family's rule ranks, as its router computes them, and the groups it keeps
    (None without a group limit)."""
    logits = logits.float()
    family = type(router).__name__
    if family.startswith(("DeepseekV3", "Glm4Moe")):
        sel = logits.sigmoid() + router.e_score_correction_bias
        if router.num_group > 1:
            grouped = sel.view(-1, router.num_group, router.num_experts // router.num_group)
            scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
            return sel, torch.topk(scores, router.topk_group, dim=-1)[1]
        return sel, None
    if family.startswith("Ernie4_5"):
        return router.moe_statics(logits.softmax(dim=-1)), None
    if family.startswith("DeepseekV2") and router.topk_method == "group_limited_greedy":
        probs = logits.softmax(dim=-1)
        scores = probs.view(-1, router.num_group, router.num_experts // router.num_group).amax(-1)
        return logits, torch.topk(scores, router.topk_group, dim=-1)[1]
    return logits, None  # a softmax without a bias ranks as its logits do


def run(model: torch.nn.Module, tokens: list[int], n_generate: int) -> Reference:
    ids = torch.tensor([tokens])
    seen: list[tuple] = []
    hooks = [r.register_forward_hook(lambda mod, inp, out: seen.append((mod, out)))
             for r in _routers(model)]
    try:
        with torch.no_grad():
            out = model(ids, output_router_logits=True)
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=n_generate, do_sample=False,
                                   attention_mask=torch.ones_like(ids), pad_token_id=0)
    router = torch.stack([r.float() for r in out.router_logits], dim=1)  # [T, moe_layers, E]
    chosen = torch.stack([_logits_and_chosen(m, o)[1] for m, o in seen], dim=1)  # [T, layers, k]
    sel, groups = [], []
    for mod, o in seen:
        s, g = _selection_and_groups(mod, _logits_and_chosen(mod, o)[0])
        sel.append(s)
        groups.append(g)
    kept = max((g.shape[1] for g in groups if g is not None), default=0)
    group_rows = [torch.full((len(tokens), kept), -1, dtype=torch.int64) if g is None else g
                  for g in groups]
    return Reference(out.logits[0].float().numpy(), router.numpy(),
                     chosen.numpy().astype(np.int32), torch.stack(sel, dim=1).numpy(),
                     torch.stack(group_rows, dim=1).numpy().astype(np.int32),
                     generated[0, len(tokens):].tolist())
