"""Block-quantised weights (q8_0, q4_0): the numpy quantiser's error bounds and byte layout, the
validator's rules for block dtypes, the converter's --quantize, and files that run and stay
close to their f32 originals (top-1 agreement and routing agreement on a random model)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from colibri import fileformat as ff
from colibri.engine import Model, Session, validate_bytes
from quant_models import make_model


# q8_0: half a step (max|x| / 127 / 2). q4_0: half a step (max|x| / 8 / 2), except a value of
# opposite sign to the block's extreme and near its magnitude, which clips at 7 steps: one step.
@pytest.mark.parametrize("q,bound", [(ff.DTYPE_Q8_0, 0.5 / 127), (ff.DTYPE_Q4_0, 1.0 / 8)])
def test_round_trip_error_bounds(q: int, bound: float) -> None:
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    stored = ff.quantize(x, q)
    assert stored.shape == (64, 256 // 32 * ff.BLOCK_BYTES[q]) and stored.dtype == np.uint8
    back = ff.dequantize(stored, q, x.shape)
    amax = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True)
    err = np.abs(back - x).reshape(-1, 32) / amax
    assert err.max() <= bound + 2e-3  # + f16 rounding of the scale


def _f16_bytes(values: list[float]) -> bytes:
    return np.array(values, dtype=np.float32).astype("<f2").tobytes()


def test_block_layouts_byte_by_byte() -> None:
    # One row of two blocks: block 0 is -16..15 (max |x| = 16 at element 0), block 1 is
    # 4, 3.75, ..., -3.75 (max |x| = 4 at element 32), so the two scales differ.
    ramp = np.arange(32, dtype=np.float32) - 16.0
    x = np.concatenate([ramp, ramp * -0.25])
    assert ff.DTYPE_Q8_0 == 5 and ff.DTYPE_Q4_0 == 6  # 3 and 4 are the retired block layouts

    # q8_0: both f16 scales first, then the 64 int8 in element order.
    q8 = ff.quantize(x, ff.DTYPE_Q8_0).tobytes()
    assert len(q8) == 68 == ff.row_bytes(ff.DTYPE_Q8_0, 64)
    assert q8[:4] == _f16_bytes([16 / 127, 4 / 127])
    d8 = np.repeat(np.frombuffer(q8[:4], "<f2").astype(np.float32), 32)
    q = np.array([v for b in (x[:32], x[32:])
                  for v in _ggml_reference_block(b, ff.DTYPE_Q8_0)[1]], dtype=np.int8)
    assert q8[4:] == q.tobytes()
    assert struct.unpack("<b", q8[4:5])[0] == -127       # element 0 = -16
    assert struct.unpack("<b", q8[4 + 16:4 + 17])[0] == 0  # element 16 = 0
    assert struct.unpack("<b", q8[4 + 32:4 + 33])[0] == 127  # element 32 = 4, block 1's max
    assert np.array_equal(ff.dequantize(np.frombuffer(q8, np.uint8), ff.DTYPE_Q8_0, (64,)),
                          d8 * q.astype(np.float32))

    # q4_0: both f16 scales first, then 16 bytes per block; byte j of block b holds element
    # 32 b + j (low nibble) and 32 b + j + 16 (high nibble).
    q4 = ff.quantize(x, ff.DTYPE_Q4_0).tobytes()
    assert len(q4) == 36 == ff.row_bytes(ff.DTYPE_Q4_0, 64)
    assert q4[:4] == _f16_bytes([2.0, -0.5]) == b"\x00\x40\x00\xb8"  # d = m / -8, m = -16, 4
    d4 = np.repeat([2.0, -0.5], 32).astype(np.float32)
    nib = [v for b in (x[:32], x[32:]) for v in _ggml_reference_block(b, ff.DTYPE_Q4_0)[1]]
    expected = bytes(nib[32 * b + j] | nib[32 * b + j + 16] << 4
                     for b in range(2) for j in range(16))
    assert q4[4:] == expected
    assert q4[4] == 0x80   # element 0: -16/2+8 = 0 (low); element 16: 0/2+8 = 8 (high)
    assert q4[19] == 0xF8  # element 15: -1/2+8.5 -> 8 (low); element 31: 15/2+8.5 -> 15 (high)
    assert q4[20] == 0x80  # element 32: 4/-0.5+8.5 -> 0 (low); element 48: 0 -> 8 (high)
    assert q4[35] == 0xF8  # element 47: 0.25/-0.5+8.5 = 8 (low); element 63: 16 -> 15 (high)
    assert np.allclose(ff.dequantize(np.frombuffer(q4, np.uint8), ff.DTYPE_Q4_0, (64,)),
                       np.clip(np.trunc(x / d4 + 8.5), 0, 15) * d4 - 8 * d4)


def _ggml_reference_block(x: np.ndarray, q: int) -> tuple[np.float16, list[int]]:
    """One block as llama.cpp's quantize_row_q8_0_ref / quantize_row_q4_0_ref compute it, one
    f32 operation at a time: (the f16 scale, the 32 quantised values before packing)."""
    f32 = np.float32
    if q == ff.DTYPE_Q8_0:
        d = f32(max(abs(f32(v)) for v in x)) / f32(127)
    else:
        amax, m = f32(0), f32(0)
        for v in x:
            if amax < abs(f32(v)):
                amax, m = abs(f32(v)), f32(v)
        d = m / f32(-8)
    inv = f32(1) / d if d else f32(0)
    out = []
    for v in x:
        s = f32(v) * inv
        if q == ff.DTYPE_Q8_0:
            out.append(int(np.sign(s) * np.floor(abs(float(s)) + 0.5)))  # C roundf
        else:
            out.append(min(15, int(np.trunc(s + f32(8.5)))))             # (int8_t) cast
    return np.float16(d), out


@pytest.mark.parametrize("q", [ff.DTYPE_Q8_0, ff.DTYPE_Q4_0])
def test_rounding_is_llama_cpps(q: int) -> None:
    """Every element as llama.cpp's reference quantiser gives it (so a GGUF import and Colibri's
    own quantisation of the same weights are the same bytes; tests/test_gguf_import.py checks
    that against llama-quantize's files): 1 / d of the unrounded f32 scale, q8_0 halves away
    from zero. Random blocks, plus blocks with exact halves: max 127 gives d = 1, so 2.5 -> 3
    and -0.5 -> -1 (round-half-even would give 2 and 0); for q4_0, max -8 gives d = 1, and
    x + 8.5 is truncated, so halves go up and 7.5 clips at 15."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((40, 32)) * rng.uniform(1e-3, 10, (40, 1))).astype(np.float32)
    halves = np.zeros(32, np.float32)
    if q == ff.DTYPE_Q8_0:
        halves[:6] = [127, 2.5, -2.5, 0.5, -0.5, 126.5]
        expect = [127, 3, -3, 1, -1, 127]
    else:
        halves[:6] = [-8, 2.5, -2.5, 0.5, -0.5, 7.5]
        expect = [0, 11, 6, 9, 8, 15]  # trunc(x + 8.5): halves go up (-2.5 -> -2 -> 6)
    x = np.vstack([x, halves])
    stored = ff.quantize(x, q)
    nbytes = 2  # one block per row: its scale, then its payload
    for row, data in zip(x, stored):
        d, values = _ggml_reference_block(row, q)
        assert data[:nbytes].view("<f2")[0] == d
        payload = data[nbytes:]
        if q == ff.DTYPE_Q8_0:
            got = payload.view(np.int8).tolist()
        else:
            got = (payload & 0x0F).tolist() + (payload >> 4).tolist()
        assert got == values
    last = stored[-1, nbytes:]
    got = last.view(np.int8)[:6].tolist() if q == ff.DTYPE_Q8_0 else (last & 0x0F)[:6].tolist()
    assert got == expect


@pytest.mark.parametrize("q,bound", [(ff.DTYPE_Q8_0, 0.5 / 127), (ff.DTYPE_Q4_0, 1.0 / 8)])
def test_round_trip_of_a_stack(q: int, bound: float) -> None:
    # An [E, rows, n] stack (as moe_w1 is stored): rows are quantised independently and stored
    # back to back, so each expert's slice and each row dequantise on their own.
    x = np.random.default_rng(1).standard_normal((3, 5, 64)).astype(np.float32)
    x[1, 2] *= 100.0
    x[2, 4, 32:] = 0.0  # an all-zero block: scale 0, values 0
    stored = ff.quantize(x, q)
    assert stored.shape == (3, 5, ff.row_bytes(q, 64)) and stored.dtype == np.uint8
    back = ff.dequantize(stored, q, x.shape)
    assert back.shape == x.shape and back.dtype == np.float32
    amax = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True)
    err = np.abs(back - x).reshape(-1, 32) / np.where(amax == 0, 1, amax)
    assert err.max() <= bound + 2e-3  # + f16 rounding of the scale
    assert np.all(back[2, 4, 32:] == 0)
    for e in range(3):
        assert np.array_equal(ff.dequantize(stored[e], q, (5, 64)), back[e])
        for r in range(5):
            assert np.array_equal(stored[e, r], ff.quantize(x[e, r], q))
            assert np.array_equal(ff.dequantize(stored[e, r], q, (64,)), back[e, r])
    assert np.array_equal(ff.dequantize(stored.reshape(-1), q, x.shape), back)


def test_panel_layout_byte_by_byte() -> None:
    # 8 rows of 2 blocks whose every byte says where it came from: byte j of row r is 16 r + j
    # (mod 256), so each panel position can be checked against the row and byte it must hold.
    rb = ff.row_bytes(ff.DTYPE_Q8_0, 64)  # 4 bytes of scales, 64 int8
    rows = ((16 * np.arange(8)[:, None] + np.arange(rb)[None, :]) % 256).astype(np.uint8)
    panel = ff.to_panels(rows, ff.DTYPE_Q8_0, 64)
    assert panel.shape == (8 * rb,)
    for b in range(2):
        for r in range(8):  # scales: block-major, row-minor
            assert panel[16 * b + 2 * r: 16 * b + 2 * r + 2].tolist() == rows[r, 2 * b: 2 * b + 2].tolist()
        for g in range(8):  # payload: vector (b, g), lane r = row r's group g of block b
            for r in range(8):
                at = 32 + 256 * b + 32 * g + 4 * r
                src = 4 + 32 * b + 4 * g
                assert panel[at: at + 4].tolist() == rows[r, src: src + 4].tolist()


@pytest.mark.parametrize("q", [ff.DTYPE_Q8_0, ff.DTYPE_Q4_0])
def test_panels_hold_the_rows(q: int) -> None:
    # An [E, rows, n] stack in panels: the same bytes rearranged, back to the same rows, and
    # dequantised through the panel dtype to the same values as the rows.
    x = np.random.default_rng(2).standard_normal((3, 16, 96)).astype(np.float32)
    rows = ff.quantize(x, q)
    panels = ff.to_panels(rows, q, 96)
    assert panels.size == rows.size and sorted(panels.tolist()) == sorted(rows.reshape(-1).tolist())
    assert np.array_equal(ff.from_panels(panels, q, 96), rows.reshape(-1, rows.shape[-1]))
    assert np.array_equal(ff.dequantize(panels, ff.PANEL_OF[q], x.shape), ff.dequantize(rows, q, x.shape))
    with pytest.raises(ValueError, match="whole panels"):
        ff.from_panels(panels[: panels.size // 16 * 3], q, 96)


@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_validator_accepts_quantised_files(tmp_path: Path, quant: str) -> None:
    path = make_model(tmp_path, "mixtral", "bf16", quant, "all")
    assert validate_bytes(path.read_bytes(), checksums=True, nan_check=True) == []
    with Model.open(path) as m:
        info = m.tensor_info("layers.0.moe_w1")
        assert info.dtype == ff.QUANT_NAMES[ff.QUANT_BY_NAME[quant]]
        assert info.nbytes == 8 * 96 * (128 // 32) * ff.BLOCK_BYTES[ff.QUANT_BY_NAME[quant]]
        assert m.tensor_f32("layers.0.moe_w1").shape == (8, 96, 128)


def test_validator_rejects_bad_block_tensors(tmp_path: Path) -> None:
    DTYPE, SIZE, SHAPE = 16, 12, 15  # COL_ERR_DTYPE, COL_ERR_SIZE_MISMATCH, COL_ERR_SHAPE
    base = make_model(tmp_path, "mixtral", "f32", d_ff=48)
    image = bytes(base.read_bytes())
    with Model.open(base) as m:
        gate, w1, w2 = (m.tensor_info(f"layers.0.{n}") for n in ("moe_gate", "moe_w1", "moe_w2"))

    def edited(entry: int, dtype: int, nbytes: int) -> set[int]:
        bad = bytearray(image)
        struct.pack_into("<I", bad, entry + 64, dtype)
        struct.pack_into("<Q", bad, entry + 112, nbytes)
        ff.refresh_checksums(bad)
        return {p.code for p in validate_bytes(bytes(bad))}

    # the router must stay f32, even with a consistent block size
    assert DTYPE in edited(gate.table_offset, ff.DTYPE_Q8_0, 8 * 4 * 34)
    # rows of 48 elements are not whole blocks of 32
    assert SHAPE in edited(w2.table_offset, ff.DTYPE_Q4_0, w2.nbytes)
    # one byte short of 8 * 48 * 4 blocks
    assert SIZE in edited(w1.table_offset, ff.DTYPE_Q8_0, 8 * 48 * 4 * 34 - 1)
    # exactly right size: accepted structurally (data is whatever bytes are there)
    assert not {DTYPE, SIZE, SHAPE} & edited(w1.table_offset, ff.DTYPE_Q4_0, 8 * 48 * 4 * 18)


def test_validator_refuses_retired_block_codes(tmp_path: Path) -> None:
    # 3 and 4 were q8_0 / q4_0 with the interleaved (llama.cpp-style) blocks: same sizes, other
    # arrangement, so a file using them must be converted again rather than read.
    DTYPE = 16  # COL_ERR_DTYPE
    path = make_model(tmp_path, "mixtral", "f32")
    image = bytes(path.read_bytes())
    with Model.open(path) as m:
        w1 = m.tensor_info("layers.0.moe_w1")
    for retired, block_bytes in ((3, 34), (4, 18)):  # sizes consistent with the old blocks
        bad = bytearray(image)
        struct.pack_into("<I", bad, w1.table_offset + 64, retired)
        struct.pack_into("<Q", bad, w1.table_offset + 112, 8 * 96 * 4 * block_bytes)
        ff.refresh_checksums(bad)
        found = [p for p in validate_bytes(bytes(bad)) if p.code == DTYPE]
        assert [(p.offset, p.tensor) for p in found] == [(w1.table_offset + 64, w1.name)], found
        assert "convert" in found[0].message.lower(), found[0].message


@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_nan_check_reads_the_row_scales(tmp_path: Path, quant: str) -> None:
    NONFINITE = 19  # COL_ERR_NONFINITE
    path = make_model(tmp_path, "mixtral", "f32", quant)
    image = bytes(path.read_bytes())
    with Model.open(path) as m:
        w1 = m.tensor_info("layers.0.moe_w1")
    rb = ff.row_bytes(ff.QUANT_BY_NAME[quant], 128)  # 4 blocks: scales at bytes 0..7 of a row
    nan = struct.pack("<H", 0x7E00)

    def nonfinite(at: int) -> list[tuple[int, str]]:
        bad = bytearray(image)
        bad[at:at + 2] = nan
        return [(p.offset, p.tensor) for p in validate_bytes(bytes(bad), nan_check=True)
                if p.code == NONFINITE]

    # the scale of block 2 of row 5 of expert 1
    at = w1.offset + (96 + 5) * rb + 2 * 2
    assert nonfinite(at) == [(at, w1.name)]
    # payload bytes are quantised elements, never scales, whatever their bit pattern (byte
    # BLOCK_BYTES of a row held block 1's scale in the retired interleaved layouts)
    assert nonfinite(w1.offset + ff.BLOCK_BYTES[ff.QUANT_BY_NAME[quant]]) == []
    assert nonfinite(w1.offset + rb - 2) == []


def _greedy_agreement(ref: Path, test: Path, n: int = 24) -> tuple[float, float, float]:
    tokens = list(np.random.default_rng(0).integers(0, 256, size=n))
    with Model.open(ref) as a, Model.open(test) as b:
        sa, sb = Session(a, threads=2, max_context=64), Session(b, threads=2, max_context=64)
        la, lb = sa.prefill(tokens), sb.prefill(tokens)
        top1 = float(np.mean(la.argmax(-1) == lb.argmax(-1)))
        ids_a = np.sort(sa.trace.expert_ids, axis=-1)
        ids_b = np.sort(sb.trace.expert_ids, axis=-1)
        routing = float(np.mean(np.all(ids_a == ids_b, axis=-1)))
        pa = np.exp(la - la.max(-1, keepdims=True))
        pa /= pa.sum(-1, keepdims=True)
        pb = np.exp(lb - lb.max(-1, keepdims=True))
        pb /= pb.sum(-1, keepdims=True)
        kl = float(np.mean(np.sum(pa * (np.log(pa) - np.log(pb)), axis=-1)))
    return top1, routing, kl


@pytest.mark.parametrize("quant,min_top1,min_routing,max_kl",
                         [("q8", 0.95, 0.95, 2e-3), ("q4", 0.5, 0.85, 5e-2)])
def test_quantised_files_agree_with_f32(tmp_path: Path, quant: str, min_top1: float,
                                        min_routing: float, max_kl: float) -> None:
    ref = make_model(tmp_path, "mixtral", "f32")
    test = make_model(tmp_path, "mixtral", "f32", quant)
    top1, routing, kl = _greedy_agreement(ref, test)
    assert top1 >= min_top1 and routing >= min_routing and kl <= max_kl, (top1, routing, kl)


def test_converter_quantize_experts_only(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    import hf_reference as hr
    from colibri.convert import convert

    variant = next(v for v in hr.VARIANTS if v.family == "mixtral")
    hf = hr.save(hr.build(variant), tmp_path / "hf")
    cfg_ok = all(n % 32 == 0 for n in (variant.config["hidden_size"],))
    out = tmp_path / "q8.colibri"
    convert(hf, out, "bf16", quantize="q8", layout="rows")  # the recipe; test_layout: panels
    with Model.open(out) as m:
        dtypes = {t.name.rsplit(".", 1)[-1]: t.dtype for t in m.tensors}
        assert dtypes["moe_gate"] == "f32" and dtypes["attn_q"] == "bf16"
        assert dtypes["moe_w1"] == ("q8_0" if cfg_ok else "bf16")
        assert m.metadata["user"]["quantize"] == "q8"


@pytest.mark.parametrize("experts,tied", [(8, True), (4, False)])
def test_converter_llama_cpp_recipe(tmp_path: Path, experts: int, tied: bool) -> None:
    """`quantize_tensors="llama.cpp"` follows llama-quantize's Q4_0 recipe: every matrix q4_0,
    embeddings included, but the router (f32) and the LM head (q8_0, Colibri's nearest to
    llama.cpp's q6_K), which tied embeddings follow; with exactly 8 experts attn_k and attn_v
    are q8_0. (test_gguf_import checks the whole file against llama-quantize's own.)"""
    pytest.importorskip("transformers")
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    import hf_reference as hr
    from colibri.convert import convert

    base = next(v for v in hr.VARIANTS if v.name == "mixtral-base")
    variant = hr.Variant("mixtral-recipe", "mixtral", dict(
        base.config, num_local_experts=experts, tie_word_embeddings=tied))
    hf = hr.save(hr.build(variant), tmp_path / "hf")
    out = tmp_path / "q4.colibri"
    convert(hf, out, "bf16", quantize="q4", quantize_tensors="llama.cpp", layout="rows")
    kv = "q8_0" if experts == 8 else "q4_0"
    expected = {"token_embd": "q8_0" if tied else "q4_0", "output": "q8_0", "moe_gate": "f32",
                "attn_q": "q4_0", "attn_k": kv, "attn_v": kv, "attn_o": "q4_0",
                "moe_w1": "q4_0", "moe_w2": "q4_0", "moe_w3": "q4_0", "attn_norm": "f32",
                "ffn_norm": "f32", "output_norm": "f32"}
    with Model.open(out) as m:
        dtypes = {t.name.rsplit(".", 1)[-1]: t.dtype for t in m.tensors}
        assert dtypes == {k: v for k, v in expected.items() if k != "output" or not tied}
        assert m.metadata["user"]["quantize_tensors"] == "llama.cpp"


def test_requantised_copy_matches_the_converters_blocks(tmp_path: Path) -> None:
    """`convert_weights(..., quantize=)` (tools/quant_accuracy.py --requantize, for models that
    exist only as .colibri files, like the demo) stores exactly the converter's blocks for the
    expert matrices (in panels, the default layout) and f32 elsewhere."""
    from colibri.jitter.weights import convert_weights

    src = make_model(tmp_path, "mixtral", "f32")
    direct = make_model(tmp_path, "mixtral", "f32", "q4")
    out = tmp_path / "requantised.colibri"
    with Model.open(src) as m:
        convert_weights(m, "f32", out, quantize="q4")
    with Model.open(out) as a, Model.open(direct) as b:
        assert validate_bytes(out.read_bytes(), checksums=True, nan_check=True) == []
        for info in a.tensors:
            expected = "q4_0x8" if info.name.rsplit(".", 1)[-1] in ("moe_w1", "moe_w2", "moe_w3") else "f32"
            assert info.dtype == expected, info.name
        w1 = "layers.1.moe_w1"
        assert np.array_equal(a.tensor_f32(w1), b.tensor_f32(w1))
