"""bf16 weights stored in panels of 16 rows (dtype 9, bf16x16; docs/format.md, "bf16 panels"): the
`bf16-panels` layout of the converter and of the re-layout, the values a panel file holds (those
of its row file), and how the engine computes from it. Each output of a panel product is one
chain over its row (exact: fused multiply-adds in column order; `dot-bf16`: vdpbf16ps lane steps),
where row tiles sum 16 lanes in a tree, so exact and `dot-bf16` logits differ from the row file's
in the last bits (tests/test_conformance.py holds panel files to transformers like row files); the
other numerics variants, defined on values, give the row file's bits. Prefill equals stepping and
thread counts change nothing; that every kernel path gives a panel product the same bits is
engine_c/tests/test_kernels.c's test_bf16_panels."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from colibri import fileformat as ff
from colibri.convert import layout_target
from colibri.engine import Model, Session
from colibri.inspection.stats import analyse_tensor
from colibri.relayout import relayout
from quant_models import make_model

sys.path.insert(0, str(Path(__file__).parent))

TOKENS = [int(t) for t in np.random.default_rng(11).integers(0, 256, size=10)]


def _files(tmp_path: Path) -> tuple[Path, Path]:
    """A bf16 row file (d_model 128, experts of 96 rows) and its bf16-panels copy."""
    rows = make_model(tmp_path, "mixtral", "bf16")
    panels = tmp_path / "panels.colibri"
    relayout(rows, panels, "bf16-panels")
    return rows, panels


def test_layout_target_puts_bf16_matrices_of_whole_panels_in_bf16x16() -> None:
    bf16, p16 = ff.DTYPE_BF16, ff.DTYPE_BF16X16
    assert layout_target("layers.0.moe_w1", (8, 96, 128), bf16, "bf16-panels") == p16
    assert layout_target("output", (256, 128), bf16, "bf16-panels") == p16
    assert layout_target("layers.0.attn_k", (40, 128), bf16, "bf16-panels") == bf16  # 40 % 16
    assert layout_target("layers.0.attn_k", (32, 127), bf16, "bf16-panels") == bf16  # odd columns
    assert layout_target("token_embd", (256, 128), bf16, "bf16-panels") == bf16
    assert layout_target("layers.0.attn_q", (128, 128), ff.DTYPE_F32, "bf16-panels") == ff.DTYPE_F32
    q8, q8x8 = ff.DTYPE_Q8_0, ff.DTYPE_Q8_0X8
    assert layout_target("layers.0.moe_w1", (8, 96, 128), q8, "bf16-panels") == q8x8
    assert layout_target("layers.0.moe_w1", (8, 96, 128), p16, "panels") == bf16
    assert layout_target("layers.0.moe_w1", (8, 96, 128), p16, "rows") == bf16


def test_panels_hold_each_pair_of_columns_of_16_rows_side_by_side() -> None:
    rows = np.arange(32 * 6, dtype=np.uint16).reshape(32, 6)
    panels = ff.bf16_to_panels(rows, 6)
    assert panels[:4].tolist() == [rows[0, 0], rows[0, 1], rows[1, 0], rows[1, 1]]
    assert panels[32:34].tolist() == [rows[0, 2], rows[0, 3]]  # the next pair of the first panel
    assert panels[16 * 6:16 * 6 + 2].tolist() == [rows[16, 0], rows[16, 1]]  # the second panel
    assert np.array_equal(ff.bf16_from_panels(panels, 6), rows)


def test_relayout_to_bf16_panels_and_back_gives_the_original_file(tmp_path: Path) -> None:
    rows, panels = _files(tmp_path)
    back = tmp_path / "back.colibri"
    relayout(panels, back, "rows")
    assert back.read_bytes() == rows.read_bytes()
    assert panels.read_bytes() != rows.read_bytes()


def test_panel_file_stores_bf16x16_and_reads_back_the_rows_values(tmp_path: Path) -> None:
    rows, panels = _files(tmp_path)
    with Model.open(rows) as a, Model.open(panels) as b:
        dtypes = {t.name: t.dtype for t in b.tensors}
        assert dtypes["layers.0.moe_w1"] == "bf16x16"
        assert dtypes["output"] == "bf16x16"
        assert dtypes["token_embd"] == "bf16"
        for t in a.tensors:
            assert np.array_equal(a.tensor_f32(t.name), b.tensor_f32(t.name)), t.name


def test_the_inspectors_analysis_of_a_panel_copy_is_the_row_files(tmp_path: Path) -> None:
    """Statistics, histogram and the heatmap, which places each value by its row and column, of
    whole tensors and of one expert's slice (decoded a whole panel at a time)."""
    rows, panels = _files(tmp_path)
    with Model.open(rows) as a, Model.open(panels) as b:
        for name, expert in (("layers.0.moe_w1", 3), ("layers.1.attn_q", None), ("output", None)):
            want, got = analyse_tensor(a, name, expert), analyse_tensor(b, name, expert)
            assert got.stats == want.stats, name
            assert np.array_equal(got.histogram.counts, want.histogram.counts), name
            assert np.array_equal(got.heatmap.cells, want.heatmap.cells), name
            assert got.dtype == "bf16x16" and want.dtype == "bf16"


def _prefill(path: Path, tokens: list[int], threads: int = 1,
             numerics: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    with Model.open(path) as m:
        s = Session(m, threads=threads, max_context=64, numerics=numerics)
        return s.prefill(tokens), s.trace.expert_ids.copy()


@pytest.mark.parametrize("numerics", [None, "dot-bf16"], ids=["exact", "dot-bf16"])
def test_prefill_equals_stepping_on_1_to_3_threads(tmp_path: Path, numerics: str | None) -> None:
    _, panels = _files(tmp_path)
    want, _ = _prefill(panels, TOKENS, threads=1, numerics=numerics)
    with Model.open(panels) as m:
        for threads in (1, 2, 3):
            assert np.array_equal(want, _prefill(panels, TOKENS, threads, numerics)[0]), threads
            s = Session(m, threads=threads, max_context=64, numerics=numerics)
            stepped = np.stack([s.step(t) for t in TOKENS])
            assert np.array_equal(want, stepped), threads


def test_exact_logits_are_the_row_files_up_to_the_order_of_the_sums(tmp_path: Path) -> None:
    rows, panels = _files(tmp_path)
    (la, ra), (lb, rb) = _prefill(rows, TOKENS), _prefill(panels, TOKENS)
    assert not np.array_equal(la, lb)  # one chain over a row, not 16 lanes and a tree
    np.testing.assert_allclose(lb, la, atol=1e-4 * max(1.0, float(np.abs(la).max())), rtol=0)
    assert np.array_equal(ra, rb)


def test_a_numerics_variant_gives_the_row_files_bits(tmp_path: Path) -> None:
    rows, panels = _files(tmp_path)
    for threads in (1, 2):
        (la, ra), (lb, rb) = (_prefill(rows, TOKENS, threads, "blocked8+fma+split2"),
                              _prefill(panels, TOKENS, threads, "blocked8+fma+split2"))
        assert np.array_equal(la, lb)
        assert np.array_equal(ra, rb)
