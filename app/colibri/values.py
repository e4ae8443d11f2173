"""The value types every layer shares: hyper-parameters, the names of routing modes, kernel paths
and decodings, run settings, and the one way long work reports progress and is cancelled.

Pure Python, no Qt and no engine: the file writer (colibri.fileformat) and the converter use it
before the engine is built, and the engine binding, the CLI, the debugger, the jitter lab and the
Inspector all take their types from here, so each concept is spelled once. Enum values restated
from colibri.h are append-only in C, so restating them is safe; engine.py checks them against the
compiled engine at import.

Ranges of engine arguments (threads, max_context, epsilon, numerics fields) are the engine's to
judge: `col_session_create` checks every one and the binding raises `ColibriValueError` with its
message. What is checked here is what only Python runs (decoding, temperature, new tokens).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, Protocol

import numpy as np

from colibri.interventions import Intervention

FORMAT_VERSION = 2   # what the writer writes unless asked for version 1 (the engine reads both)

# col_arch (5.. need format version 2)
ARCH_NAMES: dict[int, str] = {1: "mixtral", 2: "qwen2_moe", 3: "qwen3_moe", 4: "olmoe",
                              5: "deepseek_v2", 6: "deepseek_v3", 7: "glm4_moe",
                              8: "ernie4_5_moe", 9: "gpt_oss", 10: "llama4", 11: "phimoe",
                              12: "granitemoe", 13: "granitemoeshared", 14: "dbrx"}

# col_routing_mode, in enum order
RoutingName = Literal["topk", "stable", "soft", "gumbel", "cached"]
ROUTING_MODES: tuple[RoutingName, ...] = ("topk", "stable", "soft", "gumbel", "cached")

# col_kernels 1..5, least to most capable (0 = the best the machine has: None in Python)
KERNEL_PATHS: tuple[str, ...] = ("portable", "avx2", "avx512f", "avx512", "amx")

# Which matrices `colibri convert --quantize` stores as blocks (colibri.convert.QUANTIZE_SETS, and
# "llama.cpp": llama-quantize's own recipe, colibri.convert.llama_quantize_type)
QUANTIZE_TENSORS: tuple[str, ...] = ("experts", "ffn", "all", "llama.cpp")
# How matrices are stored (colibri.convert.layout_target): "rows" (row after row), "panels"
# (q8_0/q4_0 as q8_0x8/q4_0x8, the same blocks in panels of 8 rows, the order the AVX2 kernels
# read; bf16 in rows) or "bf16-panels" (those, and bf16 as bf16x16, panels of 16 rows whose
# pairs of columns the vector kernels read a row a lane; docs/format.md)
LAYOUTS: tuple[str, ...] = ("rows", "panels", "bf16-panels")
DEFAULT_LAYOUT = "panels"

# How the next token is chosen from a position's logits (colibri.generation)
DecodingName = Literal["greedy", "sample"]
DECODINGS: tuple[DecodingName, ...] = ("greedy", "sample")


# ---------------------------------------------------------------------------------------------
# Hyper-parameters


@dataclass(frozen=True, kw_only=True)
class HParams:
    """Architecture and hyper-parameters of a model: what the fixed header stores (col_hparams).
    `Model.hparams` decodes one from a file; `colibri.fileformat` writes one (it derives
    `n_moe_layers` from the layer kinds and always writes FORMAT_VERSION)."""

    version: int = FORMAT_VERSION
    arch: int
    flags: int = 0
    n_layers: int
    n_experts: int
    n_experts_active: int
    n_moe_layers: int = 0
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    max_context: int
    d_ff_expert: int
    d_ff_dense: int = 0
    d_ff_shared: int = 0
    sliding_window: int = 0
    rope_type: int = 0
    rope_original_max_context: int = 0
    bos_token_id: int = -1
    eos_token_id: int = -1
    rope_theta: float = 10000.0
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 0.0
    rope_high_freq_factor: float = 0.0
    norm_eps: float = 1e-6
    clip_qkv: float = 0.0
    default_epsilon: float = 1e-8
    # version 2 (docs/format.md): None = what version 1 means (head_dim, head_dim, head_dim^-1/2)
    attention: int = 0             # col_attention: 0 grouped-query, 1 multi-head latent
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int | None = None
    rotary_dim: int | None = None
    rope_layout: int = 0           # 0 rotate halves, 1 interleaved pairs
    attn_scale: float | None = None
    latent_norm_eps: float = 0.0
    rope_attn_factor: float = 1.0
    rope_beta_fast: float = 0.0
    rope_beta_slow: float = 0.0
    rope_truncate: int = 0
    norm_kind: int = 0             # col_norm_kind: 0 RMSNorm, 1 LayerNorm, 2 LayerNorm with bias
    embedding_scale: float = 0.0   # 0 = none (Granite's embedding_multiplier)
    residual_scale: float = 0.0    # 0 = none (Granite's residual_multiplier)
    logit_divisor: float = 0.0     # 0 = none (Granite's logits_scaling)
    attention_chunk_size: int = 0  # C of the chunked-attention layers (Llama 4)

    def v2_value(self, attr: str) -> int | float:
        """A version-2 header field's value, the Nones filled as version 1 would mean them."""
        if attr in ("v_head_dim", "rotary_dim"):
            value = getattr(self, attr)
            return self.head_dim if value is None else value
        if attr == "attn_scale":
            if self.attn_scale is not None:
                return self.attn_scale
            return struct.unpack("<f", struct.pack("<f", 1.0 / math.sqrt(self.head_dim)))[0]
        return getattr(self, attr)

    @property
    def arch_name(self) -> str:
        return ARCH_NAMES.get(self.arch, f"arch-{self.arch}")

    def to_dict(self) -> dict[str, int | float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# ---------------------------------------------------------------------------------------------
# Run settings


@dataclass(frozen=True)
class RunSettings:
    """Everything that determines a generation run (what a saved debugging session records to
    reproduce it)."""

    prompt_tokens: tuple[int, ...]
    max_new_tokens: int = 16
    decoding: DecodingName = "greedy"
    seed: int = 0                  # the sampler's and Gumbel routing's seed
    temperature: float = 1.0
    routing: str = "topk"          # one of ROUTING_MODES
    epsilon: float | None = None   # stable routing; None = the model's default_epsilon
    threads: int = 1
    kernels: str | None = None     # kernel path ceiling (KERNEL_PATHS); None = the best
    cache_threshold: float = 0.0   # cached routing: keep the previous set below this margin
    expert_cache: int = 0          # LRU of resident experts per MoE layer; 0 = none
    # edits of routing decisions the run applies (colibri.interventions; specs are read too)
    interventions: tuple[Intervention, ...] = ()
    # an embedding prompt: float32 [positions, d_model] rows fed instead of looked-up tokens
    # (their dtype and width are the engine's to judge); prompt_tokens is then -1 per row, as the
    # trace records them. Kept read-only; to_dict leaves it out (session files store the array).
    prompt_embeddings: np.ndarray | None = field(default=None, compare=False, repr=False)
    numerics: str = "default"      # numerics variant (colibri.numerics spec), e.g. dot-bf16

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_tokens", tuple(int(t) for t in self.prompt_tokens))
        object.__setattr__(self, "interventions", tuple(
            i if isinstance(i, Intervention) else Intervention.parse(i) for i in self.interventions))
        if self.prompt_embeddings is not None:
            rows = np.array(self.prompt_embeddings)   # a copy: the caller's array may change
            if rows.ndim != 2:
                raise ValueError(f"embedding rows must be [positions, d_model], got shape "
                                 f"{list(rows.shape)}")
            rows.flags.writeable = False
            object.__setattr__(self, "prompt_embeddings", rows)
            if not self.prompt_tokens:
                object.__setattr__(self, "prompt_tokens", (-1,) * rows.shape[0])
            if self.prompt_tokens != (-1,) * rows.shape[0]:
                raise ValueError(f"an embedding prompt of {rows.shape[0]} rows has token -1 at "
                                 f"each position, got {len(self.prompt_tokens)} prompt tokens")
        if not self.prompt_tokens:
            raise ValueError("the prompt is empty")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.decoding not in DECODINGS:
            raise ValueError(f"decoding must be 'greedy' or 'sample', got {self.decoding!r}")
        if self.routing not in ROUTING_MODES:
            raise ValueError(f"routing must be one of {', '.join(ROUTING_MODES)}, got "
                             f"{self.routing!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

    @property
    def n_positions(self) -> int:
        """Positions a complete run processes (fewer when eos comes early)."""
        return len(self.prompt_tokens) + max(self.max_new_tokens - 1, 0)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunSettings):
            return NotImplemented
        if any(getattr(self, f.name) != getattr(other, f.name) for f in fields(self) if f.compare):
            return False
        a, b = self.prompt_embeddings, other.prompt_embeddings
        return (a is None and b is None) or (a is not None and b is not None and a.dtype == b.dtype
                                             and a.shape == b.shape and a.tobytes() == b.tobytes())

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able settings; the embedding rows are not among them (`prompt_embeddings`)."""
        d = asdict(replace(self, prompt_embeddings=None))
        del d["prompt_embeddings"]
        d["prompt_tokens"] = list(self.prompt_tokens)
        d["interventions"] = [i.spec for i in self.interventions]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any],
                  prompt_embeddings: np.ndarray | None = None) -> RunSettings:
        names = {f.name for f in fields(cls)} - {"prompt_embeddings"}
        return cls(**{k: v for k, v in data.items() if k in names},
                   prompt_embeddings=prompt_embeddings)


# ---------------------------------------------------------------------------------------------
# Progress and cancel


class Cancelled(Exception):
    """Long work (a tensor scan, a data check, a jitter analysis, an Inspector task) noticed
    that it was asked to stop."""


class Progress(Protocol):
    """How long work reports: `progress(done, total, text)` (done == total at the end)."""

    def __call__(self, done: int, total: int, text: str = "") -> None: ...


CancelFlag = Callable[[], bool]   # `cancelled()` is True once the work should stop


def no_progress(done: int, total: int, text: str = "") -> None:
    """A Progress that reports nowhere."""


def never_cancelled() -> bool:
    return False


def check_cancelled(cancelled: CancelFlag) -> None:
    """Raise Cancelled when `cancelled()` says so (call it between units of work)."""
    if cancelled():
        raise Cancelled()


__all__ = ["ARCH_NAMES", "DECODINGS", "FORMAT_VERSION", "KERNEL_PATHS", "ROUTING_MODES",
           "CancelFlag", "Cancelled", "DecodingName", "HParams", "Progress", "RoutingName",
           "RunSettings", "check_cancelled", "never_cancelled", "no_progress"]
