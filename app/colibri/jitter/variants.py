"""Variants of the jitter lab: a numerics setting of the engine plus, optionally, the same
checkpoint converted to another weight precision, or another of this machine's kernel paths.

Spec strings extend colibri.numerics' with a weight component, `w-f32`, `w-f16`, `w-bf16`
(e.g. `w-bf16`, `w-f16+blocked8`), and a kernel component, `k-portable`, `k-avx2`, `k-avx512f`, `k-avx512`,
`k-amx`: the engine's real kernels on that path, as a machine without the better ones would run
them (the baseline runs the best path this machine has). Lists are comma-separated.
"""

from __future__ import annotations

from dataclasses import dataclass

from colibri.numerics import Numerics, NumericsError
from colibri.values import KERNEL_PATHS

WEIGHT_DTYPES = ("f32", "f16", "bf16")

# The default list: every reduction shape (sequential, pairwise, the SIMD widths 4/8/16/32 with
# and without FMA), thread splits, activation, KV cache and weight precisions, and router-logit noise.
DEFAULT_VARIANTS = (
    "seq", "seq+fma", "pairwise", "pairwise+fma",
    "blocked4", "blocked8", "blocked16", "blocked32",
    "blocked4+fma", "blocked8+fma", "blocked16+fma", "blocked32+fma",
    "seq+split2", "seq+split4", "blocked8+fma+split4",
    "dot-bf16", "act-bf16", "act-f16", "kv-f16",
    "w-f32", "w-f16", "w-bf16",
    "noise1", "noise2", "noise4",
)


# Paths with another path's bits in every product, left out of the default list: `avx512f` (AVX-512
# without VNNI) computes exactly as `avx512` (tested in tests/test_kernels_determinism.py).
SAME_BITS_AS = {"avx512f": "avx512"}


def machine_kernel_variants() -> tuple[str, ...]:
    """`k-<path>` for every kernel path this machine runs below its best one (the baseline's),
    except a path whose bits another one listed or the baseline already has."""
    from colibri.engine import best_kernels   # here: the CLI's parser reads this module
    below = KERNEL_PATHS[:KERNEL_PATHS.index(best_kernels())]
    return tuple(f"k-{p}" for p in below
                 if SAME_BITS_AS.get(p) not in (*below, best_kernels()))


@dataclass(frozen=True)
class Variant:
    numerics: Numerics = Numerics()
    weights: str | None = None      # None = the file as it is; else f32 / f16 / bf16
    kernels: str | None = None      # None = the machine's best kernel path; else a KERNEL_PATHS name

    @property
    def name(self) -> str:
        parts = [] if self.weights is None else [f"w-{self.weights}"]
        if self.kernels is not None:
            parts.append(f"k-{self.kernels}")
        if not self.numerics.is_default or not parts:
            parts.append(self.numerics.spec)
        return "+".join(parts)

    @property
    def is_baseline(self) -> bool:
        return self.weights is None and self.kernels is None and self.numerics.is_default

    @classmethod
    def parse(cls, spec: str) -> Variant:
        weights = kernels = None
        rest = []
        for part in spec.strip().lower().split("+"):
            part = part.strip()
            if part.startswith("w-"):
                if part[2:] not in WEIGHT_DTYPES:
                    raise NumericsError(f"unknown weight precision {part!r} (w-f32, w-f16, w-bf16)")
                weights = part[2:]
            elif part.startswith("k-"):
                if part[2:] not in KERNEL_PATHS:
                    raise NumericsError(f"unknown kernel path {part!r} "
                                        f"({', '.join('k-' + p for p in KERNEL_PATHS)})")
                kernels = part[2:]
            elif part:
                rest.append(part)
        return cls(Numerics.parse("+".join(rest)), weights, kernels)


def parse_variants(text: str | None) -> list[Variant]:
    """A comma-separated list (None or '' = DEFAULT_VARIANTS and the machine's lower kernel
    paths), duplicates and the baseline dropped, order kept. A kernel path this machine does not
    run is refused (a session would silently run a lower one)."""
    specs = DEFAULT_VARIANTS + machine_kernel_variants() if not text else [
        s for s in text.split(",") if s.strip()]
    from colibri.engine import best_kernels
    best = KERNEL_PATHS.index(best_kernels())
    out: list[Variant] = []
    seen: set[str] = set()
    for spec in specs:
        v = Variant.parse(spec)
        if v.kernels is not None and KERNEL_PATHS.index(v.kernels) > best:
            raise NumericsError(f"this machine runs no {v.kernels} kernels (its best path is "
                                f"{KERNEL_PATHS[best]})")
        if v.kernels == KERNEL_PATHS[best]:  # the baseline's own path
            v = Variant(v.numerics, v.weights)
        if v.is_baseline or v.name in seen:
            continue
        seen.add(v.name)
        out.append(v)
    if not out:
        raise NumericsError("no variant other than the baseline was given")
    return out
