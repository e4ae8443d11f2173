"""Chunked statistics, histogram, heatmap and expert comparison against numpy on real files."""

from __future__ import annotations

import numpy as np
import pytest

from colibri.engine import Model
from colibri.inspection import stats as S
from colibri.values import Cancelled


def _reference(tiny, name: str) -> np.ndarray:
    """The stored values widened to float64 (what the file really holds)."""
    return Model.open(tiny.path).tensor_f32(name).astype(np.float64)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_stats_equal_numpy(tiny_model, dtype):
    tiny = tiny_model(dtype=dtype)
    ref = _reference(tiny, "token_embd")
    s = S.tensor_stats(Model.open(tiny.path), "token_embd")
    assert s.count == ref.size and s.nan_count == s.inf_count == 0
    assert s.min == ref.min() and s.max == ref.max()
    assert s.mean == pytest.approx(ref.mean(), rel=1e-9, abs=1e-12)
    assert s.std == pytest.approx(ref.std(), rel=1e-9)
    assert s.norm == pytest.approx(np.linalg.norm(ref), rel=1e-9)
    assert s.zero_fraction == np.mean(ref == 0)


def test_stats_of_stored_values_match_written_values_for_f32(tiny_model):
    tiny = tiny_model()
    s = S.tensor_stats(Model.open(tiny.path), "layers.0.attn_q")
    assert s.max == float(tiny.values["layers.0.attn_q"].max())


def test_expert_slice_stats_equal_numpy(tiny_model):
    tiny = tiny_model(dtype="bf16")
    ref = _reference(tiny, "layers.1.moe_w3")[2]
    s = S.tensor_stats(Model.open(tiny.path), "layers.1.moe_w3", expert=2)
    assert s.count == ref.size
    assert s.mean == pytest.approx(ref.mean(), rel=1e-9, abs=1e-12)
    assert s.std == pytest.approx(ref.std(), rel=1e-9)


def test_small_chunks_give_the_same_stats(tiny_model, monkeypatch):
    tiny = tiny_model(dtype="f16")
    model = Model.open(tiny.path)
    whole = S.tensor_stats(model, "output")
    monkeypatch.setattr(S, "CHUNK_ELEMENTS", 7)
    chunked = S.tensor_stats(model, "output")
    assert chunked.min == whole.min and chunked.max == whole.max and chunked.count == whole.count
    assert chunked.mean == pytest.approx(whole.mean, rel=1e-9, abs=1e-15)
    assert chunked.std == pytest.approx(whole.std, rel=1e-9)


def test_cancel_stops_between_chunks(tiny_model, monkeypatch):
    monkeypatch.setattr(S, "CHUNK_ELEMENTS", 16)
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 2

    with pytest.raises(Cancelled):
        S.analyse_tensor(Model.open(tiny_model().path), "token_embd", cancelled=cancelled)
    assert len(calls) == 3


def test_progress_reaches_the_total(tiny_model):
    seen = []
    S.analyse_tensor(Model.open(tiny_model().path), "token_embd",
                     progress=lambda done, total, text="": seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] and all(d <= t for d, t in seen)


def test_histogram_counts_every_finite_value_in_numpy_bins(tiny_model):
    tiny = tiny_model(dtype="bf16")
    ref = _reference(tiny, "layers.0.attn_o")
    a = S.analyse_tensor(Model.open(tiny.path), "layers.0.attn_o")
    counts, edges = np.histogram(ref, bins=100, range=(ref.min(), ref.max()))
    np.testing.assert_allclose(a.histogram.edges, edges)
    np.testing.assert_array_equal(a.histogram.counts, counts)


def test_heatmap_is_block_mean_of_abs(tiny_model):
    tiny = tiny_model()
    ref = np.abs(_reference(tiny, "token_embd"))            # [50, 32]
    a = S.analyse_tensor(Model.open(tiny.path), "token_embd", max_cells=8)
    hm = a.heatmap
    assert (hm.block_rows, hm.block_cols) == (7, 4) and hm.cells.shape == (8, 8)
    np.testing.assert_allclose(hm.cells[0, 0], ref[:7, :4].mean(), rtol=1e-6)
    np.testing.assert_allclose(hm.cells[7, 7], ref[49:, 28:].mean(), rtol=1e-6)  # partial block


def test_heatmap_of_an_expert_slice(tiny_model):
    tiny = tiny_model()
    a = S.analyse_tensor(Model.open(tiny.path), "layers.0.moe_w1", expert=3)
    np.testing.assert_allclose(a.heatmap.cells, np.abs(tiny.values["layers.0.moe_w1"][3]),
                               rtol=1e-6)
    assert a.shape == tiny.values["layers.0.moe_w1"].shape[1:]


def test_one_dimensional_tensor_has_no_heatmap(tiny_model):
    a = S.analyse_tensor(Model.open(tiny_model().path), "output_norm")
    assert a.heatmap is None and a.stats.count == a.shape[0]


def test_nan_and_inf_are_counted_not_averaged(tiny_image, write_image):
    image = tiny_image()
    model = Model.open(write_image(image))
    info = model.tensor_info("layers.0.attn_q")
    model.close()
    image[info.offset:info.offset + 4] = np.float32(np.nan).tobytes()
    image[info.offset + 4:info.offset + 8] = np.float32(np.inf).tobytes()
    image[info.offset + 8:info.offset + 12] = np.float32(0).tobytes()
    # data CRCs are only checked on request, so the edited file still opens
    edited = Model.open(write_image(image, "nan.colibri"))
    s = S.tensor_stats(edited, "layers.0.attn_q")
    ref = edited.tensor_f32("layers.0.attn_q").astype(np.float64).ravel()[3:]
    assert (s.nan_count, s.inf_count, s.finite_count) == (1, 1, s.count - 2)
    assert s.max == max(ref.max(), 0.0) and s.zero_count >= 1
    assert s.mean == pytest.approx(np.append(ref, 0.0).mean(), rel=1e-9, abs=1e-12)


def test_compare_experts_equals_numpy(tiny_model):
    tiny = tiny_model(dtype="f16")
    model = Model.open(tiny.path)
    c = S.compare_experts(model, 1)
    assert c.n_experts == 4
    for m in ("moe_w1", "moe_w2", "moe_w3"):
        ref = model.tensor_f32(f"layers.1.{m}").astype(np.float64)
        np.testing.assert_allclose(c.column(m, "norm"),
                                   np.linalg.norm(ref.reshape(4, -1), axis=1), rtol=1e-9)
        np.testing.assert_allclose(c.column(m, "max"), ref.reshape(4, -1).max(axis=1))
    gate = tiny.values["layers.1.moe_gate"]
    np.testing.assert_array_equal(c.router_rows, gate)
    np.testing.assert_allclose(c.router_norms, np.linalg.norm(gate.astype(np.float64), axis=1),
                               rtol=1e-9)


def test_compare_experts_rejects_a_dense_layer(tiny_model):
    model = Model.open(tiny_model(dense_layers=(0,)).path)
    with pytest.raises(ValueError, match="not a MoE layer"):
        S.compare_experts(model, 0)
    assert S.moe_layers(model) == [1]


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_a_quantised_matrix_has_heatmap_and_stats_of_its_values(tmp_path, quant):
    """A q8_0/q4_0 matrix is stored as row bytes; the heatmap and statistics describe its
    dequantised values [rows, columns], not the bytes."""
    from quant_models import make_model
    model = Model.open(make_model(tmp_path, quant=quant))
    ref = model.tensor_f32("layers.0.moe_w1").astype(np.float64)     # [8, 96, 128]
    a = S.analyse_tensor(model, "layers.0.moe_w1", expert=5, max_cells=16)
    assert a.heatmap.shape == (96, 128) and a.heatmap.cells.shape == (16, 16)
    np.testing.assert_allclose(a.heatmap.cells[0, 0], np.abs(ref[5, :6, :8]).mean(), rtol=1e-6)
    assert a.stats.count == ref[5].size and a.stats.max == ref[5].max()
    assert a.stats.std == pytest.approx(ref[5].std(), rel=1e-9)
