"""The tensor table as data: one row per tensor, filters, groupings and CSV export (Qt-free).

Owns what the Inspector's tensor table shows, so the Qt model over it only formats cells.
`rows_for(model)` turns the engine's tensor table into `TensorRow`s with the layer index and a
kind parsed from the name (docs/format.md's naming scheme). Stacked expert tensors
(`layers.L.moe_w1` [E, I, H]) are one row with `expert=None` and `n_experts=E`; grouping by
expert splits each into E virtual rows, each with the byte range of that expert's contiguous
slice, which is exactly what the engine reads when it dispatches that expert. The router
`moe_gate` [E, H] is split the same way (row e is expert e's gate row).

`filter_rows` matches a substring, or a glob when the pattern holds `*?[` (`RowLabels` does the
same for a table filtering the same rows at each keystroke); `export_csv` writes through a
temporary file and a rename, so a crash never leaves half a CSV.
"""

from __future__ import annotations

import fnmatch
import math
import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import compress, repeat
from typing import TYPE_CHECKING, Any

import numpy as np

from colibri.files import atomic_write_csv

if TYPE_CHECKING:  # pragma: no cover
    from colibri.engine import Model

DTYPE_SIZES = {"f32": 4, "f16": 2, "bf16": 2, "bf16x16": 2}
CHECK_STATES = ("ok", "bad", "unchecked")
KINDS = ("embedding", "attention", "norm", "router", "experts", "shared", "mlp", "output")
CSV_COLUMNS = ("name", "layer", "expert", "kind", "dtype", "shape", "offset", "nbytes", "crc32",
               "check")

_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class TensorRow:
    """One tensor (or, for expert grouping, one expert's slice of a stacked tensor).

    `offset`/`nbytes` are the absolute byte range shown (the slice for a virtual expert row)
    in file number `shard` of a multi-file checkpoint (0 otherwise); `shape` is the shape of
    that range. `n_experts` is E for a stacked expert tensor or the router, else 0;
    `expert_of` is the expert a whole tensor belongs to (a Hugging Face checkpoint's
    `experts.{e}.` tensors), else None. `index` is the tensor's index in the file's table."""

    name: str
    index: int
    layer: int | None
    expert: int | None
    kind: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    crc32: int
    check: str = "unchecked"
    n_experts: int = 0
    shard: int = 0
    expert_of: int | None = None

    @property
    def label(self) -> str:
        """The name as displayed: `layers.0.moe_w1[3]` for expert 3's slice."""
        return self.name if self.expert is None else f"{self.name}[{self.expert}]"

    @property
    def shape_text(self) -> str:
        return "[" + ", ".join(map(str, self.shape)) + "]"

    @property
    def is_stacked(self) -> bool:
        """A tensor whose first axis is the expert axis (moe_w1/w2/w3, moe_gate)."""
        return self.n_experts > 0 and self.expert is None


def tensor_kind(name: str) -> str:
    """The kind of a tensor from its name (docs/format.md 'Tensor names and shapes')."""
    if name == "token_embd":
        return "embedding"
    if name == "output":
        return "output"
    if name == "output_norm":
        return "norm"
    match = _LAYER_RE.match(name)
    base = match.group(2) if match else name
    if base.endswith("_norm"):
        return "norm"
    if base.startswith("attn_"):
        return "attention"
    if base in ("moe_gate", "moe_gate_bias"):
        return "router"
    if base.startswith("moe_"):
        return "experts"
    if base.startswith("shared_"):
        return "shared"
    if base.startswith("mlp_"):
        return "mlp"
    return "other"


def tensor_layer(name: str) -> int | None:
    match = _LAYER_RE.match(name)
    return int(match.group(1)) if match else None


def rows_for(model: Model, check_status: Mapping[str, str] | None = None) -> list[TensorRow]:
    """One row per tensor of `model`, in file order."""
    status = check_status or {}
    rows = []
    for t in model.tensors:
        kind = tensor_kind(t.name)
        stacked = kind in ("experts", "router") and len(t.shape) >= 2
        rows.append(TensorRow(t.name, t.index, tensor_layer(t.name), None, kind, t.dtype,
                              tuple(t.shape), t.offset, t.nbytes, t.crc32,
                              status.get(t.name, "unchecked"), t.shape[0] if stacked else 0))
    return rows


def with_check_status(rows: Iterable[TensorRow], status: Mapping[str, str]) -> list[TensorRow]:
    return [replace(r, check=status.get(r.name, r.check)) for r in rows]


def expert_slices(row: TensorRow) -> list[TensorRow]:
    """The per-expert virtual rows of a stacked tensor (itself, unchanged, otherwise)."""
    if not row.is_stacked:
        return [row]
    n = row.n_experts
    inner = row.shape[1:]
    per = row.nbytes // n
    return [replace(row, expert=e, shape=inner, offset=row.offset + e * per, nbytes=per)
            for e in range(n)]


# -- filtering -------------------------------------------------------------------------------


def name_matcher(pattern: str) -> Callable[[str], object]:
    """A case-insensitive test of names against `pattern`, truthy where a name matches: a
    substring, or a glob (fnmatch) when it has `*`, `?` or `[` (built once for a whole table;
    one regular expression either way, so a table's names are tested without a call into
    Python each)."""
    pattern = pattern.strip()
    if not pattern:
        return lambda _name: True
    if any(ch in pattern for ch in "*?["):
        rest = pattern.lstrip("*")
        if not rest:
            return lambda _name: True
        if rest != pattern:   # "*rest": rest matching a suffix, found by search (half the time)
            return re.compile(fnmatch.translate(rest), re.IGNORECASE).search
        return re.compile(fnmatch.translate(pattern), re.IGNORECASE).match
    return re.compile(re.escape(pattern), re.IGNORECASE).search


def _substring_of(pattern: str) -> str | None:
    """The substring `pattern` asks for, when it asks for one: no glob characters, or only
    stars around text that has none (`*.t1*`); else None."""
    pattern = pattern.strip()
    if not any(ch in pattern for ch in "*?["):
        return pattern or None
    inner = pattern.strip("*")
    starred = pattern.startswith("*") and pattern.endswith("*")
    return inner if starred and inner and not any(ch in inner for ch in "*?[") else None


class RowLabels:
    """Rows and their labels, read once, for filtering the same rows by name again and again
    (a table at each keystroke): each label is tested in C, and a substring, where pattern and
    labels are ASCII, against labels lower-cased once rather than by a case-insensitive regular
    expression (docs/formats.md). Matches exactly what `name_matcher` matches."""

    def __init__(self, rows: Iterable[TensorRow]) -> None:
        self.rows = list(rows)
        self._labels: list[str] | None = None   # read at the first filtering, not before
        self._lower: list[str] | None = None

    def matching(self, pattern: str) -> list[TensorRow]:
        """The rows whose label matches `pattern` (as `name_matcher`), in their order."""
        return list(compress(self.rows, self.mask(pattern)))

    def mask(self, pattern: str) -> list[bool]:
        """For each row, in order, whether its label matches `pattern`."""
        if self._labels is None:
            self._labels = [r.label for r in self.rows]
            if all(map(str.isascii, self._labels)):
                self._lower = [label.lower() for label in self._labels]
        substring = _substring_of(pattern)
        if substring is not None and substring.isascii() and self._lower is not None:
            return list(map(operator.contains, self._lower, repeat(substring.lower())))
        return list(map(bool, map(name_matcher(pattern), self._labels)))


def stable_order(keys: Sequence[Any] | np.ndarray, reverse: bool = False) -> list[int]:
    """The positions of `keys` in ascending order (descending where `reverse`), equal keys in
    their given order either way, as `sorted` orders them. Integer keys given as an int64
    array are sorted by numpy, which leaves reading the keys out of the rows the only cost."""
    if isinstance(keys, np.ndarray):
        return np.argsort(-keys if reverse else keys, kind="stable").tolist()
    return sorted(range(len(keys)), key=keys.__getitem__, reverse=reverse)


def name_matches(name: str, pattern: str) -> bool:
    """Case-insensitive substring match, or a glob (fnmatch) when `pattern` has `*`, `?` or `[`."""
    return bool(name_matcher(pattern)(name))


def filter_rows(rows: Iterable[TensorRow], pattern: str = "", layer: int | None = None,
                dtype: str | None = None, kind: str | None = None) -> list[TensorRow]:
    """Rows whose label matches `pattern` and whose layer / dtype / kind equal the given ones."""
    kept = RowLabels(rows).matching(pattern) if pattern.strip() else list(rows)
    if layer is not None:
        kept = [r for r in kept if r.layer == layer]
    if dtype is not None:
        kept = [r for r in kept if r.dtype == dtype]
    if kind is not None:
        kept = [r for r in kept if r.kind == kind]
    return kept


# -- grouping --------------------------------------------------------------------------------

Group = tuple[str, list[TensorRow]]


def group_by_layer(rows: Sequence[TensorRow], shown: Iterable[int] | None = None) -> list[Group]:
    """'global (before layers)' (rows without a layer that come before the first with one, as
    `rows` are given: token_embd), 'layer 0', 'layer 1', ..., 'global (after layers)'
    (output_norm, output). Each group lists the rows at positions `shown`, in that order (a
    filter's rows in a sort's order; default: every row as given), so which group a row is in
    depends on neither."""
    first_layered = next((i for i, r in enumerate(rows) if r.layer is not None), len(rows))
    before: list[TensorRow] = []
    after: list[TensorRow] = []
    layers: dict[int, list[TensorRow]] = {}
    for i in range(len(rows)) if shown is None else shown:
        r = rows[i]
        if r.layer is None:
            (before if i < first_layered else after).append(r)
        else:
            layers.setdefault(r.layer, []).append(r)
    groups: list[Group] = []
    if before:
        groups.append(("global (before layers)", before))
    groups.extend((f"layer {layer}", layers[layer]) for layer in sorted(layers))
    if after:
        groups.append(("global (after layers)", after))
    return groups


def group_by_expert(rows: Sequence[TensorRow]) -> list[Group]:
    """'expert 0' ... 'expert E-1', each holding that expert's slice of every stacked tensor
    (router row and moe_w1/w2/w3 of every layer) and its own tensors, then 'not per expert'
    with everything else."""
    experts: dict[int, list[TensorRow]] = {}
    other: list[TensorRow] = []
    for r in rows:
        if r.is_stacked:
            for sliced in expert_slices(r):
                assert sliced.expert is not None
                experts.setdefault(sliced.expert, []).append(sliced)
        elif r.expert_of is not None:
            experts.setdefault(r.expert_of, []).append(r)
        else:
            other.append(r)
    groups: list[Group] = [(f"expert {e}", experts[e]) for e in sorted(experts)]
    if other:
        groups.append(("not per expert", other))
    return groups


GROUPINGS = ("none", "layer", "expert")


def group_rows(rows: Sequence[TensorRow], grouping: str) -> list[Group]:
    """`grouping` 'none' gives one unnamed group holding `rows`."""
    if grouping == "none":
        return [("", list(rows))]
    if grouping == "layer":
        return group_by_layer(rows)
    if grouping == "expert":
        return group_by_expert(rows)
    raise ValueError(f"unknown grouping {grouping!r}; expected one of {', '.join(GROUPINGS)}")


# -- export ----------------------------------------------------------------------------------


def csv_record(row: TensorRow) -> list[str]:
    expert = row.expert if row.expert is not None else row.expert_of
    return [row.label, "" if row.layer is None else str(row.layer),
            "" if expert is None else str(expert), row.kind, row.dtype,
            "x".join(map(str, row.shape)), str(row.offset), str(row.nbytes),
            f"{row.crc32:08x}" if row.expert is None else "", row.check]


write_csv_atomic = atomic_write_csv


def export_csv(rows: Iterable[TensorRow], path: str | os.PathLike[str]) -> None:
    """The rows as CSV with the columns of CSV_COLUMNS."""
    write_csv_atomic(path, CSV_COLUMNS, (csv_record(r) for r in rows))


def element_count(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 0


__all__ = ["CHECK_STATES", "CSV_COLUMNS", "GROUPINGS", "Group", "KINDS", "RowLabels", "TensorRow",
           "element_count", "export_csv", "expert_slices", "filter_rows", "group_by_expert",
           "group_by_layer", "group_rows", "name_matcher", "name_matches", "rows_for",
           "stable_order", "tensor_kind", "tensor_layer", "with_check_status", "write_csv_atomic"]
