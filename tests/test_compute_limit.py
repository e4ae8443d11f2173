"""The compute limit of a prefill: the engine's multiply-add probe and the multiply-adds per
prompt token counted from a file's shapes (colibri.compute), as `colibri bench` reports them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from colibri import compute
from colibri.cli import main
from colibri.engine import Model, best_kernels, lib, measure_compute

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
SIMD = best_kernels() != "portable"


@pytest.mark.skipif(not SIMD, reason="needs a SIMD kernel path")
def test_compute_probe_measures_the_arithmetic_a_path_has() -> None:
    assert (measure_compute("f32 FMA", 1) or 0) > 1e8
    assert (measure_compute("int8 dot", 2) or 0) > 1e8
    # AVX2 has no bf16 dot product; the portable path has no probe at all
    assert measure_compute("bf16 dot", 1, "avx2") is None
    assert measure_compute("f32 FMA", 1, "portable") is None


def test_compute_probe_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown arithmetic"):
        measure_compute("f64 FMA")
    assert lib.col_measure_compute(3, 0, 1, 1) == 0.0      # no such arithmetic
    assert lib.col_measure_compute(0, 9, 1, 1) == 0.0      # no such path
    assert lib.col_measure_compute(0, 0, 0, 1) == 0.0      # no threads
    assert lib.col_measure_compute(0, 0, 1, 0) == 0.0      # no repeats


def test_prefill_macs_count_the_products_of_a_token() -> None:
    """The demo model (f16 weights, tied LM head): attention projections, router and the top-k
    experts every token, the LM head for the last position only, and the heads' scores and
    values over the keys each position sees (causal: (P + 1) / 2 on average)."""
    prompt = 16
    with Model.open(DEMO) as m:
        hp = m.hparams
        macs = compute.prefill_macs(m, prompt)
    d, q, kv = hp.d_model, hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * hp.d_ff_expert * hp.n_experts_active
    lm_head = hp.vocab_size * d / prompt
    assert macs["f16"] == pytest.approx(hp.n_layers * per_layer + lm_head)
    assert macs["f32"] == hp.n_layers * hp.n_experts * d  # the router
    heads = hp.n_layers * hp.n_heads * 2 * hp.head_dim * (prompt + 1) / 2
    assert macs[compute.HEADS] == pytest.approx(heads)


def test_arithmetic_follows_dtype_and_numerics() -> None:
    macs = {"bf16": 100.0, "q8_0": 10.0, "f32": 1.0, compute.HEADS: 2.0}
    assert compute.arithmetic_macs(macs, compute.colibri_arithmetic("avx512", False)) == {
        "f32 FMA": 103.0, "int8 dot": 10.0}
    assert compute.arithmetic_macs(macs, compute.colibri_arithmetic("avx512", True)) == {
        "bf16 dot": 100.0, "int8 dot": 10.0, "f32 FMA": 3.0}
    assert compute.arithmetic_macs(macs, compute.llamacpp_arithmetic) == {
        "bf16 dot": 100.0, "int8 dot": 10.0, "f32 FMA": 3.0}
    # exact bf16 on the AMX tiles has no probe
    assert compute.arithmetic_macs(macs, compute.colibri_arithmetic("amx", False)) is None
    # time at the rates: 100 bf16 at 1e3/s and 13 others at 1e2/s
    assert compute.limit_tok_s({"bf16 dot": 100.0, "f32 FMA": 13.0},
                               {"bf16 dot": 1e3, "f32 FMA": 1e2}) == pytest.approx(1 / 0.23)
    assert compute.limit_tok_s({"bf16 dot": 1.0}, {"bf16 dot": None}) is None


@pytest.mark.skipif(not SIMD, reason="needs a SIMD kernel path")
def test_bench_states_prefill_against_the_same_run_compute_probe(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", str(DEMO), "-p", "8", "-n", "2", "-r", "2", "-t", "1", "--probe-mb", "16",
            "--no-trace-check"]
    assert main([*args, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    with Model.open(DEMO) as m:
        expected = compute.arithmetic_macs(compute.prefill_macs(m, 8),
                                           compute.colibri_arithmetic(r["kernels"], False))
    assert r["prefill_macs_per_token"] == pytest.approx(expected)
    assert r["prefill_limit_tok_s"] == pytest.approx(
        compute.limit_tok_s(r["prefill_macs_per_token"], r["compute_probe"]))
    lo, hi = r["prefill_fraction_of_limit_range"]
    assert 0 < lo <= r["prefill_fraction_of_limit"] <= hi
    assert main(args) == 0
    text = capsys.readouterr().out
    assert re.search(r"^compute probe +f32 FMA [0-9.]+ G multiply-adds/s", text, re.M)
    assert re.search(r"^of the limit .*\(prefill; .*repeats [0-9.]+-[0-9.]+%\)$", text, re.M)


def test_bench_says_when_a_path_has_no_compute_probe(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(DEMO), "-p", "4", "-n", "2", "-r", "1", "--probe-mb", "16",
                 "--no-trace-check", "--kernels", "portable"]) == 0
    assert "prefill limit              -  (no compute probe" in capsys.readouterr().out
