"""Conformance models as a reference diff sees them: a checkpoint saved by transformers, its
.colibri conversion and a prompt, built once per test module; and a way to break a conversion
(one tensor of the file edited after a clean conversion).

A plain module (test modules import it by name, as tiny_models); needs torch and transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import colibri
import hf_reference
from colibri.convert import convert

PROMPT = 24


@dataclass(frozen=True)
class Converted:
    hf_dir: Path
    path: Path          # the .colibri file
    tokens: list[int]


class Checkpoints:
    """`build(name, dtype="f32", checkpoint="f32")`: the conformance variant `name` saved in
    `checkpoint` precision, converted to `dtype`, with a random prompt; cached."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.cache: dict[str, Converted] = {}

    def __call__(self, name: str, dtype: str = "f32", checkpoint: str = "f32") -> Converted:
        key = f"{name}-{dtype}-{checkpoint}"
        if key not in self.cache:
            variant = next(v for v in hf_reference.VARIANTS if v.name == name)
            root = self.directory / key
            model = hf_reference.build(variant)
            if checkpoint == "bf16":
                model = model.to(torch.bfloat16)
            model.save_pretrained(root / "hf")
            convert(root / "hf", root / "m.colibri", dtype=dtype)
            rng = np.random.default_rng(7)
            tokens = [int(t) for t in rng.integers(0, variant.config["vocab_size"], PROMPT)]
            self.cache[key] = Converted(root / "hf", root / "m.colibri", tokens)
        return self.cache[key]


def edit_tensor(src: Path, dst: Path, name: str, edit: Callable[[np.ndarray], None]) -> Path:
    """Copy the file and change one tensor's f32 values in place (a broken conversion: the
    per-tensor checksums are only checked on request, so the file still opens)."""
    dst.write_bytes(src.read_bytes())
    with colibri.Model.open(dst) as model:
        info = model.tensor_info(name)
    assert info.dtype == "f32"
    values = np.memmap(dst, dtype=np.float32, mode="r+", offset=info.offset, shape=info.shape)
    edit(values)
    values.flush()
    del values
    return dst


def swap_first_two(values: np.ndarray) -> None:
    values[[0, 1]] = values[[1, 0]]
