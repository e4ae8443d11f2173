"""A Hugging Face checkpoint run by transformers, read layer by layer: the reference side of
`colibri diff` (colibri.reference.diff) and of the conformance tests.

Needs the `reference` extra (torch, transformers). Nothing here names a family's classes: each
transformers model class declares which of its modules records hidden states (the decoder layer)
and which records router logits (the router, with the index of the logits in its output), in
its `_can_record_outputs` table. Forward hooks on those modules read each layer's output (the
residual stream after the layer) and each router's output (logits, weights, chosen experts) of
one forward pass over the prompt, on the CPU, with eager attention and experts. A router that
returns no choice is read by its rule: the choice its MoE block hands its experts (DBRX), else
the top-k of what the rule ranks, weighted by the router's dense scores at them when it returns
some (Llama 4's (scores, logits)).

What a family's rule *ranks* (its selection score: sigmoid + correction bias for DeepSeek-V3,
softmax through moe_statics for ERNIE) and the groups it keeps are the one family-specific
reading, computed from the router's own attributes as its forward computes them, in SELECTIONS
(keyed by model_type); a family whose rule ranks its logits needs no entry.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import transformers

from colibri.margins import GROUP_MAX, GROUP_TOP2_SUM, GroupLimit
from colibri.values import CancelFlag, Progress, check_cancelled, never_cancelled, no_progress

DTYPES: dict[str, torch.dtype] = {"f32": torch.float32, "bf16": torch.bfloat16}


class ReferenceModelError(ValueError):
    """The checkpoint cannot be loaded or read as a reference; the message says what and where."""


@dataclass(frozen=True)
class ReferenceRun:
    """What transformers computed for a prompt (T positions, L layers, M MoE layers, E experts,
    k chosen per decision). Every array is a float32 / int32 numpy copy."""

    model_type: str
    model_class: str
    dtype: str                        # the precision transformers computed in: 'f32' or 'bf16'
    logits: np.ndarray                # [T, vocab]
    hidden: np.ndarray                # [T, L, d_model] the residual stream after each layer
    moe_layers: np.ndarray            # [M] layer index of each router
    router_logits: np.ndarray         # [T, M, E]
    expert_ids: np.ndarray            # [T, M, k] the router's chosen experts
    expert_weights: np.ndarray        # [T, M, k] their weights (NaN when the router gives none)
    selection_scores: np.ndarray      # [T, M, E] what the rule ranked
    chosen_groups: np.ndarray         # [T, M, g] kept groups, best first, -1 pad; g 0: no groups
    group_limits: tuple[GroupLimit, ...]  # [M]


# ---------------------------------------------------------------------------------------------
# Selection scores: what each family's rule ranks, read from its router


Selection = tuple[torch.Tensor, "torch.Tensor | None", GroupLimit]
SelectionFn = Callable[[Any, torch.Tensor], Selection]


def _ranks_logits(router: Any, logits: torch.Tensor) -> Selection:
    """A softmax without a bias ranks as its logits do."""
    return logits, None, GroupLimit()


def _sigmoid_bias_groups(router: Any, logits: torch.Tensor) -> Selection:
    """DeepSeek-V3 / GLM-4.5: sigmoid + e_score_correction_bias; groups by their best two."""
    sel = logits.sigmoid() + router.e_score_correction_bias.float()
    if router.num_group <= 1:
        return sel, None, GroupLimit()
    grouped = sel.view(-1, router.num_group, router.num_experts // router.num_group)
    scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
    kept = torch.topk(scores, router.topk_group, dim=-1)[1]
    return sel, kept, GroupLimit(router.num_group, router.topk_group, GROUP_TOP2_SUM)


def _deepseek_v2(router: Any, logits: torch.Tensor) -> Selection:
    """DeepSeek-V2: the softmax ranks as the logits; group_limited_greedy keeps the groups with
    the best maximum probability."""
    if router.topk_method != "group_limited_greedy":
        return logits, None, GroupLimit()
    probs = logits.softmax(dim=-1)
    scores = probs.view(-1, router.num_group, router.num_experts // router.num_group).amax(-1)
    kept = torch.topk(scores, router.topk_group, dim=-1)[1]
    return logits, kept, GroupLimit(router.num_group, router.topk_group, GROUP_MAX)


def _ernie(router: Any, logits: torch.Tensor) -> Selection:
    """ERNIE 4.5: the softmax through moe_statics (+ its correction bias)."""
    return router.moe_statics(logits.softmax(dim=-1)), None, GroupLimit()


SELECTIONS: dict[str, SelectionFn] = {
    "deepseek_v2": _deepseek_v2,
    "deepseek_v3": _sigmoid_bias_groups,
    "glm4_moe": _sigmoid_bias_groups,
    "ernie4_5_moe": _ernie,
}


# ---------------------------------------------------------------------------------------------
# Loading and running


def load(hf_dir: str | os.PathLike[str], dtype: str = "f32") -> Any:
    """The checkpoint in `hf_dir` as a transformers causal LM on the CPU in `dtype` ('f32' or
    'bf16'), eval mode, the plainest implementations (eager attention, one expert at a time).
    ReferenceModelError when it cannot be loaded."""
    if dtype not in DTYPES:
        raise ReferenceModelError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    path = os.fspath(hf_dir)
    if not os.path.isdir(path):
        raise ReferenceModelError(f"{path}: not a directory (a Hugging Face checkpoint directory "
                             f"with config.json)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ReferenceModelError(f"{path}: no config.json")
    bars = transformers.utils.logging
    quiet = not bars.is_progress_bar_enabled()
    bars.disable_progress_bar()   # our caller reports progress its own way
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype], attn_implementation="eager",
            experts_implementation="eager")
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ReferenceModelError(f"{path}: transformers cannot load it: {exc}") from exc
    finally:
        if not quiet:
            bars.enable_progress_bar()
    return model.eval()


def shape_of(model: Any) -> tuple[int, int, int]:
    """(layers, hidden size, vocabulary) of a loaded model, from its text config."""
    config = model.config.get_text_config()
    return (int(config.num_hidden_layers), int(config.hidden_size), int(config.vocab_size))


def _recorded(model: Any) -> tuple[type, type, int]:
    """(decoder layer class, router class, index of the logits in the router's output) as the
    model class declares them: the causal LM or the text model inside it (Llama 4 declares them
    on Llama4TextModel only)."""
    tables = (getattr(m, "_can_record_outputs", None) or {} for m in model.modules())
    table = next((t for t in tables if "hidden_states" in t and "router_logits" in t), {})
    layer, router = table.get("hidden_states"), table.get("router_logits")
    name = type(model).__name__
    if layer is None or router is None:
        raise ReferenceModelError(f"{name}: transformers declares no "
                             f"{'decoder layer' if layer is None else 'router'} to read "
                             f"(not a mixture-of-experts model?)")
    layer_cls = getattr(layer, "target_class", layer)
    return layer_cls, router.target_class, int(getattr(router, "index", 0) or 0)


def _tensor(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def run(model: Any, tokens: list[int], progress: Progress = no_progress,
        cancelled: CancelFlag = never_cancelled) -> ReferenceRun:
    """One forward pass of `model` (from `load`, or any transformers MoE causal LM) over
    `tokens`, read through hooks. Reports progress per layer and raises colibri.values.Cancelled
    between layers once `cancelled()`."""
    layer_cls, router_cls, logits_index = _recorded(model)
    layers = [m for m in model.modules() if isinstance(m, layer_cls)]
    n_layers = len(layers)
    owner = {}
    for i, layer in enumerate(layers):
        for m in layer.modules():
            if isinstance(m, router_cls):
                owner[id(m)] = i
    model_type = str(getattr(model.config, "model_type", ""))
    selection_of = SELECTIONS.get(model_type, _ranks_logits)
    hidden: list[torch.Tensor | None] = [None] * n_layers
    routed: dict[int, tuple[Any, tuple[Any, ...]]] = {}

    def before(i: int) -> Callable[..., None]:
        def hook(_module: Any, _inputs: Any) -> None:
            check_cancelled(cancelled)
            progress(i, n_layers, f"transformers: layer {i}")
        return hook

    def after(i: int) -> Callable[..., None]:
        def hook(_module: Any, _inputs: Any, out: Any) -> None:
            hidden[i] = _tensor(out).detach()
        return hook

    def router_hook(module: Any, _inputs: Any, out: Any) -> None:
        routed[owner[id(module)]] = (module, out if isinstance(out, tuple) else (out,))

    # A router that returns only its logits (DBRX's) leaves the choice to its MoE block, which
    # hands it to the block's experts module as (hidden_states, top_k_index, top_k_weights)
    chosen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def experts_hook(i: int) -> Callable[..., None]:
        def hook(_module: Any, args: Any, _out: Any) -> None:
            if len(args) >= 3:
                chosen[i] = (args[1].detach(), args[2].detach())
        return hook

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(before(i)))
        handles.append(layer.register_forward_hook(after(i)))
    for m in model.modules():
        if isinstance(m, router_cls) and id(m) in owner:
            handles.append(m.register_forward_hook(router_hook))
        experts = getattr(m, "experts", None)
        if isinstance(experts, torch.nn.Module) and any(
                isinstance(c, router_cls) and id(c) in owner for c in m.children()):
            router = next(c for c in m.children() if isinstance(c, router_cls))
            handles.append(experts.register_forward_hook(experts_hook(owner[id(router)])))
    try:
        with torch.no_grad():
            out = model(torch.tensor([list(tokens)], dtype=torch.long))
    finally:
        for h in handles:
            h.remove()
    progress(n_layers, n_layers, "transformers: done")
    if any(h is None for h in hidden):
        raise ReferenceModelError(f"{type(model).__name__}: a decoder layer did not run")
    T = len(tokens)
    moe_layers = sorted(routed)
    logits_rows, ids_rows, weight_rows, sel_rows, group_rows, limits = [], [], [], [], [], []
    with torch.no_grad():
        for layer in moe_layers:
            module, outs = routed[layer]
            logits = outs[logits_index].detach().float().reshape(T, -1)
            sel, kept, limit = selection_of(module, logits)
            if len(outs) >= 3:
                ids, weights = outs[2].reshape(T, -1), outs[1].float().reshape(T, -1)
            elif layer in chosen:  # what the block handed its experts
                ids, weights = (t.reshape(T, -1) for t in chosen[layer])
                weights = weights.float()
            else:  # a router that gives no choice: the rule's top-k of what it ranks
                k = int(getattr(module, "top_k", 1))
                ids = torch.topk(sel, k, dim=-1)[1]
                weights = torch.full(ids.shape, float("nan"))
                dense = [o for i, o in enumerate(outs) if i != logits_index
                         and isinstance(o, torch.Tensor) and o.numel() == logits.numel()]
                if len(outs) == 2 and dense:  # Llama 4's scores: [T, E], 0 off the chosen
                    weights = dense[0].detach().float().reshape(T, -1).gather(1, ids)
            logits_rows.append(logits)
            ids_rows.append(ids.long())
            weight_rows.append(weights)
            sel_rows.append(sel.float())
            group_rows.append(kept)
            limits.append(limit)
        kept_width = max((g.shape[1] for g in group_rows if g is not None), default=0)
        groups = [torch.full((T, kept_width), -1, dtype=torch.long) if g is None else g.long()
                  for g in group_rows]

        def stack(rows: list[torch.Tensor], dtype: Any) -> np.ndarray:
            if not rows:
                return np.zeros((T, 0, 0), dtype=dtype)
            return torch.stack(rows, dim=1).numpy().astype(dtype)

        names = {v: k for k, v in DTYPES.items()}
        return ReferenceRun(
            model_type=model_type, model_class=type(model).__name__,
            dtype=names.get(model.dtype, str(model.dtype)),
            logits=out.logits[0].float().numpy().astype(np.float32),
            hidden=torch.stack([h.reshape(T, -1).float() for h in hidden], dim=1).numpy()
            .astype(np.float32),  # type: ignore[union-attr]
            moe_layers=np.asarray(moe_layers, dtype=np.int32),
            router_logits=stack(logits_rows, np.float32),
            expert_ids=stack(ids_rows, np.int32),
            expert_weights=stack(weight_rows, np.float32),
            selection_scores=stack(sel_rows, np.float32),
            chosen_groups=(torch.stack(groups, dim=1).numpy().astype(np.int32) if groups
                           else np.zeros((T, 0, 0), np.int32)),
            group_limits=tuple(limits))


__all__ = ["DTYPES", "SELECTIONS", "ReferenceModelError", "ReferenceRun", "load", "run",
           "shape_of"]
