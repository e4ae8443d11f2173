"""Quantised panels on the Python side (docs/format.md, "Quantised panels"): the converter's
`--layout`, the re-layout of an existing file, and the readers of quantised tensors giving the
same results on a row file and its panel copy. (That the engine computes the same logits from
both is the engine tests' concern, not repeated here.)"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from colibri import fileformat as ff
from colibri.cli import main
from colibri.convert import ConversionError, layout_target
from colibri.engine import Model
from colibri.jitter.weights import convert_weights
from colibri.reference.diff import default_tolerance
from colibri.relayout import relayout
from quant_models import make_model

sys.path.insert(0, str(Path(__file__).parent))


def _table(path: Path) -> dict[str, tuple[int, tuple[int, ...], bytes]]:
    """name -> (dtype, shape, stored bytes), read from the file's tensor table by hand (the
    engine may not read every dtype a test writes)."""
    image = path.read_bytes()
    n_tensors = struct.unpack_from("<I", image, 0x14)[0]
    table = struct.unpack_from("<Q", image, 0x28)[0]
    out = {}
    for i in range(n_tensors):
        entry = table + i * ff.TENSOR_ENTRY_SIZE
        name = image[entry:entry + ff.TENSOR_NAME_MAX].rstrip(b"\0").decode()
        dtype, ndim, *shape = struct.unpack_from("<II4Q", image, entry + ff.TENSOR_NAME_MAX)
        offset, nbytes = struct.unpack_from("<QQ", image, entry + ff.TENSOR_NAME_MAX + 40)
        out[name] = (dtype, tuple(shape[:ndim]), image[offset:offset + nbytes])
    return out


def _assert_panel_copy(rows: Path, panels: Path) -> int:
    """`panels` holds `rows`' tensors, those layout_target puts in panels rearranged by
    ff.to_panels (and dtype 7/8), every other one as it is; returns how many were rearranged."""
    a, b = _table(rows), _table(panels)
    assert list(a) == list(b)
    rearranged = 0
    for name, (dtype, shape, data) in a.items():
        to, shape_b, data_b = b[name]
        assert shape_b == shape and len(data_b) == len(data), name
        assert to == layout_target(name, shape, dtype, "panels"), name
        if to != dtype:
            rearranged += 1
            expected = ff.to_panels(np.frombuffer(data, np.uint8), dtype, shape[-1]).tobytes()
            assert data_b == expected, name
        else:
            assert data_b == data, name
    return rearranged


def test_layout_target_policy() -> None:
    """Panels for q8_0/q4_0 matrices and stacks of whole 8-row panels, the LM head too, but not
    the embeddings; "rows" undoes it; other dtypes and shapes keep theirs."""
    q8, q4, p8, p4 = ff.DTYPE_Q8_0, ff.DTYPE_Q4_0, ff.DTYPE_Q8_0X8, ff.DTYPE_Q4_0X8
    assert layout_target("layers.0.moe_w1", (8, 96, 128), q8, "panels") == p8
    assert layout_target("layers.0.attn_q", (128, 128), q4, "panels") == p4
    assert layout_target("layers.0.attn_k", (36, 128), q4, "panels") == q4   # 36 % 8
    assert layout_target("output", (256, 128), q8, "panels") == p8
    assert layout_target("token_embd", (256, 128), q4, "panels") == q4
    assert layout_target("layers.0.attn_q", (128, 128), ff.DTYPE_BF16, "panels") == ff.DTYPE_BF16
    assert layout_target("layers.0.attn_q", (128, 128), p8, "rows") == q8
    assert layout_target("layers.0.attn_q", (128, 128), q8, "rows") == q8
    with pytest.raises(ConversionError, match="layout 'tiles' not supported"):
        layout_target("layers.0.attn_q", (128, 128), q8, "tiles")


def test_converter_writes_panels_by_default(tmp_path: Path) -> None:
    """`convert(..., quantize=)` stores its blocks in panels unless asked for rows: the two
    files hold the same tensors, the panel ones rearranged as ff.to_panels says."""
    pytest.importorskip("transformers")
    import hf_reference as hr
    from colibri.convert import convert

    variant = next(v for v in hr.VARIANTS if v.name == "mixtral-base")
    hf = hr.save(hr.build(variant), tmp_path / "hf")
    convert(hf, tmp_path / "rows.colibri", "f32", quantize="q4", quantize_tensors="all",
            layout="rows")
    convert(hf, tmp_path / "panels.colibri", "f32", quantize="q4", quantize_tensors="all")
    assert {d for d, _, _ in _table(tmp_path / "rows.colibri").values()} >= {ff.DTYPE_Q4_0}
    assert _assert_panel_copy(tmp_path / "rows.colibri", tmp_path / "panels.colibri") >= 8


def test_gguf_import_writes_panels_by_default(tmp_path: Path) -> None:
    """A Q8_0 GGUF file's blocks are kept and, by default, laid out in panels."""
    from colibri.convert_gguf import convert_gguf

    gguf = Path(__file__).parent / "fixtures" / "gguf" / "mixtral-q8_0.gguf"
    convert_gguf(gguf, tmp_path / "rows.colibri", layout="rows")
    convert_gguf(gguf, tmp_path / "panels.colibri")
    assert _assert_panel_copy(tmp_path / "rows.colibri", tmp_path / "panels.colibri") >= 3


@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_relayout_to_panels_rearranges_only_the_panel_tensors(tmp_path: Path,
                                                              quant: str) -> None:
    rows = make_model(tmp_path, quant=quant, which="all")
    names = relayout(rows, tmp_path / "panels.colibri", "panels")
    assert _assert_panel_copy(rows, tmp_path / "panels.colibri") == len(names) > 0
    assert "output" in names and "token_embd" not in names


@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_relayout_there_and_back_gives_the_original_file(tmp_path: Path, quant: str) -> None:
    rows = make_model(tmp_path, quant=quant, which="all")
    relayout(rows, tmp_path / "panels.colibri", "panels")
    relayout(tmp_path / "panels.colibri", tmp_path / "back.colibri", "rows")
    assert (tmp_path / "back.colibri").read_bytes() == rows.read_bytes()


def test_relayout_refuses_data_that_fails_its_crc(tmp_path: Path) -> None:
    """A damaged tensor is not rearranged (its new CRC would hide the damage): nothing is
    written."""
    rows = make_model(tmp_path, quant="q8")
    with Model.open(rows) as m:
        offset = m.tensor_info("layers.1.moe_w2").offset
    image = bytearray(rows.read_bytes())
    image[offset + 100] ^= 0x01
    rows.write_bytes(bytes(image))
    out = tmp_path / "panels.colibri"
    with pytest.raises(ConversionError, match="layers.1.moe_w2.*CRC-32"):
        relayout(rows, out, "panels")
    assert not out.exists()


def test_cli_convert_relays_out_a_colibri_file(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`colibri convert FILE.colibri OUT --layout` re-lays out; --quantize needs a checkpoint."""
    rows = make_model(tmp_path, quant="q4")
    out = tmp_path / "panels.colibri"
    assert main(["convert", str(rows), str(out)]) == 0
    assert _assert_panel_copy(rows, out) == 9
    assert main(["convert", str(rows), str(tmp_path / "q8.colibri"), "--quantize", "q8"]) != 0
    assert "only re-laid out" in capsys.readouterr().err
    assert not (tmp_path / "q8.colibri").exists()


def test_jitter_weights_write_the_layout_asked(tmp_path: Path) -> None:
    """The jitter lab's quantised copy is the converter's: panels by default, rows on request,
    the same blocks."""
    with Model.open(make_model(tmp_path)) as m:
        convert_weights(m, "f32", tmp_path / "rows.colibri", quantize="q8", layout="rows")
        convert_weights(m, "f32", tmp_path / "panels.colibri", quantize="q8")
    assert _assert_panel_copy(tmp_path / "rows.colibri", tmp_path / "panels.colibri") == 9


def test_diff_tolerance_of_panels_is_that_of_their_rows() -> None:
    for rows, panels in (("q8_0", "q8_0x8"), ("q4_0", "q4_0x8")):
        assert default_tolerance(panels, "bf16", "f32") == default_tolerance(rows, "bf16", "f32")


@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_stats_of_a_panel_copy_are_the_row_files(tmp_path: Path, quant: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Statistics, histogram, heatmap and the expert comparison read panel tensors as the rows
    they hold: equal on a row file and its panel copy; in chunks of one panel too (to rounding:
    the chunks' moments merge in another order)."""
    from colibri.inspection import stats as S

    rows = make_model(tmp_path, quant=quant, which="all")
    panels = tmp_path / "panels.colibri"
    relayout(rows, panels, "panels")
    with Model.open(rows) as a, Model.open(panels) as b:
        assert b.tensor_info("layers.0.moe_w1").dtype == ff.QUANT_NAMES[ff.PANEL_OF[
            ff.QUANT_BY_NAME[quant]]]
        for name, expert in (("layers.0.moe_w1", 5), ("layers.2.attn_q", None)):
            x = S.analyse_tensor(a, name, expert, max_cells=16)
            y = S.analyse_tensor(b, name, expert, max_cells=16)
            assert x.stats == y.stats and np.array_equal(x.histogram.counts, y.histogram.counts)
            assert np.array_equal(x.heatmap.cells, y.heatmap.cells)
            monkeypatch.setattr(S, "CHUNK_ELEMENTS", 1)
            z = S.analyse_tensor(b, name, expert, max_cells=16)
            monkeypatch.undo()
            for field in ("count", "finite_count", "nan_count", "zero_count", "min", "max"):
                assert getattr(z.stats, field) == getattr(x.stats, field), field
            for field in ("mean", "std", "norm"):
                assert getattr(z.stats, field) == pytest.approx(getattr(x.stats, field),
                                                                rel=1e-12), field
            assert np.array_equal(z.histogram.counts, x.histogram.counts)
            np.testing.assert_allclose(z.heatmap.cells, x.heatmap.cells, rtol=1e-12)
        assert S.compare_experts(a, 1).table() == S.compare_experts(b, 1).table()
