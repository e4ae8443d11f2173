"""The kernel layer's determinism contract: logits and routing traces are bit-identical for any
thread count (1..4) and across repeated runs, for every stored dtype, on the conformance-shaped
tiny models and on a wider model whose products are large enough to be split among threads.
Also: every kernel path (portable, AVX2, AVX-512) agrees with the portable one within float
rounding, and prefill equals stepping on every path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from colibri.engine import Model, Session
from quant_models import make_model

TOKENS = [3, 17, 42, 7, 99, 5, 120, 64, 8, 200, 31, 2]


def _run(path: Path, threads: int, routing: str = "topk") -> tuple[bytes, bytes, bytes, bytes]:
    with Model.open(path) as model:
        s = Session(model, threads=threads, routing=routing, max_context=64)
        logits = s.prefill(TOKENS[:6])
        steps = [s.step(t) for t in TOKENS[6:]]
        tr = s.trace
        return (logits.tobytes() + b"".join(x.tobytes() for x in steps), tr.expert_ids.tobytes(),
                tr.expert_weights.tobytes(), tr.router_logits.tobytes())


@pytest.mark.parametrize("dtype,quant", [("f32", None), ("f16", None), ("bf16", None),
                                         ("bf16", "q8"), ("bf16", "q4")])
@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_bit_identical_for_threads_1_to_4(tmp_path: Path, arch: str, dtype: str,
                                          quant: str | None) -> None:
    path = make_model(tmp_path, arch, dtype, quant, "all" if quant else "experts")
    first = _run(path, 1)
    for threads in (1, 2, 3, 4):
        assert _run(path, threads) == first, f"threads={threads}"


def test_bit_identical_soft_routing(tmp_path: Path) -> None:
    path = make_model(tmp_path, "mixtral", "bf16", "q4")
    first = _run(path, 1, "soft")
    for threads in (2, 3, 4):
        assert _run(path, threads, "soft") == first


def test_conformance_shaped_models_thread_invariant(tiny_model_path) -> None:  # type: ignore[no-untyped-def]
    for arch in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):
        path = tiny_model_path(arch, "f32")
        tokens = [1, 3, 4, 5, 6, 7]
        results = []
        for threads in (1, 2, 3, 4):
            with Model.open(path) as model:
                s = Session(model, threads=threads)
                results.append((s.prefill(tokens).tobytes(), s.trace.expert_ids.tobytes()))
        assert all(r == results[0] for r in results), arch


_PATHS_SCRIPT = """
import sys, numpy as np
from colibri.engine import Model, Session
with Model.open(sys.argv[1]) as m:
    s = Session(m, threads=2, max_context=64)
    a = s.prefill({tokens})
    s2 = Session(m, threads=3, max_context=64)
    b = np.stack([s2.step(t) for t in {tokens}])
    assert a.tobytes() == b.tobytes(), "prefill != steps"
    sys.stdout.write(s.kernels + "\\n")
    np.save(sys.argv[2], a)
"""


def test_bf16_activations_on_bf16_weights(tmp_path: Path) -> None:
    """The act-bf16 variant on bf16 weights, where AMX packs one part per activation (16 tokens a
    tile): no bit depends on the thread count, prefill equals stepping, and the best path agrees
    with AVX-512's to rounding. 70 tokens over 4 experts give products of more and of fewer than
    16 tokens."""
    from colibri.engine import best_kernels

    path = make_model(tmp_path, "mixtral", "bf16", n_experts=4)
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, 256, 70)]
    paths = sorted({best_kernels(), "avx512"} if best_kernels() in ("avx512", "amx") else {best_kernels()})
    logits = {}
    with Model.open(path) as model:
        for kernels in paths:
            runs = []
            for threads in (1, 3):
                s = Session(model, threads=threads, max_context=80, numerics="act-bf16", kernels=kernels)
                runs.append(s.prefill(tokens))
            assert runs[0].tobytes() == runs[1].tobytes(), kernels
            s = Session(model, threads=2, max_context=80, numerics="act-bf16", kernels=kernels)
            stepped = np.stack([s.step(t) for t in tokens])
            assert stepped.tobytes() == runs[0].tobytes(), kernels
            logits[kernels] = runs[0]
    ref = logits[paths[0]]
    for name, other in logits.items():
        assert np.allclose(other, ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max()), name  # 0.4 % seen


@pytest.mark.parametrize("quant", [None, "q8", "q4"])
def test_kernel_paths_agree(tmp_path: Path, quant: str | None) -> None:
    """Each path (forced with COLIBRI_KERNELS) is self-consistent, and all agree to rounding."""
    path = make_model(tmp_path, "mixtral", "bf16", quant)
    out = {}
    for isa in ("portable", "avx2", "avx512f", "avx512", "amx"):
        npy = tmp_path / f"{isa}.npy"
        env = dict(os.environ, COLIBRI_KERNELS=isa)
        done = subprocess.run([sys.executable, "-c", _PATHS_SCRIPT.format(tokens=TOKENS), str(path),
                               str(npy)], env=env, capture_output=True, text=True, check=True)
        out[done.stdout.strip()] = np.load(npy)
    ref = out["portable"]
    for name, logits in out.items():
        assert np.allclose(logits, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max()), name


@pytest.mark.parametrize("quant", [None, "q8", "q4"])
def test_avx512_without_vnni_computes_avx512s_bits(tmp_path: Path, quant: str | None) -> None:
    """The path of AVX-512 CPUs without VNNI (Skylake-SP/X: AVX-512's float kernels, AVX2's int8
    ones) gives the AVX-512 path's logits bit for bit, in prefill and in steps."""
    from colibri.engine import best_kernels

    if best_kernels() not in ("avx512", "amx"):
        pytest.skip("needs a CPU with AVX-512 VNNI to compare the two paths")
    path = make_model(tmp_path, "mixtral", "bf16", quant)
    tokens = [int(t) for t in np.random.default_rng(5).integers(0, 256, 40)]
    logits = {}
    with Model.open(path) as model:
        for kernels in ("avx512f", "avx512"):
            with Session(model, threads=2, max_context=48, kernels=kernels) as s:
                assert s.kernels == kernels
                prefill = s.prefill(tokens[:-4])
                logits[kernels] = np.concatenate([prefill, np.stack([s.step(t) for t in tokens[-4:]])])
    assert logits["avx512f"].tobytes() == logits["avx512"].tobytes()
