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
routers' own outputs), the selection scores the family's rule ranks, and the kept groups, as
colibri.reference.transformers_run reads them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from colibri.reference import transformers_run


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
    # sparsemixer always takes the two best logits, so these do not pass rule_matters; its
    # weights (masked softmaxes) reach the logits, which the conformance test compares
    Variant("phimoe-base", "phimoe", dict(_COMMON, intermediate_size=32, num_local_experts=4,
                                          num_experts_per_tok=2)),
    Variant("phimoe-bias-window-wide-jitter-tied", "phimoe", dict(
        _COMMON, vocab_size=97, hidden_size=60, num_attention_heads=6, num_key_value_heads=3,
        intermediate_size=36, num_local_experts=6, num_experts_per_tok=2, num_hidden_layers=3,
        attention_bias=True, lm_head_bias=True, sliding_window=8, router_jitter_noise=0.4,
        tie_word_embeddings=True)),
    # Phi-3.5's LongRoPE as transformers runs it for PhiMoE: the short factors at every length
    Variant("phimoe-longrope", "phimoe", dict(
        _COMMON, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": [1.0, 1.3, 1.9, 2.6, 3.1, 3.8, 4.4, 5.0],
                         "long_factor": [1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0],
                         "short_mscale": 1.15, "long_mscale": 1.15,
                         "original_max_position_embeddings": 32})),
    # two mscales: transformers' result past original_max_position_embeddings depends on how the
    # tokens are batched, so the file's context stops there (64, beyond the 56 positions run)
    Variant("phimoe-longrope-two-mscales-odd", "phimoe", dict(
        _COMMON, vocab_size=97, hidden_size=60, num_attention_heads=6, num_key_value_heads=2,
        intermediate_size=28, num_local_experts=5, num_experts_per_tok=2, attention_bias=True,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e6,
                         "short_factor": [1.0, 1.6, 2.9, 4.5, 7.0],
                         "long_factor": [1.2, 3.0, 6.0, 12.0, 24.0],
                         "short_mscale": 1.08, "long_mscale": 1.3,
                         "original_max_position_embeddings": 64})),
    # Granite ranks its logits (a plain top-k); the multipliers reach every logit
    Variant("granitemoe-mup", "granitemoe", dict(
        _COMMON, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
        embedding_multiplier=12.0, attention_multiplier=0.015625, residual_multiplier=0.22,
        logits_scaling=6.0)),
    Variant("granitemoe-bias-odd-tied", "granitemoe", dict(
        _COMMON, vocab_size=101, hidden_size=56, num_attention_heads=7, num_key_value_heads=1,
        intermediate_size=24, num_local_experts=5, num_experts_per_tok=3, num_hidden_layers=3,
        attention_bias=True, tie_word_embeddings=True, embedding_multiplier=3.5,
        attention_multiplier=0.2, residual_multiplier=0.6, logits_scaling=2.5,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    Variant("granitemoeshared-shared", "granitemoeshared", dict(
        _COMMON, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=48, embedding_multiplier=12.0, attention_multiplier=0.015625,
        residual_multiplier=0.22, logits_scaling=6.0)),
    Variant("granitemoeshared-unshared-bias", "granitemoeshared", dict(
        _COMMON, hidden_size=48, num_attention_heads=6, num_key_value_heads=3,
        intermediate_size=20, num_local_experts=6, num_experts_per_tok=2, num_hidden_layers=3,
        shared_intermediate_size=0, attention_bias=True, embedding_multiplier=2.0,
        attention_multiplier=0.25, residual_multiplier=0.5, logits_scaling=4.0)),
    # DBRX ranks the softmax (as its logits); the p-norm of the chosen weights, the fused Wqkv
    # with its clamp and the LayerNorms reach the logits
    Variant("dbrx-l1-clip", "dbrx", dict(
        vocab_size=128, d_model=64, n_heads=4, n_layers=2, max_seq_len=256,
        attn_config=dict(kv_n_heads=2, clip_qkv=0.25, rope_theta=10000.0),
        ffn_config=dict(ffn_hidden_size=32, moe_num_experts=4, moe_top_k=2,
                        moe_normalize_expert_weights=1.0))),
    Variant("dbrx-p2-odd-wide-clip-theta", "dbrx", dict(
        vocab_size=97, d_model=60, n_heads=6, n_layers=3, max_seq_len=256,
        attn_config=dict(kv_n_heads=3, clip_qkv=6.0, rope_theta=500000.0),
        ffn_config=dict(ffn_hidden_size=36, moe_num_experts=5, moe_top_k=3,
                        moe_normalize_expert_weights=2.0))),
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
    "phimoe": (transformers.PhimoeConfig, transformers.PhimoeForCausalLM),
    "granitemoe": (transformers.GraniteMoeConfig, transformers.GraniteMoeForCausalLM),
    "granitemoeshared": (transformers.GraniteMoeSharedConfig,
                         transformers.GraniteMoeSharedForCausalLM),
    "dbrx": (transformers.DbrxConfig, transformers.DbrxForCausalLM),
}
# The router's weight in each family's module tree (kept in f32 by the converter).
ROUTER_SUFFIXES = ("mlp.gate.weight", "router.weight", "router.layer.weight")

# Where a MoE layer's router weight and fused experts (gate_up_proj, down_proj) sit in a
# family's module tree (`model.layers.L.` omitted), for the families that have them.
MOE_BLOCK = {"phimoe": ("mlp.router.weight", "mlp.experts"),
             "granitemoe": ("block_sparse_moe.router.weight", "block_sparse_moe.experts"),
             "granitemoeshared": ("block_sparse_moe.router.weight", "block_sparse_moe.experts")}


def moe_block(family: str) -> tuple[str, str]:
    return MOE_BLOCK.get(family, ("mlp.gate.weight", "mlp.experts"))


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
            if name.endswith(ROUTER_SUFFIXES):  # spread the logits so routing is decisive
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
            elif name.endswith("sinks"):  # GPT-OSS: a sink as large as the attention scores
                param.copy_(torch.randn(param.shape, generator=generator))
            elif "norm" in name.split(".")[-2] and not name.endswith(".bias"):  # a norm's weight
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
            kept_f32 = (*ROUTER_SUFFIXES, "correction_bias", "_bias")  # GPT-OSS's expert biases
            if param.ndim >= 2 and not name.endswith(kept_f32):
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


def run(model: torch.nn.Module, tokens: list[int], n_generate: int) -> Reference:
    """What transformers computed for `tokens` (read by colibri.reference.transformers_run, the
    reader `colibri diff` uses), and its greedy continuation."""
    read = transformers_run.run(model, tokens)
    ids = torch.tensor([tokens])
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=n_generate, do_sample=False,
                                   attention_mask=torch.ones_like(ids), pad_token_id=0)
    return Reference(read.logits, read.router_logits, read.expert_ids, read.selection_scores,
                     read.chosen_groups, generated[0, len(tokens):].tolist())
