"""Quantised weights stored in 8-row panels (dtypes 7 q8_0x8 and 8 q4_0x8): a panel copy of a
row file holds the same blocks, so the engine must compute exactly what it computes from the rows:
the same logits and routing bit for bit, in prefill and decode, on 1 and 2 threads, for experts
only and for every quantised matrix (attention, embeddings and the LM head too), and under a
numerics variant; its values read through the binding are the rows' values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from colibri.engine import Model, Session
from quant_models import make_model

TOKENS = [int(t) for t in np.random.default_rng(7).integers(0, 256, size=12)]


def _files(tmp_path: Path, quant: str, which: str) -> tuple[Path, Path]:
    rows = make_model(tmp_path, "mixtral", "f32", quant, which)
    panels = make_model(tmp_path, "mixtral", "f32", quant, which, layout="panels")
    return rows, panels


def _prefill(path: Path, threads: int, numerics: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    with Model.open(path) as m:
        s = Session(m, threads=threads, max_context=64, numerics=numerics)
        logits = s.prefill(TOKENS)
        return logits, s.trace.expert_ids.copy()


def _stepped(path: Path, threads: int) -> np.ndarray:
    with Model.open(path) as m:
        s = Session(m, threads=threads, max_context=64)
        return np.stack([s.step(t) for t in TOKENS])


@pytest.mark.parametrize("which", ["experts", "all"])
@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_panel_file_stores_panel_dtypes(tmp_path: Path, quant: str, which: str) -> None:
    _, panels = _files(tmp_path, quant, which)
    with Model.open(panels) as m:
        dtypes = {t.name: t.dtype for t in m.tensors}
    assert dtypes["layers.0.moe_w1"] == f"{quant}_0x8"
    assert dtypes["output"] == (f"{quant}_0x8" if which == "all" else "f32")


@pytest.mark.parametrize("which", ["experts", "all"])
@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_panel_values_read_through_the_binding_are_the_rows_values(tmp_path: Path, quant: str,
                                                                   which: str) -> None:
    rows, panels = _files(tmp_path, quant, which)
    with Model.open(rows) as a, Model.open(panels) as b:
        for t in a.tensors:
            assert np.array_equal(a.tensor_f32(t.name), b.tensor_f32(t.name)), t.name


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("which", ["experts", "all"])
@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_panel_prefill_is_bit_identical_to_rows(tmp_path: Path, quant: str, which: str,
                                                threads: int) -> None:
    rows, panels = _files(tmp_path, quant, which)
    (la, ra), (lb, rb) = _prefill(rows, threads), _prefill(panels, threads)
    assert np.array_equal(la, lb)
    assert np.array_equal(ra, rb)


@pytest.mark.parametrize("which", ["experts", "all"])
@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_panel_decode_is_bit_identical_to_rows_and_to_prefill(tmp_path: Path, quant: str,
                                                              which: str) -> None:
    rows, panels = _files(tmp_path, quant, which)
    stepped = _stepped(panels, threads=2)
    assert np.array_equal(stepped, _stepped(rows, threads=2))
    assert np.array_equal(stepped, _prefill(panels, threads=1)[0])


@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_panel_short_prefills_are_bit_identical_to_rows_on_1_to_3_threads(tmp_path: Path, quant: str) -> None:
    """Prompts of 2, 5 and 8 tokens give experts products of 1..8 tokens (on AVX-512 the stored
    panels' one-token tiles a token at a time, from 6 tokens the batch passes): the rows' bits on
    1 and 3 threads."""
    rows, panels = _files(tmp_path, quant, "all")
    with Model.open(rows) as a, Model.open(panels) as b:
        for n in (2, 5, 8):
            for threads in (1, 3):
                want = Session(a, threads=threads, max_context=64).prefill(TOKENS[:n])
                got = Session(b, threads=threads, max_context=64).prefill(TOKENS[:n])
                assert np.array_equal(want, got), (n, threads)


@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_panel_numerics_variant_is_bit_identical_to_rows(tmp_path: Path, quant: str) -> None:
    rows, panels = _files(tmp_path, quant, "all")
    for threads in (1, 2):
        (la, ra), (lb, rb) = (_prefill(rows, threads, "blocked8+fma+split2"),
                              _prefill(panels, threads, "blocked8+fma+split2"))
        assert np.array_equal(la, lb)
        assert np.array_equal(ra, rb)


@pytest.mark.parametrize("layout", ["rows", "panels"])
@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_amx_int8_prefill_is_bit_identical_to_avx512(tmp_path: Path, quant: str, layout: str) -> None:
    """On AMX-INT8 machines, batches of quantised products run on the tile unit: a prefill of 70
    tokens (experts seeing from a few to over 32 tokens, so tiles of full and partial token groups)
    gives the AVX-512 path's logits and routing bit for bit (every other product of this f32-based
    file runs the same AVX-512 code on both paths), on 1 and 3 threads, and equals its tokens
    stepped one at a time; so does the avx512f path (AVX2's int8 kernels, two panels a zmm)."""
    from colibri.engine import best_kernels

    if best_kernels() != "amx":
        pytest.skip("no AMX here")
    path = make_model(tmp_path, "mixtral", "f32", quant, "all", layout=layout)
    tokens = [int(t) for t in np.random.default_rng(11).integers(0, 256, size=70)]
    out = {}
    with Model.open(path) as m:
        for kernels in ("avx512f", "avx512", "amx"):
            for threads in (1, 3):
                s = Session(m, threads=threads, max_context=80, kernels=kernels)
                out[kernels, threads] = (s.prefill(tokens), s.trace.expert_ids.copy())
        s = Session(m, threads=2, max_context=80, kernels="amx")
        stepped = np.stack([s.step(t) for t in tokens])
    ref_logits, ref_routing = out["avx512", 1]
    for key, (logits, routing) in out.items():
        assert np.array_equal(logits, ref_logits), key
        assert np.array_equal(routing, ref_routing), key
    assert np.array_equal(stepped, ref_logits)
