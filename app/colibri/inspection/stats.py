"""Tensor statistics, histograms, downsampled heatmaps and expert comparison (Qt-free).

Owns every number the "Tensor values" view shows, for a `.colibri` model and for a GGUF file or
safetensors checkpoint alike. It reads through a `TensorStore`: stored tensors by name as
zero-copy views of the mapping, and a `decode` from whole stored rows to float32 (`EngineTensors`
wraps the engine's `Model`; `colibri.inspection.foreign` supplies the other formats', with every
ggml block type dequantised). All of it streams over those views (sliced to one expert when
asked) in chunks of about `CHUNK_ELEMENTS` values, so memory stays bounded whatever the
tensor's size. Each function takes the `progress(done, total, text)` and `cancelled()`
callables of `colibri.inspector.tasks.Task` (colibri.values.Progress, CancelFlag) and raises
`colibri.values.Cancelled` between chunks when asked to stop.

Where each expert's matrices live is an `ExpertLayer`: a stacked tensor [E, ...] indexed by
expert (`.colibri`'s `layers.L.moe_w1`, GGUF's `ffn_gate_exps`), one tensor per expert (Hugging
Face's `experts.{e}.gate_proj`), or a row range of a fused one (`experts.gate_up_proj` [E, 2I,
H]: the gate is rows 0..I-1 of each expert's slice, the up projection rows I..2I-1).

Definitions (what the numbers mean):
  * min, max, mean, std (population), Frobenius `norm` are over the *finite* values; `nan_count`
    and `inf_count` count the others; `zero_fraction` is zeros / all values. mean and variance
    are merged chunk by chunk with Chan's parallel formula in float64, so the result does not
    drift on a billion values the way a running sum of squares would.
  * Block-quantised tensors (views of raw blocks, uint8 [..., row bytes]: q8_0 / q4_0, and every
    ggml type of a GGUF file) are dequantised row by row, so statistics describe the values the
    engine (or llama.cpp) computes with.
  * The histogram is a second pass: 100 equal bins over [min, max] of the finite values from
    the first pass (exact counts, no guessed range, at the price of reading the data twice).
  * The heatmap views the tensor as a matrix (a 2-D tensor or expert slice as is; N-D as
    [prod(shape[:-1]), shape[-1]]) and reduces it to at most HEATMAP_MAX x HEATMAP_MAX cells by
    blocks: each cell is the mean of |x| over the finite values of its block (NaN when a block
    has none). The mean magnitude shows structure (dead rows, scaled columns); an outlier shows
    up in max and in the histogram rather than as one bright pixel.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from colibri import fileformat as ff
from colibri.values import (CancelFlag, Cancelled, Progress, check_cancelled, never_cancelled,
                            no_progress)

if TYPE_CHECKING:  # pragma: no cover
    from colibri.engine import Model

# 1 Mi values (4 MiB as float32) per chunk: a cancel or a new selection waits for one chunk at
# most (a Q4_K chunk dequantises in about 40 ms here)
CHUNK_ELEMENTS = 1 << 20
HISTOGRAM_BINS = 100
HEATMAP_MAX = 512


BLOCK_DTYPES = tuple(ff.QUANT_NAMES.values())
EXPERT_MATRICES = ("moe_w1", "moe_w2", "moe_w3")


def rows_multiple(dtype: str) -> int:
    """The rows a chunk of a tensor of `dtype` must come in: a panel dtype's rows are decoded from
    whole panels (q8_0x8, q4_0x8: of 8; bf16x16: of 16), whose bytes are those rows' in the view."""
    if dtype == ff.BF16_NAMES[ff.DTYPE_BF16X16]:
        return ff.BF16_PANEL_ROWS
    return ff.PANEL_ROWS if ff.QUANT_BY_NAME.get(dtype) in ff.ROWS_OF else 1


def to_float32(chunk: np.ndarray, dtype: str) -> np.ndarray:
    """A chunk of a `.colibri` tensor's stored values as float32: f32 as is, f16 widened, bf16
    bits shifted (bf16x16: whole panels, put back in rows), and block-quantised rows (q8_0/q4_0:
    uint8 [rows, row bytes]; q8_0x8/q4_0x8: whole panels, [8 k rows, row bytes]) dequantised per
    row."""
    if dtype in BLOCK_DTYPES:
        code = ff.QUANT_BY_NAME[dtype]
        rows = chunk.reshape(-1, chunk.shape[-1]) if chunk.ndim else chunk.reshape(1, -1)
        n_cols = rows.shape[-1] // ff.BLOCK_BYTES[code] * ff.BLOCK_ELEMS
        values = ff.dequantize(rows, code, (rows.shape[0], n_cols))
        return values.reshape(*chunk.shape[:-1], n_cols) if chunk.ndim > 1 else values.reshape(-1)
    if dtype == ff.BF16_NAMES[ff.DTYPE_BF16X16]:  # whole panels: their rows, then as bf16
        chunk = ff.bf16_from_panels(chunk, chunk.shape[-1]).reshape(chunk.shape)
    if dtype in ff.BF16_NAMES.values():
        return (chunk.astype(np.uint32) << 16).view(np.float32)
    if chunk.dtype == np.float32:
        return chunk
    return chunk.astype(np.float32)


@dataclass(frozen=True)
class ExpertPart:
    """Where one expert's slice of one matrix lives: tensor `name`, at index `expert` of its
    first axis (None: the whole tensor is this expert's), rows `rows` [start, stop) of what
    remains as a matrix (None: all of them)."""

    name: str
    expert: int | None = None
    rows: tuple[int, int] | None = None


@dataclass(frozen=True)
class ExpertLayer:
    """One MoE layer: its router [E, H] and, per matrix ('moe_w1' gate, 'moe_w2' down, 'moe_w3'
    up), each expert's part (`parts[matrix][e]`)."""

    layer: int
    router: str
    n_experts: int
    parts: Mapping[str, tuple[ExpertPart, ...]]

    @classmethod
    def stacked(cls, layer: int, router: str, n_experts: int,
                names: Mapping[str, str]) -> ExpertLayer:
        """A layer whose matrices are stacked tensors [E, ...] (`names`: matrix -> tensor)."""
        return cls(layer, router, n_experts,
                   {m: tuple(ExpertPart(n, e) for e in range(n_experts))
                    for m, n in names.items()})


class TensorStore(Protocol):
    """What the statistics read (see the module docstring)."""

    def __contains__(self, name: object) -> bool: ...

    def tensor_info(self, name: str) -> Any:
        """An object with the tensor's `dtype` (name) and `shape` (of its values)."""

    def tensor(self, name: str) -> np.ndarray:
        """The stored values, a zero-copy view; block types as uint8 [..., row bytes]."""

    def decode(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Whole stored rows [n, stored row] of tensor `name` as float32 [n, columns]."""

    def expert_layers(self) -> list[ExpertLayer]:
        """The MoE layers, in layer order."""


class EngineTensors:
    """A `.colibri` model as a `TensorStore`: its stacked `layers.L.moe_*` are the experts."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def __contains__(self, name: object) -> bool:
        return name in self.model

    def tensor_info(self, name: str) -> Any:
        return self.model.tensor_info(name)

    def tensor(self, name: str) -> np.ndarray:
        return self.model.tensor(name)

    def decode(self, name: str, rows: np.ndarray) -> np.ndarray:
        return to_float32(rows, self.model.tensor_info(name).dtype)

    def expert_layers(self) -> list[ExpertLayer]:
        out = []
        for layer in moe_layers(self.model):
            prefix = f"layers.{layer}."
            gate = prefix + "moe_gate"
            names = {m: prefix + m for m in EXPERT_MATRICES if prefix + m in self.model}
            out.append(ExpertLayer.stacked(layer, gate, self.model.tensor_info(gate).shape[0],
                                           names))
        return out


def as_store(source: TensorStore | Model) -> TensorStore:
    """`source` itself, or an engine `Model` wrapped as `EngineTensors`."""
    from colibri.engine import Model
    return EngineTensors(source) if isinstance(source, Model) else source


@dataclass(frozen=True)
class _Matrix:
    """A tensor (or a part of it) as a 2-D matrix: the stored rows and the values' shape."""

    name: str
    stored: np.ndarray     # [rows, stored row] (row bytes for block types)
    shape: tuple[int, int]  # [rows, columns] of the values
    rows_multiple: int = 1  # chunks of `stored` are whole groups of this many rows (panels: 8)


def tensor_matrix(store: TensorStore, name: str, expert: int | None = None,
                  rows: tuple[int, int] | None = None) -> _Matrix:
    """The zero-copy stored view of a tensor (or of one expert's slice of a stacked tensor, or
    rows [start, stop) of it) as a 2-D matrix: 1-D tensors are one row, N-D ones
    [prod(shape[:-1]), shape[-1]]. A panel tensor's rows are cut on whole panels only."""
    info = store.tensor_info(name)
    shape = tuple(info.shape)
    view = store.tensor(name)
    multiple = rows_multiple(info.dtype)
    if expert is not None:
        if len(shape) < 2 or not 0 <= expert < shape[0]:
            raise ValueError(f"expert {expert} outside tensor {name!r} of shape {shape}")
        view, shape = view[expert], shape[1:]
    columns = shape[-1] if shape else 1
    view = view.reshape(-1, view.shape[-1] if view.ndim else 1)
    if rows is not None:
        if rows[0] % multiple or rows[1] % multiple:
            raise ValueError(f"rows {rows} of {info.dtype} tensor {name!r} are not whole panels "
                             f"of {multiple}")
        view = view[rows[0]:rows[1]]
    return _Matrix(name, view, (view.shape[0], columns), multiple)


def _row_chunks(matrix: np.ndarray, rows_multiple: int = 1) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, rows) blocks of about CHUNK_ELEMENTS values, row counts a multiple of
    `rows_multiple` (except the last)."""
    n_rows, n_cols = matrix.shape
    per = max(1, CHUNK_ELEMENTS // max(1, n_cols * rows_multiple)) * rows_multiple
    for start in range(0, n_rows, per):
        yield start, matrix[start:start + per]


# -- statistics ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorStats:
    """Summary of a tensor's values (see the module docstring for the definitions)."""

    count: int
    finite_count: int
    nan_count: int
    inf_count: int
    zero_count: int
    min: float
    max: float
    mean: float
    std: float
    norm: float

    @property
    def zero_fraction(self) -> float:
        return self.zero_count / self.count if self.count else 0.0

    def as_rows(self) -> list[tuple[str, float | int]]:
        """(label, value) pairs in display order."""
        return [("count", self.count), ("min", self.min), ("max", self.max),
                ("mean", self.mean), ("std", self.std), ("norm (Frobenius)", self.norm),
                ("NaN count", self.nan_count), ("Inf count", self.inf_count),
                ("zero fraction", self.zero_fraction)]


class _Accumulator:
    """Chunk-by-chunk merge of count, min, max, mean and M2 (Chan et al.)."""

    def __init__(self) -> None:
        self.count = self.finite = self.nan = self.inf = self.zeros = 0
        self.min, self.max = math.inf, -math.inf
        self.mean = 0.0
        self.m2 = 0.0
        self.sum_sq = 0.0

    def add(self, values: np.ndarray) -> None:
        flat = values.reshape(-1)
        self.count += flat.size
        finite_mask = np.isfinite(flat)
        n_finite = int(np.count_nonzero(finite_mask))
        if n_finite != flat.size:
            nans = int(np.count_nonzero(np.isnan(flat)))
            self.nan += nans
            self.inf += flat.size - n_finite - nans
            flat = flat[finite_mask]
        self.zeros += int(flat.size - np.count_nonzero(flat))
        if n_finite == 0:
            return
        x = flat.astype(np.float64)
        self.min = min(self.min, float(x.min()))
        self.max = max(self.max, float(x.max()))
        b_mean = float(x.mean())
        b_m2 = float(np.dot(x - b_mean, x - b_mean))
        self.sum_sq += float(np.dot(x, x))
        n_a, n_b = self.finite, n_finite
        n = n_a + n_b
        delta = b_mean - self.mean
        self.mean += delta * n_b / n
        self.m2 += b_m2 + delta * delta * n_a * n_b / n
        self.finite = n

    def result(self) -> TensorStats:
        if self.finite == 0:
            nan = math.nan
            return TensorStats(self.count, 0, self.nan, self.inf, self.zeros, nan, nan, nan, nan,
                               0.0)
        return TensorStats(self.count, self.finite, self.nan, self.inf, self.zeros, self.min,
                           self.max, self.mean, math.sqrt(max(0.0, self.m2 / self.finite)),
                           math.sqrt(self.sum_sq))


def _matrix_stats(m: _Matrix, decode: Any, progress: Progress, cancelled: CancelFlag,
                  done: int, total: int) -> TensorStats:
    acc = _Accumulator()
    for _start, rows in _row_chunks(m.stored, m.rows_multiple):
        check_cancelled(cancelled)
        acc.add(decode(rows))
        progress(done + acc.count, total, f"statistics of {m.name}")
    check_cancelled(cancelled)
    return acc.result()


def tensor_stats(source: TensorStore | Model, name: str, expert: int | None = None,
                 progress: Progress = no_progress, cancelled: CancelFlag = never_cancelled,
                 _done: int = 0, _total: int | None = None,
                 rows: tuple[int, int] | None = None) -> TensorStats:
    """Statistics of a tensor, or of expert `expert`'s slice of a stacked tensor (and of rows
    [start, stop) of that, a fused tensor's half)."""
    store = as_store(source)
    m = tensor_matrix(store, name, expert, rows)
    total = _total if _total is not None else m.shape[0] * m.shape[1]
    return _matrix_stats(m, lambda chunk: store.decode(name, chunk), progress, cancelled,
                         _done, total)


# -- histogram and heatmap -------------------------------------------------------------------


@dataclass(frozen=True)
class Histogram:
    """Counts of the finite values in HISTOGRAM_BINS equal bins; `edges` has bins + 1 entries."""

    counts: np.ndarray
    edges: np.ndarray


@dataclass(frozen=True)
class Heatmap:
    """Block-reduced |x| of a matrix: `cells[i, j]` = mean |x| over the finite values of rows
    [i*block_rows, ...) and columns [j*block_cols, ...). `shape` is the full matrix shape."""

    cells: np.ndarray
    block_rows: int
    block_cols: int
    shape: tuple[int, int]


def heatmap_blocks(shape: tuple[int, int], max_cells: int = HEATMAP_MAX) -> tuple[int, int]:
    """Block sizes (rows, cols) so the heatmap has at most max_cells cells per axis."""
    return max(1, -(-shape[0] // max_cells)), max(1, -(-shape[1] // max_cells))


class _HeatmapAccumulator:
    def __init__(self, shape: tuple[int, int], max_cells: int) -> None:
        self.shape = shape
        self.br, self.bc = heatmap_blocks(shape, max_cells)
        self.n_r = -(-shape[0] // self.br)
        self.n_c = -(-shape[1] // self.bc)
        self.sums = np.zeros((self.n_r, self.n_c), dtype=np.float64)
        self.counts = np.zeros((self.n_r, self.n_c), dtype=np.int64)

    def add(self, first_row: int, values: np.ndarray) -> None:
        """`values` are whole rows starting at `first_row`, a multiple of the block height."""
        rows, cols = values.shape
        absval = np.abs(values)
        finite = np.isfinite(absval)
        absval = np.where(finite, absval, 0.0)
        pad_r = (-rows) % self.br
        pad_c = (-cols) % self.bc
        if pad_r or pad_c:
            absval = np.pad(absval, ((0, pad_r), (0, pad_c)))
            finite = np.pad(finite, ((0, pad_r), (0, pad_c)))
        nb_r = absval.shape[0] // self.br
        block_sums = absval.reshape(nb_r, self.br, self.n_c, self.bc).sum(axis=(1, 3),
                                                                          dtype=np.float64)
        block_counts = finite.reshape(nb_r, self.br, self.n_c, self.bc).sum(axis=(1, 3))
        r0 = first_row // self.br
        self.sums[r0:r0 + nb_r] += block_sums
        self.counts[r0:r0 + nb_r] += block_counts

    def result(self) -> Heatmap:
        with np.errstate(invalid="ignore", divide="ignore"):
            cells = np.where(self.counts > 0, self.sums / np.maximum(self.counts, 1), np.nan)
        return Heatmap(cells.astype(np.float32), self.br, self.bc, self.shape)


@dataclass(frozen=True)
class TensorAnalysis:
    """Everything the tensor-values view shows for one tensor or expert slice."""

    name: str
    expert: int | None
    dtype: str
    shape: tuple[int, ...]
    stats: TensorStats
    histogram: Histogram
    heatmap: Heatmap | None


def analyse_tensor(source: TensorStore | Model, name: str, expert: int | None = None,
                   progress: Progress = no_progress, cancelled: CancelFlag = never_cancelled,
                   bins: int = HISTOGRAM_BINS, max_cells: int = HEATMAP_MAX) -> TensorAnalysis:
    """Statistics (pass 1), then histogram and heatmap (pass 2) of a tensor or expert slice.
    The heatmap is None for 1-D data."""
    store = as_store(source)
    m = tensor_matrix(store, name, expert)
    info = store.tensor_info(name)
    shape = tuple(info.shape[1:]) if expert is not None else tuple(info.shape)
    size = m.shape[0] * m.shape[1]
    total = 2 * size
    stats = tensor_stats(store, name, expert, progress, cancelled, 0, total)
    lo, hi = (stats.min, stats.max) if stats.finite_count else (0.0, 1.0)
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, bins + 1)
    counts = np.zeros(bins, dtype=np.int64)
    heat = _HeatmapAccumulator(m.shape, max_cells) if len(shape) >= 2 else None
    done = size
    block_rows = math.lcm(heat.br if heat is not None else 1, m.rows_multiple)
    for start, rows in _row_chunks(m.stored, block_rows):
        check_cancelled(cancelled)
        values = store.decode(name, rows)
        flat = values.reshape(-1)
        finite = flat[np.isfinite(flat)]
        counts += np.histogram(finite, bins=edges)[0]
        if heat is not None:
            heat.add(start, values.reshape(rows.shape[0], m.shape[1]))
        done += flat.size
        progress(done, total, f"histogram of {name}")
    check_cancelled(cancelled)
    dtype = str(info.dtype)
    return TensorAnalysis(name, expert, dtype, shape, stats, Histogram(counts, edges),
                          heat.result() if heat is not None else None)


# -- per-layer expert comparison -------------------------------------------------------------

STAT_FIELDS = ("norm", "mean", "std", "min", "max")


@dataclass(frozen=True)
class ExpertComparison:
    """For one MoE layer: per matrix ('moe_w1', 'moe_w2', 'moe_w3'), the stats of every expert's
    slice (`stats[matrix][e]`), plus the router: its rows [E, H] as float32 and their L2 norms."""

    layer: int
    n_experts: int
    stats: dict[str, list[TensorStats]]
    router_rows: np.ndarray
    router_norms: np.ndarray
    extra: dict[str, Any] = field(default_factory=dict)

    def column(self, matrix: str, stat: str) -> np.ndarray:
        """One statistic of one matrix for every expert, as float64 [E]."""
        return np.array([getattr(s, stat) for s in self.stats[matrix]], dtype=np.float64)

    def table(self) -> tuple[list[str], list[list[float | int]]]:
        """(header, rows) of the side-by-side table, one row per expert."""
        header = ["expert", "router norm"] + [f"{m.split('_')[1]} {s}" for m in EXPERT_MATRICES
                                              if m in self.stats for s in STAT_FIELDS]
        rows: list[list[float | int]] = []
        for e in range(self.n_experts):
            row: list[float | int] = [e, float(self.router_norms[e])]
            for m in EXPERT_MATRICES:
                if m in self.stats:
                    row.extend(float(getattr(self.stats[m][e], s)) for s in STAT_FIELDS)
            rows.append(row)
        return header, rows


def expert_layer(source: TensorStore | Model, layer: int) -> ExpertLayer:
    """The `ExpertLayer` of MoE layer `layer` (ValueError when it has no router)."""
    for found in as_store(source).expert_layers():
        if found.layer == layer:
            return found
    raise ValueError(f"layer {layer} is not a MoE layer (no router found for it)")


def compare_experts(source: TensorStore | Model, layer: int, progress: Progress = no_progress,
                    cancelled: CancelFlag = never_cancelled) -> ExpertComparison:
    """Statistics of every expert's w1, w2, w3 slices of MoE layer `layer`, and its router."""
    store = as_store(source)
    moe = expert_layer(store, layer)
    gate = tensor_matrix(store, moe.router)
    router_rows = np.array(store.decode(moe.router, gate.stored), dtype=np.float32)
    router_rows = router_rows.reshape(gate.shape)
    n_experts = moe.n_experts
    with np.errstate(invalid="ignore", over="ignore"):
        router_norms = np.sqrt(np.sum(np.where(np.isfinite(router_rows), router_rows, 0.0)
                                      .astype(np.float64) ** 2, axis=1))
    matrices = [m for m in EXPERT_MATRICES if m in moe.parts]
    parts = [(m, part, tensor_matrix(store, part.name, part.expert, part.rows))
             for m in matrices for part in moe.parts[m]]
    total = sum(x.shape[0] * x.shape[1] for _m, _p, x in parts)
    done = 0
    stats: dict[str, list[TensorStats]] = {m: [] for m in matrices}
    for m, part, matrix in parts:
        stats[m].append(_matrix_stats(matrix, lambda chunk, n=part.name: store.decode(n, chunk),
                                      progress, cancelled, done, total))
        done += matrix.shape[0] * matrix.shape[1]
    progress(total, total, f"experts of layer {layer}")
    return ExpertComparison(layer, n_experts, stats, router_rows, router_norms)


def moe_layers(model: Model) -> list[int]:
    """Indices of the layers that have a router."""
    return [layer for layer in range(model.hparams.n_layers)
            if f"layers.{layer}.moe_gate" in model]


__all__ = ["CHUNK_ELEMENTS", "EXPERT_MATRICES", "EngineTensors", "ExpertComparison",
           "ExpertLayer", "ExpertPart", "HEATMAP_MAX", "HISTOGRAM_BINS", "Heatmap", "Histogram",
           "STAT_FIELDS", "TensorAnalysis", "TensorStats", "TensorStore", "analyse_tensor",
           "as_store", "compare_experts", "expert_layer", "heatmap_blocks", "moe_layers",
           "tensor_matrix", "tensor_stats", "to_float32"]
