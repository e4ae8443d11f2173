"""Small valid .colibri files for tests, built with colibri.fileformat (tensor names and shapes
of docs/format.md for each of the four architectures).

A plain module, not a conftest: test modules import it by name (`from tiny_models import ...`),
which stays unambiguous when several conftest.py files are loaded. tests/conftest.py wraps it in
fixtures.
"""

from __future__ import annotations

import os
import shutil
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from colibri import fileformat as ff
from colibri.values import ARCH_NAMES, HParams

ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
DTYPES = ("f32", "f16", "bf16")

# DeepSeek-V3's rule (for `make_tiny_model(rule=...)` with 2 groups' worth of experts): sigmoid
# scores, a correction bias for the choice only, two groups by the sum of their best two with
# one kept, renormalised (+ 1e-20) and scaled by 2.5.
V3_RULE = ff.RouteRule(scoring=ff.SCORING_SIGMOID, correction_bias=True, n_groups=2,
                       n_groups_kept=1, group_score=ff.GROUP_TOP2_SUM, normalize=ff.NORM_SUM,
                       norm_eps=1e-20, scale=2.5)

# Rules of every kind the format states, on tiny random models: (arch, make_tiny_model options)
RULES: dict[str, tuple[str, dict[str, Any]]] = {
    "mixtral": ("mixtral", {}),
    "qwen2_moe": ("qwen2_moe", {}),
    "olmoe": ("olmoe", {}),
    "deepseek_v3": ("mixtral", {"n_experts": 8, "rule": V3_RULE}),
    "deepseek_v2": ("mixtral", {"n_experts": 8, "rule": ff.RouteRule(
        n_groups=4, n_groups_kept=2, group_score=ff.GROUP_MAX, scale=16.0)}),
    "ernie": ("mixtral", {"rule": ff.RouteRule(
        correction_bias=True, normalize=ff.NORM_SUM_CLAMPED, norm_eps=1e-12)}),
    "gpt_oss": ("mixtral", {"rule": ff.RouteRule(select_on=ff.SELECT_LOGITS)}),
}

WORDS = ["<unk>", "<s>", "</s>", "the", "cat", "sat", "on", "mat", "a", "dog"]


@dataclass
class TinyModel:
    """What a test file contains, as written."""

    path: Path
    hparams: HParams
    layer_kinds: list[int]
    dtype: str
    values: dict[str, np.ndarray]          # float32 values before storage conversion
    stored: dict[str, np.ndarray]          # arrays exactly as stored (f32 / f16 / bf16 bits)
    dtypes: dict[str, int]                 # storage dtype code per tensor
    metadata: dict[str, Any] = field(default_factory=dict)
    tokenizer_json: bytes = b""

    @property
    def names(self) -> list[str]:
        return list(self.values)


def tokenizer_json(vocab_size: int) -> bytes:
    """A word-level tokenizer.json over `vocab_size` tokens: WORDS, then w10, w11, ..."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = (WORDS + [f"w{i}" for i in range(len(WORDS), vocab_size)])[:vocab_size]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok.to_str().encode("utf-8")


def arch_hparams(arch: str, n_layers: int, n_experts: int, top_k: int, d_model: int,
                 vocab_size: int, dense_layers: tuple[int, ...], eos_token_id: int) -> HParams:
    code = {name: c for c, name in ARCH_NAMES.items()}[arch]
    family: dict[str, Any] = {
        "mixtral": {"flags": ff.FLAG_NORM_TOPK, "rope_theta": 1e6},
        "qwen2_moe": {"flags": ff.FLAG_SHARED_EXPERT | ff.FLAG_SHARED_EXPERT_GATE
                      | ff.FLAG_QKV_BIAS, "d_ff_shared": 24},
        "qwen3_moe": {"flags": ff.FLAG_QK_NORM_HEAD | ff.FLAG_NORM_TOPK},
        "olmoe": {"flags": ff.FLAG_QK_NORM_FULL, "clip_qkv": 8.0},
    }[arch]
    return HParams(**{**dict(arch=code, n_layers=n_layers, n_experts=n_experts,
                             n_experts_active=top_k, d_model=d_model, n_heads=4, n_kv_heads=2,
                             head_dim=d_model // 4, vocab_size=vocab_size, max_context=64,
                             d_ff_expert=16, d_ff_dense=48 if dense_layers else 0, norm_eps=1e-5,
                             rope_theta=10000.0, bos_token_id=1, eos_token_id=eos_token_id,
                             default_epsilon=1e-6), **family})


def arch_tensors(hp: HParams, layer_kinds: list[int],
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random float32 values for every tensor the architecture requires, in file order."""
    H, V, E, I = hp.d_model, hp.vocab_size, hp.n_experts, hp.d_ff_expert
    q_dim, kv_dim, d = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim, hp.head_dim

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    t: dict[str, np.ndarray] = {"token_embd": mat(V, H)}
    for layer, kind in enumerate(layer_kinds):
        p = f"layers.{layer}."
        t[p + "attn_norm"] = norm(H)
        t[p + "attn_q"], t[p + "attn_k"] = mat(q_dim, H), mat(kv_dim, H)
        t[p + "attn_v"], t[p + "attn_o"] = mat(kv_dim, H), mat(H, q_dim)
        if hp.flags & ff.FLAG_QKV_BIAS:
            t[p + "attn_q_bias"] = 0.1 * mat(q_dim)
            t[p + "attn_k_bias"], t[p + "attn_v_bias"] = 0.1 * mat(kv_dim), 0.1 * mat(kv_dim)
        if hp.flags & ff.FLAG_QK_NORM_HEAD:
            t[p + "attn_q_norm"], t[p + "attn_k_norm"] = norm(d), norm(d)
        if hp.flags & ff.FLAG_QK_NORM_FULL:
            t[p + "attn_q_norm"], t[p + "attn_k_norm"] = norm(q_dim), norm(kv_dim)
        t[p + "ffn_norm"] = norm(H)
        if kind == ff.LAYER_MOE:
            t[p + "moe_gate"] = mat(E, H)
            t[p + "moe_w1"], t[p + "moe_w2"], t[p + "moe_w3"] = mat(E, I, H), mat(E, H, I), mat(E, I, H)
            if hp.flags & ff.FLAG_SHARED_EXPERT:
                S = hp.d_ff_shared
                t[p + "shared_w1"], t[p + "shared_w2"] = mat(S, H), mat(H, S)
                t[p + "shared_w3"] = mat(S, H)
            if hp.flags & ff.FLAG_SHARED_EXPERT_GATE:
                t[p + "shared_gate"] = mat(1, H)
        else:
            D = hp.d_ff_dense
            t[p + "mlp_w1"], t[p + "mlp_w2"], t[p + "mlp_w3"] = mat(D, H), mat(H, D), mat(D, H)
    t["output_norm"] = norm(H)
    if not hp.flags & ff.FLAG_TIED_EMBEDDINGS:
        t["output"] = mat(V, H)
    return t


def storage_dtype(name: str, values: np.ndarray, dtype: str) -> int:
    """1-D tensors and routers stay f32 (docs/format.md); every other tensor uses `dtype`."""
    if values.ndim == 1 or name.endswith("moe_gate"):
        return ff.DTYPE_F32
    return ff.DTYPE_BY_NAME[dtype]


def make_tiny_model(directory: Path, arch: str = "mixtral", dtype: str = "f32", *,
                    n_layers: int = 2, n_experts: int = 4, top_k: int = 2, d_model: int = 32,
                    vocab_size: int = 50, dense_layers: tuple[int, ...] = (),
                    eos_token_id: int = -1, with_tokenizer: bool = True,
                    tokenizer_bytes: bytes | None = None, seed: int = 0,
                    rule: ff.RouteRule | None = None) -> TinyModel:
    """Build and write a tiny model; `tokenizer_bytes` replaces the generated tokenizer.json.
    `rule` (no shared expert) replaces the architecture's routing in every MoE layer; with a
    correction bias, each gets `moe_correction_bias` values large enough to change choices."""
    hp = arch_hparams(arch, n_layers, n_experts, top_k, d_model, vocab_size, dense_layers,
                      eos_token_id)
    kinds = [ff.LAYER_DENSE if i in dense_layers else ff.LAYER_MOE for i in range(n_layers)]
    rules = None
    if rule is not None:
        assert rule.shared == ff.SHARED_NONE and not rule.gate_bias, "not in tiny models"
        hp = replace(hp, flags=hp.flags & ~ff.FLAGS_V1_ONLY, d_ff_shared=0)
        rules = [rule if k == ff.LAYER_MOE else None for k in kinds]
    rng = np.random.default_rng(seed)
    values = arch_tensors(hp, kinds, rng)
    if rule is not None and rule.correction_bias:
        for layer, kind in enumerate(kinds):
            if kind == ff.LAYER_MOE:
                values[f"layers.{layer}.moe_correction_bias"] = \
                    (0.1 * rng.standard_normal(n_experts)).astype(np.float32)
    dtypes = {name: storage_dtype(name, v, dtype) for name, v in values.items()}
    stored = {name: ff.to_storage(v, dtypes[name]) for name, v in values.items()}
    specs = ff.tensor_specs_from_arrays((name, values[name], dtypes[name]) for name in values)
    metadata = {"source": {"model_type": arch}, "dtype": dtype, "test": True}
    tok = tokenizer_json(vocab_size) if with_tokenizer else b""
    if tokenizer_bytes is not None:
        tok = tokenizer_bytes
    plan = ff.plan_file(hp, kinds, specs, tokenizer=tok, metadata=metadata, rules=rules)
    key = f"{arch}-{dtype}-L{n_layers}-E{n_experts}-k{top_k}-H{d_model}-V{vocab_size}-" \
          f"d{'_'.join(map(str, dense_layers))}-eos{eos_token_id}-t{int(with_tokenizer)}-" \
          f"{zlib.crc32(tok):08x}-s{seed}" + \
          ("" if rule is None else f"-r{zlib.crc32(repr(rule).encode()):08x}")
    path = directory / f"{key}.colibri"
    ff.write_colibri(path, plan)
    return TinyModel(path, plan.hparams, kinds, dtype, values, stored, dtypes, metadata, tok)


# Replacing a model file under a reader (the reload and serving tests)


def live_copy(source: Path, directory: Path) -> Path:
    """A copy of `source` at `directory/live.colibri`: the file a reload test serves, then
    replaces."""
    live = directory / "live.colibri"
    shutil.copyfile(source, live)
    return live


def replace_with(source: Path, target: Path) -> None:
    """Put a copy of `source` in place of `target` with one rename, as a deploy does: a reader
    sees the old file or the new one, never half of one."""
    tmp = target.with_suffix(".tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, target)
