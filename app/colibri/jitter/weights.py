"""Weight-precision variants: the same checkpoint re-written with its matrices in f32, f16 or bf16,
optionally with some matrices block-quantised (q8_0/q4_0; by default the converter's default set,
the experts, stored in the converter's default layout, panels of 8 rows).

The copy keeps the header fields, every layer's routing rule and attention, the tokenizer and
metadata (a version-1 file is written as version 2, its rules stated); every tensor goes through
float32 (`Model.tensor_f32`, which dequantises q8_0/q4_0 rows and panels) and is stored in the
target dtype, except 1-D tensors and the routers (`moe_gate`), which docs/format.md keeps in f32.
So `w-f16` of an f32 file rounds every matrix to f16, and `w-f32` of an f16 file is the f16
values widened (which the kernels then read through a different load path).
"""

from __future__ import annotations

import os
from pathlib import Path

from colibri import fileformat as ff
from colibri.convert import apply_layout, check_layout, quantize_target
from colibri.engine import Model
from colibri.values import DEFAULT_LAYOUT, QUANTIZE_TENSORS

_DTYPE = {"f32": ff.DTYPE_F32, "f16": ff.DTYPE_F16, "bf16": ff.DTYPE_BF16}


def _storage_dtype(name: str, ndim: int, target: str) -> int:
    if ndim == 1 or name.endswith("moe_gate"):
        return ff.DTYPE_F32
    return _DTYPE[target]


def convert_weights(model: Model, target: str, out_path: str | os.PathLike[str],
                    quantize: str | None = None, quantize_tensors: str = "experts",
                    layout: str = DEFAULT_LAYOUT) -> Path:
    """Write `model` with its matrices stored as `target` (f32/f16/bf16) to `out_path`; with
    `quantize` ("q8"/"q4"), the matrices `quantize_tensors` selects (as `colibri convert
    --quantize-tensors`: the experts by default) are stored as q8_0/q4_0 blocks quantised from
    the float32 values instead (a matrix whose rows are not whole blocks of 32 stays `target`),
    in `layout` ("panels" or "rows", as `colibri convert --layout`)."""
    if target not in _DTYPE:
        raise ValueError(f"unknown weight precision {target!r}")
    if quantize is not None and quantize not in ff.QUANT_BY_NAME:
        raise ValueError(f"unknown quantisation {quantize!r}")
    if quantize_tensors not in QUANTIZE_TENSORS:
        raise ValueError(f"unknown set of tensors to quantise {quantize_tensors!r}")
    check_layout(layout)
    hp = model.hparams
    infos = [model.routing(layer) for layer in range(hp.n_layers)]
    kinds = [ff.LAYER_MOE if info.kind == "moe" else ff.LAYER_DENSE for info in infos]
    rules = [ff.RouteRule.from_info(info) if info.kind == "moe" else None for info in infos]
    attention = [ff.LayerAttention.from_info(info) for info in infos]
    specs = []
    for info in model.tensors:
        dtype = _storage_dtype(info.name, len(info.shape), target)
        shape = tuple(int(s) for s in info.shape)
        if quantize is not None and shape[-1] % ff.BLOCK_ELEMS == 0:
            dtype = quantize_target(info.name, shape, ff.QUANT_BY_NAME[quantize],
                                    quantize_tensors, hp) or dtype

        def load(name: str = info.name, dtype: int = dtype) -> object:
            if dtype in ff.BLOCK_BYTES:
                return ff.quantize(model.tensor_f32(name), dtype)
            return ff.to_storage(model.tensor_f32(name), dtype)

        specs.append(ff.TensorSpec(info.name, dtype, shape, load))
    user = model.metadata.get("user")
    metadata = dict(user) if isinstance(user, dict) else {}
    specs = apply_layout(specs, layout)
    metadata["jitter_weights"] = target if quantize is None else f"{target}+{quantize}"
    plan = ff.plan_file(hp, kinds, specs, tokenizer=model.tokenizer_json, metadata=metadata,
                        rules=rules, attention=attention)
    ff.write_colibri(out_path, plan)
    return Path(out_path)
