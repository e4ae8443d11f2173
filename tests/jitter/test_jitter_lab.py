"""The routing-jitter lab: numerics variants in the engine, exact-tie rules, epsilon, the
analysis reports and the `colibri jitter` / `colibri epsilon` commands."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from colibri.cli import main
from colibri.engine import KERNEL_PATHS, Model, Session, best_kernels
from colibri.errors import ColibriValueError
from colibri.jitter import (BASELINE, EpsilonReport, JitterReport, Run, Runner, Variant,
                            analyze_epsilon, analyze_jitter, margins, ordered_int, parse_variants,
                            report_json, selection_order)
from colibri.margins import GroupLimit
from colibri.numerics import Numerics, NumericsError

from jitter_models import (TIE_LAYER, TIED, make_selection_tie_model, make_tie_model,
                           make_wide_model)

PROMPT = [3, 4, 5, 6, 7]
NOISE = "noise1,noise2,noise4"


@pytest.fixture(scope="module")
def tie_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tie_model(tmp_path_factory.mktemp("jitter"))


@pytest.fixture(scope="module")
def tie_tokens(tie_path: Path) -> list[int]:
    with Runner.open(tie_path) as r:
        return r.greedy_sequence(PROMPT, 8)


def _run(path: Path, tokens: list[int], **kw: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    with Model.open(path) as m, Session(m, max_context=len(tokens), **kw) as s:
        logits = s.prefill(tokens)
        t = s.trace
        return logits, np.array(t.expert_ids), np.array(t.router_logits)


# ---- float helpers --------------------------------------------------------------------------


def test_ordered_int_and_margins_count_ulps() -> None:
    one = np.float32(1.0)
    up = np.nextafter(one, np.float32(2.0))
    assert int(ordered_int(np.array([up]))[0] - ordered_int(np.array([one]))[0]) == 1
    assert ordered_int(np.array([-0.0, 0.0], dtype=np.float32)).tolist() == [0, 0]
    tiny = np.nextafter(np.float32(0.0), np.float32(1.0))
    assert int(ordered_int(np.array([tiny]))[0] - ordered_int(np.array([-tiny]))[0]) == 2
    logits = np.array([[[3.0, up, one, -1.0]]], dtype=np.float32)
    abs_m, ulp_m = margins(_topk_run(logits, 2), [GroupLimit()], 2)
    assert ulp_m[0, 0] == 1 and abs_m[0, 0] == float(up) - 1.0
    tie = np.array([[[2.0, 1.0, 1.0, 0.0]]], dtype=np.float32)
    assert margins(_topk_run(tie, 2), [GroupLimit()], 2)[1][0, 0] == 0


def _topk_run(selection: np.ndarray, k: int) -> Run:
    """A run whose decisions are plain top-k of `selection` (the engine's order and tie rule)."""
    ids = selection_order(selection)[..., :k].astype(np.int32)
    P, M, _ = selection.shape
    return Run("crafted", np.zeros((P, 1), np.float32), ids, selection, selection,
               np.zeros((P, M, 0), np.int32))


def test_variant_specs_round_trip() -> None:
    for spec in ("seq", "seq+fma", "pairwise", "blocked8+fma", "seq+split4", "act-bf16",
                 "noise3@9", "w-f16", "w-bf16+blocked16", "k-portable", "w-bf16+k-avx2",
                 "k-avx512+act-bf16", "dot-bf16", "w-bf16+dot-bf16+act-bf16", "kv-f16",
                 "dot-bf16+kv-f16"):
        v = Variant.parse(spec)
        assert Variant.parse(v.name) == v
    assert Variant.parse("split4").numerics.reduction == "sequential"
    assert all(not v.is_baseline for v in parse_variants(None))
    assert parse_variants("noise0,seq")[0].name == "seq"  # the baseline itself is dropped


def test_kernel_path_variants_follow_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default list adds every kernel path below the best one (but avx512f, with AVX-512's
    bits, below AVX-512); a path above it is refused, and the best one itself is the baseline."""
    best = best_kernels()
    below = [v.name for v in parse_variants(None) if v.kernels is not None]
    assert below == [f"k-{p}" for p in KERNEL_PATHS[:KERNEL_PATHS.index(best)]
                     if not (p == "avx512f" and best in ("avx512", "amx"))]
    monkeypatch.setenv("COLIBRI_KERNELS", "portable")  # as on a machine with no SIMD path
    assert best_kernels() == "portable"
    assert not any(v.kernels for v in parse_variants(None))
    with pytest.raises(NumericsError, match="no avx2 kernels"):
        parse_variants("k-avx2")
    assert [v.name for v in parse_variants("k-portable,k-portable+seq")] == ["seq"]


def test_avx512_without_vnni_is_a_variant_only_below_its_own_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """avx512f computes AVX-512's bits, so an AVX-512 baseline lists no k-avx512f (it could
    not differ), and on a CPU whose best is avx512f the lab compares it with the paths below."""
    if best_kernels() not in ("avx512", "amx"):
        pytest.skip("needs a CPU with AVX-512 VNNI")
    names = [v.name for v in parse_variants(None) if v.kernels is not None]
    assert "k-avx512" in names or best_kernels() == "avx512"
    assert "k-avx512f" not in names
    assert [v.name for v in parse_variants("k-avx512f")] == ["k-avx512f"]  # asked for, it runs
    monkeypatch.setenv("COLIBRI_KERNELS", "avx512f")  # as on Skylake-SP
    assert [v.name for v in parse_variants(None) if v.kernels is not None] == ["k-portable", "k-avx2"]


def test_kernel_path_variant_runs_that_path(tiny_model_path: Callable[..., Path]) -> None:
    path = tiny_model_path("mixtral", "bf16")
    with Runner.open(path) as r:
        base = r.run(PROMPT)
        port = r.run(PROMPT, Variant.parse("k-portable"))
        report = analyze_jitter(r, PROMPT, "k-portable")
    assert (base.kernels, port.kernels) == (best_kernels(), "portable")
    assert np.allclose(port.logits, base.logits, rtol=1e-5, atol=1e-5 * np.abs(base.logits).max())
    assert report.kernels == best_kernels() and report.variants == ["k-portable"]
    assert JitterReport.from_dict(json.loads(report_json(report))).kernels == best_kernels()


def test_a_kv_cache_of_halves_takes_half_the_cache_bytes(tiny_model_path: Callable[..., Path]
                                                         ) -> None:
    with Model.open(tiny_model_path()) as m:
        hp = m.hparams
        exact = Session.memory_estimate(m, max_context=64)
        halves = Session.memory_estimate(m, max_context=64, numerics="kv-f16")
    cache = hp.n_layers * 64 * 2 * hp.n_kv_heads * hp.head_dim * 4  # keys and values, f32
    assert abs((exact - halves) - cache // 2) < 2 * 64  # the two buffers' 64-byte alignment


def test_bad_numerics_are_refused(tiny_model_path: Callable[..., Path]) -> None:
    with Model.open(tiny_model_path()) as m:
        with pytest.raises(ColibriValueError):
            Session(m, numerics="blocked0")
        with pytest.raises(ColibriValueError):
            Session(m, numerics={"reduction": "pairwise", "lanes": 4})
        with pytest.raises(ColibriValueError):
            Session(m, numerics="bogus")
        with pytest.raises(ColibriValueError, match="fma and split do not apply"):
            Session(m, numerics="dot-bf16+fma")
        with pytest.raises(ColibriValueError, match="KV cache precision"):
            Session(m, numerics={"kv": "f8"})


# ---- the exact tie --------------------------------------------------------------------------


def test_tie_is_exact_and_plain_topk_takes_the_lower_index(tie_path: Path,
                                                            tie_tokens: list[int]) -> None:
    _, ids, router = _run(tie_path, tie_tokens)
    a, b = TIED
    cells = router[:, TIE_LAYER]
    assert np.array_equal(cells[:, a].view(np.uint32), cells[:, b].view(np.uint32))
    _, ulps = margins(_topk_run(router, 2), [GroupLimit()] * router.shape[1], 2)
    assert (ulps[:, TIE_LAYER] == 0).all()  # the tie sits on the top-k boundary
    chosen = ids[:, TIE_LAYER]
    assert (chosen == a).any(axis=-1).all() and not (chosen == b).any()


@pytest.mark.parametrize("eps", [1e-9, 1e-6])
def test_stable_topk_breaks_the_tie_by_the_documented_order(tie_path: Path,
                                                             tie_tokens: list[int],
                                                             eps: float) -> None:
    """(double)logit[j] + j*eps: the higher index of an exact tie wins for any eps > 0."""
    _, plain, _ = _run(tie_path, tie_tokens)
    _, ids, _ = _run(tie_path, tie_tokens, routing="stable", epsilon=eps)
    a, b = TIED
    chosen = ids[:, TIE_LAYER]
    assert (chosen == b).any(axis=-1).all() and not (chosen == a).any()
    # the other slot is the plain one: eps only resolved the tie
    others = np.sort(np.where(plain[:, TIE_LAYER] == a, b, plain[:, TIE_LAYER]), axis=-1)
    assert np.array_equal(np.sort(chosen, axis=-1), others)


def test_noise_flips_the_tie_and_epsilon_removes_the_flips(tie_path: Path,
                                                           tie_tokens: list[int]) -> None:
    with Runner.open(tie_path) as r:
        jit = analyze_jitter(r, tie_tokens, NOISE, n_prompt=len(PROMPT))
        sweep = analyze_epsilon(r, tie_tokens, [0.0, 1e-9, 1e-5], NOISE)
    tie_rate = jit.cell_flip_rate()[:, TIE_LAYER]
    assert tie_rate.max() > 0 and all(jit.flips(n)[:, TIE_LAYER].any() for n in jit.variants)
    # reduction-order variants keep an exact tie exact: they never flip it
    with Runner.open(tie_path) as r:
        red = analyze_jitter(r, tie_tokens, "seq,pairwise,blocked8+fma,seq+split4")
    assert not any(red.flips(n)[:, TIE_LAYER].any() for n in red.variants)

    rows = {row.eps: row for row in sweep.rows}
    assert rows[0.0].jitter_cells[:, TIE_LAYER].any()
    assert rows[0.0].n_bias == 0                                   # eps 0 == plain top-k
    assert not rows[1e-5].jitter_cells[:, TIE_LAYER].any()         # flip rate drops to zero
    assert rows[1e-5].jitter_left == 0
    assert rows[1e-5].bias_cells[:, TIE_LAYER].all()               # ... at the documented cost
    rec = sweep.recommended()
    assert rec is not None and rec.eps == 1e-5
    changed = sweep.changed_decisions(rec)
    assert {(c["position"], c["layer_index"]) for c in changed} == {
        (int(p), int(m)) for p, m in np.argwhere(rec.bias_cells)}
    assert json.loads(report_json(sweep))["recommended"]["eps"] == 1e-5


# ---- engine numerics ------------------------------------------------------------------------


def test_zero_ulp_noise_reproduces_the_baseline_bit_exactly(tie_path: Path,
                                                            tie_tokens: list[int]) -> None:
    base = _run(tie_path, tie_tokens)
    for numerics in ("noise0@12345", Numerics(router_noise_ulps=0, noise_seed=7)):
        other = _run(tie_path, tie_tokens, numerics=numerics)
        for x, y in zip(base, other):
            assert x.tobytes() == y.tobytes()


def test_noise_moves_first_layer_logits_by_at_most_n_ulps(tie_path: Path,
                                                          tie_tokens: list[int]) -> None:
    _, _, base = _run(tie_path, tie_tokens)
    for n in (1, 4):
        _, _, noisy = _run(tie_path, tie_tokens, numerics=f"noise{n}@3")
        d = ordered_int(noisy[:, 0]) - ordered_int(base[:, 0])  # the first MoE layer's input is untouched
        assert np.abs(d).max() <= n and np.abs(d).max() > 0


def test_default_path_is_bit_identical_for_1_2_4_threads(tmp_path: Path) -> None:
    path = make_wide_model(tmp_path)  # products big enough for the pool to split them
    tokens = list(range(3, 40))
    runs = [_run(path, tokens, threads=t) for t in (1, 2, 4)]
    for other in runs[1:]:
        for x, y in zip(runs[0], other):
            assert x.tobytes() == y.tobytes()


def test_variants_are_real_deterministic_computations(tiny_model_path: Callable[..., Path]) -> None:
    path = tiny_model_path("qwen2_moe", n_layers=3, n_experts=8, top_k=2, dense_layers=(1,))
    tokens = list(range(3, 23))
    base = _run(path, tokens)
    for spec in ("seq", "blocked8+fma", "seq+split4", "act-bf16", "kv-f16"):
        one = _run(path, tokens, numerics=spec)
        four = _run(path, tokens, numerics=spec, threads=4)
        assert one[0].tobytes() == four[0].tobytes()
        assert one[0].tobytes() != base[0].tobytes()  # a different computation, not a relabel
        with Model.open(path) as m, Session(m, numerics=spec, max_context=len(tokens)) as s:
            stepped = np.stack([s.step(t) for t in tokens])
        assert stepped.tobytes() == one[0].tobytes()  # prefill == steps under a variant too
    # bf16 activations: every product output, router logits included, is a bf16 value
    _, _, router = _run(path, tokens, numerics="act-bf16")
    assert not (router.view(np.uint32) & 0xFFFF).any()


@pytest.mark.parametrize("kernels", KERNEL_PATHS)
def test_variants_are_thread_and_batch_invariant_on_every_path(tmp_path: Path, kernels: str) -> None:
    """Each kernel path runs a variant's products in its own loops (the reference loops on the
    portable path, numerics_x86.c's vector loops on AVX2 and AVX-512, which test_numerics.c holds
    to the reference's bits): on every path 1 and 3 threads give the same bits and a prefill
    equals its tokens stepped, for products the pool splits (the wide model). dot-bf16's prefill
    hands the vector paths each token's row packed once for all the experts it chose, its steps
    let the pool pack it."""
    if KERNEL_PATHS.index(kernels) > KERNEL_PATHS.index(best_kernels()):
        pytest.skip(f"this machine runs no {kernels} kernels")
    path = make_wide_model(tmp_path, dtype="bf16")
    tokens = list(range(3, 30))
    for spec in ("seq", "pairwise+fma", "blocked8+fma+split4", "blocked3+split2", "dot-bf16",
                 "kv-f16"):
        one = _run(path, tokens, numerics=spec, kernels=kernels)
        three = _run(path, tokens, numerics=spec, kernels=kernels, threads=3)
        for x, y in zip(one, three):
            assert x.tobytes() == y.tobytes(), spec
        with Model.open(path) as m, Session(m, numerics=spec, kernels=kernels, threads=2,
                                            max_context=len(tokens)) as s:
            stepped = np.stack([s.step(t) for t in tokens])
        assert stepped.tobytes() == one[0].tobytes(), spec


def test_bf16_dot_products_change_bf16_products_only(tmp_path: Path) -> None:
    """dot-bf16 multiplies bf16 weights by bf16 dot products (activations rounded to bf16 for
    them): on a bf16 file the logits move by about that rounding, and stay the same for 1 and 3
    threads and prefilled or stepped; on an f16 file, which has no bf16 weights, it is the default
    computation bit for bit."""
    bf16 = make_wide_model(tmp_path, dtype="bf16")
    tokens = list(range(3, 30))
    base = _run(bf16, tokens)
    one = _run(bf16, tokens, numerics="dot-bf16")
    three = _run(bf16, tokens, numerics="dot-bf16", threads=3)
    assert one[0].tobytes() != base[0].tobytes()
    assert np.abs(one[0] - base[0]).max() < 0.02 * np.abs(base[0]).max()
    for x, y in zip(one, three):
        assert x.tobytes() == y.tobytes()
    with Model.open(bf16) as m, Session(m, numerics="dot-bf16", threads=2, max_context=len(tokens)) as s:
        stepped = np.stack([s.step(t) for t in tokens])
    assert stepped.tobytes() == one[0].tobytes()
    f16 = make_wide_model(tmp_path, dtype="f16")
    assert _run(f16, tokens, numerics="dot-bf16")[0].tobytes() == _run(f16, tokens)[0].tobytes()


def test_weight_precision_variant_rewrites_the_checkpoint(tiny_model_path: Callable[..., Path]
                                                          ) -> None:
    path = tiny_model_path()
    with Runner.open(path) as r:
        m = r.model_for(Variant.parse("w-bf16"))
        dtypes = {t.name: t.dtype for t in m.tensors}
        assert dtypes["layers.0.attn_q"] == "bf16" and dtypes["layers.0.moe_gate"] == "f32"
        assert dtypes["layers.0.attn_norm"] == "f32"
        same = r.run(PROMPT, Variant.parse("w-f32"))  # an f32 file rewritten as f32
        base = r.run(PROMPT)
        assert same.logits.tobytes() == base.logits.tobytes()


# ---- reports and CLI ------------------------------------------------------------------------


def test_analysis_is_deterministic(tie_path: Path, tie_tokens: list[int]) -> None:
    variants = "seq,act-bf16,w-bf16,noise2"
    with Runner.open(tie_path) as r:
        a = report_json(analyze_jitter(r, tie_tokens, variants))
        b = report_json(analyze_jitter(r, tie_tokens, variants))
        e1 = report_json(analyze_epsilon(r, tie_tokens, [0, 1e-6], "noise2"))
    with Runner.open(tie_path, threads=2) as r:
        c = report_json(analyze_jitter(r, tie_tokens, variants))
        e2 = report_json(analyze_epsilon(r, tie_tokens, [0, 1e-6], "noise2"))
    assert a == b
    assert json.loads(a) | {"threads": 0} == json.loads(c) | {"threads": 0}
    assert json.loads(e1) | {"threads": 0} == json.loads(e2) | {"threads": 0}


def test_reports_round_trip_through_json(tie_path: Path, tie_tokens: list[int]) -> None:
    with Runner.open(tie_path) as r:
        jit = analyze_jitter(r, tie_tokens, NOISE)
        eps = analyze_epsilon(r, tie_tokens, [0, 1e-5], NOISE)
    assert report_json(JitterReport.from_dict(json.loads(report_json(jit)))) == report_json(jit)
    assert report_json(EpsilonReport.from_dict(json.loads(report_json(eps)))) == report_json(eps)


def test_cli_json_equals_the_python_report(tie_path: Path, tie_tokens: list[int], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "j.json"
    args = ["--tokens", ",".join(map(str, PROMPT)), "--generate", "8", "--variants", NOISE]
    assert main(["jitter", str(tie_path), *args, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    with Runner.open(tie_path) as r:
        jit = analyze_jitter(r, tie_tokens, NOISE, n_prompt=len(PROMPT))
        eps = analyze_epsilon(r, tie_tokens, [0, 1e-5], NOISE, n_prompt=len(PROMPT))
    assert out.read_bytes() == report_json(jit)
    assert f"overall flip rate {jit.overall_flip_rate():.4f}" in text
    assert main(["epsilon", str(tie_path), *args, "--eps", "1e-5,0", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.read_bytes() == report_json(eps)
    assert "recommended epsilon: 1e-05" in text


def test_cli_json_alone_prints_the_report(tie_path: Path, tie_tokens: list[int],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`--json` without a file: the report on stdout instead of the summary (as `colibri info
    --json`); the same bytes `--json OUT` writes."""
    args = ["--tokens", ",".join(map(str, PROMPT)), "-n", "8", "--variants", NOISE]
    assert main(["jitter", str(tie_path), *args, "--json"]) == 0
    with Runner.open(tie_path) as r:
        jit = analyze_jitter(r, tie_tokens, NOISE, n_prompt=len(PROMPT))
    assert capsys.readouterr().out == report_json(jit).decode() + "\n"


def test_the_engine_refuses_a_variant_before_anything_runs(tie_path: Path) -> None:
    with Runner.open(tie_path) as r:
        with pytest.raises(ColibriValueError, match="lanes in 1..256, got 0"):
            analyze_jitter(r, [3, 4], "seq,blocked0", progress=lambda *a: pytest.fail("ran"))
        with pytest.raises(ColibriValueError, match="epsilon must be finite and >= 0"):
            analyze_epsilon(r, [3, 4], [0.0, -1.0], "seq", progress=lambda *a: pytest.fail("ran"))


def test_cli_refuses_bad_arguments(tie_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jitter", str(tie_path), "--tokens", "3,4", "--variants", "blocked0"]) == 1
    assert main(["epsilon", str(tie_path), "--tokens", "3,4", "--eps", "-1"]) == 1
    assert main(["jitter", str(tie_path), "--tokens", "3,4", "--generate", "999"]) == 1
    assert main(["jitter", str(tie_path) + ".missing", "--tokens", "3"]) == 2
    assert "colibri:" in capsys.readouterr().err


def test_margin_bins_cover_every_cell(tie_path: Path, tie_tokens: list[int]) -> None:
    with Runner.open(tie_path) as r:
        jit = analyze_jitter(r, tie_tokens, NOISE)
    bins = jit.flips_vs_margin()
    assert sum(b["cells"] for b in bins) == jit.margin_ulps.size
    assert sum(b["flips"] for b in bins) == int(jit.flip_counts().sum())
    assert bins[0]["label"] == "0" and bins[0]["cells"] == len(tie_tokens)
    cell = jit.cell(0, TIE_LAYER)
    assert set(cell["runs"]) == {BASELINE, *jit.variants}
    assert not math.isnan(cell["margin_abs"])


def test_a_tie_on_the_selection_score_is_where_flips_happen(tmp_path: Path) -> None:
    """DeepSeek-V3-style routing: two experts whose router logits are far apart tie exactly on
    sigmoid + correction bias. The jitter report measures the tie there (margin 0 ULPs), its
    variants flip that decision, and each run's selection scores are kept and round-trip."""
    tokens = [3, 4, 5, 6, 7, 8, 9, 10]
    path, (a, b) = make_selection_tie_model(tmp_path, tokens, 3)
    with Runner.open(path) as runner:
        report = analyze_jitter(runner, tokens, "seq,blocked8,act-bf16,w-bf16")
        base = runner.run(tokens)
    assert abs(float(base.router_logits[3, 0, a] - base.router_logits[3, 0, b])) > 0.1
    assert base.selection_scores[3, 0, a] == base.selection_scores[3, 0, b]
    assert report.margin_ulps[3, 0] == 0
    assert report.flip_counts()[3, 0] > 0
    np.testing.assert_array_equal(report.selection_scores[BASELINE], base.selection_scores)
    again = JitterReport.from_dict(json.loads(report_json(report)))
    for name in (BASELINE, *report.variants):
        np.testing.assert_array_equal(again.selection_scores[name], report.selection_scores[name])
    assert report.cell(3, 0)["runs"][BASELINE]["selection_scores"][a] == \
        float(base.selection_scores[3, 0, a])
