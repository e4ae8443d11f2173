"""The model families colibri.convert reads, one module per transformers `model_type`.

Each module holds everything about its family in one place: the transformers 5.23 class defaults
of the config fields it reads, what the config means (`Architecture`: header fields, layer
kinds, each MoE layer's routing rule, each layer's attention) and which Hugging Face tensors make
each Colibri tensor. Adding a family is adding a module and a line in FAMILIES.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from colibri.families import (common, dbrx, deepseek_v2, deepseek_v3, ernie4_5_moe, glm4_moe,
                              gpt_oss, granitemoe, granitemoeshared, llama4, mixtral, olmoe,
                              phimoe, qwen2_moe, qwen3_moe)
from colibri.families.common import (Architecture, Config, ConversionError, Planner, check_limits,
                                     tokens_in_vocab)


@dataclass(frozen=True)
class Family:
    model_type: str
    defaults: dict[str, Any]                                   # transformers 5.23 class defaults
    architecture: Callable[[Config], Architecture]
    layer_tensors: Callable[[Planner, Architecture, int], None]
    aliases: dict[str, str] = field(default_factory=dict)      # attribute_map spellings
    # token_embd, and the final norm with the LM head (a module's own when its names differ)
    embedding_tensors: Callable[[Planner, Architecture], None] = common.embeddings
    head_tensors: Callable[[Planner, Architecture], None] = common.head


# A module may also read checkpoints of other model types (OTHER_MODEL_TYPES: Llama 4's
# multimodal `llama4` beside its `llama4_text`); its architecture() tells them apart.
FAMILIES: dict[str, Family] = {
    model_type: Family(model_type, module.DEFAULTS, module.architecture, module.layer_tensors,
                       module.ALIASES, getattr(module, "embedding_tensors", common.embeddings),
                       getattr(module, "head_tensors", common.head))
    for module in (mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, deepseek_v3, glm4_moe,
                   ernie4_5_moe, gpt_oss, llama4, phimoe, granitemoe, granitemoeshared, dbrx)
    for model_type in (module.MODEL_TYPE, *getattr(module, "OTHER_MODEL_TYPES", ()))
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


def family_of(raw: Any) -> Family:
    if not isinstance(raw, dict):
        raise ConversionError("config.json: not a JSON object")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise ConversionError(f"model_type {model_type!r} not supported (supported: "
                              f"{', '.join(SUPPORTED_MODEL_TYPES)})")
    return FAMILIES[model_type]


def architecture_from_config(raw: Any) -> Architecture:
    """The parsed content of config.json -> what it means, with notes on values that had to
    change. Any input, of any JSON type, either converts or raises ConversionError naming the
    field (tests/fuzz/fuzz_convert.py holds it to that)."""
    family = family_of(raw)
    arch = family.architecture(Config(raw, family.model_type, family.defaults, family.aliases))
    check_limits(arch.hp)
    arch.hp = tokens_in_vocab(arch.hp, arch.notes)
    return arch


__all__ = ["Architecture", "FAMILIES", "Family", "SUPPORTED_MODEL_TYPES",
           "architecture_from_config", "family_of"]
