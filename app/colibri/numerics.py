"""Numerics variants of a session: the Python face of col_session_config's numerics fields.

A `Numerics` names one real computation the engine can run instead of its default kernels
(engine_c/src/numerics.c): the reduction order of every dot product (sequential, pairwise, blocked
by L lanes), fused multiply-add, a split of each reduction into S partial sums, bf16 dot products
for bf16 weights (`dot-bf16`: the activations rounded to bf16 for them, as AVX512-BF16's
vdpbf16ps computes; the fast choice on CPUs that have it and no AMX), activations rounded to
bf16/f16 between operations, seeded ULP noise on router logits, and a KV cache of halves (`kv-f16`:
each key and value rounded to IEEE half when cached, in half the bytes, as llama.cpp's default
cache type). All defaults = the default computation (bit-identical for any thread count).

Spec strings, the CLI's and reports' names for variants: components joined by '+', e.g.
`seq`, `seq+fma`, `pairwise`, `blocked8+fma`, `split4`, `dot-bf16`, `act-bf16`, `kv-f16`, `noise2`,
`noise2@7` (seed 7), `dot-bf16+kv-f16`, `default`. `Numerics.parse(spec).spec` is the canonical spelling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

REDUCTIONS = {"default": 0, "sequential": 1, "pairwise": 2, "blocked": 3, "dot-bf16": 4}
ACTIVATIONS = {"f32": 0, "bf16": 1, "f16": 2}
KV_PRECISIONS = {"f32": 0, "f16": 1}


class NumericsError(ValueError):
    """A numerics spec that does not parse, or a field name the engine has no code for. The
    fields' ranges (lanes, split, noise) are the engine's to judge: a session refuses a variant
    it cannot run with a ColibriValueError naming the field (col_session_config_check)."""


@dataclass(frozen=True)
class Numerics:
    reduction: str = "default"     # default | sequential | pairwise | blocked | dot-bf16
    lanes: int = 0                 # blocked only
    fma: bool = False
    split: int = 0                 # 0/1 = none, S >= 2 partial sums combined last to first
    activation: str = "f32"        # f32 | bf16 | f16
    router_noise_ulps: int = 0
    noise_seed: int = 0
    kv: str = "f32"                # the KV cache's precision: f32 | f16

    def __post_init__(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise NumericsError(f"unknown reduction {self.reduction!r}")
        if self.activation not in ACTIVATIONS:
            raise NumericsError(f"unknown activation precision {self.activation!r}")
        if self.kv not in KV_PRECISIONS:
            raise NumericsError(f"unknown KV cache precision {self.kv!r}")

    @property
    def is_default(self) -> bool:
        return self == Numerics()

    @property
    def spec(self) -> str:
        """Canonical spec string (`default` for the default computation)."""
        parts = []
        if self.reduction == "sequential":
            parts.append("seq")
        elif self.reduction == "pairwise":
            parts.append("pairwise")
        elif self.reduction == "blocked":
            parts.append(f"blocked{self.lanes}")
        elif self.reduction == "dot-bf16":
            parts.append("dot-bf16")
        if self.fma:
            parts.append("fma")
        if self.split > 1:
            parts.append(f"split{self.split}")
        if self.activation != "f32":
            parts.append(f"act-{self.activation}")
        if self.router_noise_ulps or self.noise_seed:
            seed = f"@{self.noise_seed}" if self.noise_seed else ""
            parts.append(f"noise{self.router_noise_ulps}{seed}")
        if self.kv != "f32":
            parts.append(f"kv-{self.kv}")
        return "+".join(parts) or "default"

    @classmethod
    def parse(cls, spec: str) -> Numerics:
        """Numerics from a spec string (see the module docstring)."""
        fields: dict[str, Any] = {}
        text = spec.strip().lower()
        if text in ("", "default", "base", "baseline"):
            return cls()
        for part in text.split("+"):
            part = part.strip()
            if part in ("seq", "sequential"):
                fields["reduction"] = "sequential"
            elif part == "pairwise":
                fields["reduction"] = "pairwise"
            elif part == "dot-bf16":
                fields["reduction"] = "dot-bf16"
            elif m := re.fullmatch(r"blocked(\d+)", part):
                fields["reduction"], fields["lanes"] = "blocked", int(m.group(1))
            elif part == "fma":
                fields["fma"] = True
            elif m := re.fullmatch(r"split(\d+)", part):
                fields["split"] = int(m.group(1))
            elif m := re.fullmatch(r"act-(bf16|f16|f32)", part):
                fields["activation"] = m.group(1)
            elif m := re.fullmatch(r"kv-(f16|f32)", part):
                fields["kv"] = m.group(1)
            elif m := re.fullmatch(r"noise(\d+)(?:@(\d+))?", part):
                fields["router_noise_ulps"] = int(m.group(1))
                fields["noise_seed"] = int(m.group(2) or 0)
            else:
                raise NumericsError(f"unknown numerics component {part!r} in {spec!r} (expected "
                                    "seq, pairwise, blockedL, dot-bf16, fma, splitS, act-bf16, act-f16, "
                                    "kv-f16, noiseN[@seed])")
        if (fields.get("fma") or fields.get("split", 0) > 1) and "reduction" not in fields:
            fields["reduction"] = "sequential"  # the engine's reading of DEFAULT + fma/split
        return cls(**fields)

    def apply(self, config: Any) -> None:
        """Write the fields into a cffi `col_session_config *`."""
        config.reduction = REDUCTIONS[self.reduction]
        config.lanes = self.lanes
        config.fma = 1 if self.fma else 0
        config.split = self.split
        config.activation = ACTIVATIONS[self.activation]
        config.router_noise_ulps = self.router_noise_ulps
        config.noise_seed = self.noise_seed
        config.kv_precision = KV_PRECISIONS[self.kv]


def as_numerics(value: Numerics | str | dict[str, Any] | None) -> Numerics:
    """Accept a Numerics, a spec string, a dict of fields, or None (default)."""
    if value is None:
        return Numerics()
    if isinstance(value, Numerics):
        return value
    if isinstance(value, str):
        return Numerics.parse(value)
    if isinstance(value, dict):
        return Numerics(**value)
    raise NumericsError(f"numerics must be a Numerics, spec string or dict, got {value!r}")
