"""GraniteMoeShared (`granitemoeshared`): GraniteMoE (colibri.families.granitemoe) plus, when
shared_intermediate_size > 0, a shared MLP on every layer whose output is added to the routed
experts' unscaled, before the residual multiplier: shared_mlp.input_linear [2S, H] (gate rows,
then up rows) and shared_mlp.output_linear [H, S]."""

from __future__ import annotations

from typing import Any

from colibri.families import granitemoe
from colibri.families.common import Architecture, Config, Planner
from colibri.fileformat import ARCH_GRANITEMOESHARED

MODEL_TYPE = "granitemoeshared"
ALIASES = granitemoe.ALIASES
DEFAULTS: dict[str, Any] = dict(granitemoe.DEFAULTS, shared_intermediate_size=0)


def architecture(cfg: Config) -> Architecture:
    return granitemoe.granite_architecture(cfg, ARCH_GRANITEMOESHARED,
                                           cfg.int("shared_intermediate_size", minimum=0))


def layer_tensors(p: Planner, a: Architecture, layer: int) -> None:
    granitemoe.layer_tensors(p, a, layer)
    if a.hp.d_ff_shared:
        granitemoe.shared_mlp(p, a, layer)
