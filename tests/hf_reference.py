"""Small randomly initialised Hugging Face MoE models, the reference Colibri is measured against.

Test-only: imports torch and transformers. Each `Variant` is one family with one set of shapes and
switches (odd sizes, several KV-head groups, top-k > 1, with and without renormalisation, shared
experts, dense layers, tied and untied heads, sliding window, qkv clipping). `build` makes the model
with a fixed seed, then re-draws the parameters whose default initialisation would hide bugs:
router weights large enough that routing is decisive, norm weights away from 1, biases non-zero.
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
]

_CLASSES = {
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
    "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
    "olmoe": (transformers.OlmoeConfig, transformers.OlmoeForCausalLM),
}


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
            if name.endswith("mlp.gate.weight"):  # the router: spread logits so routing is decisive
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
            elif "norm" in name:
                param.copy_(1.0 + 0.3 * torch.randn(param.shape, generator=generator))
            elif name.endswith("bias"):
                param.copy_(0.2 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.08)
    return model


def round_like_converter(model: torch.nn.Module, dtype: str) -> None:
    """Round in place exactly the parameters the converter stores in `dtype` (docs/format.md:
    every tensor of 2 or more dimensions except the router), so the f32 reference runs on the
    same values the 16-bit file holds."""
    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim >= 2 and not name.endswith("mlp.gate.weight"):
                param.copy_(param.to(torch_dtype).to(torch.float32))


def save(model: torch.nn.Module, directory: Path) -> Path:
    model.save_pretrained(directory)
    return directory


@dataclasses.dataclass
class Reference:
    logits: np.ndarray          # [positions, vocab]
    router_logits: np.ndarray   # [positions, moe_layers, n_experts]
    generated: list[int]        # greedy continuation


def run(model: torch.nn.Module, tokens: list[int], n_generate: int) -> Reference:
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = model(ids, output_router_logits=True)
        generated = model.generate(ids, max_new_tokens=n_generate, do_sample=False,
                                   attention_mask=torch.ones_like(ids), pad_token_id=0)
    router = torch.stack([r.float() for r in out.router_logits], dim=1)  # [T, moe_layers, E]
    return Reference(out.logits[0].float().numpy(), router.numpy(),
                     generated[0, len(tokens):].tolist())
