"""The `colibri` command line: exit codes, output formats and dumped arrays."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from colibri import fileformat as ff
from colibri.cli import main

from tiny_models import TinyModel

BuildModel = Callable[..., TinyModel]
BuildPath = Callable[..., Path]
BuildImage = Callable[..., bytearray]
WriteImage = Callable[..., Path]
Capture = pytest.CaptureFixture[str]


def run_cli(capsys: Capture, *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def generated_tokens(out: str) -> list[int]:
    line = next(l for l in out.splitlines() if l.startswith("tokens: "))
    ids = line.removeprefix("tokens: ").strip()
    return [int(t) for t in ids.split(",")] if ids else []


# ---------------------------------------------------------------------------------------------
# validate


def test_validate_clean_exits_0(capsys: Capture, tiny_model_path: BuildPath) -> None:
    code, out, _ = run_cli(capsys, "validate", tiny_model_path(), "--checksums", "--nan-check")
    assert code == 0 and "valid" in out


def test_validate_missing_file_exits_2(capsys: Capture, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "validate", tmp_path / "missing.colibri")
    assert code == 2 and "missing.colibri" in err


def test_validate_directory_exits_2(capsys: Capture, tmp_path: Path) -> None:
    assert run_cli(capsys, "validate", tmp_path)[0] == 2


def test_validate_random_bytes_exits_1(capsys: Capture, write_image: WriteImage) -> None:
    data = np.random.default_rng(2).integers(0, 256, 1000, dtype=np.uint8).tobytes()
    assert run_cli(capsys, "validate", write_image(data))[0] == 1


def test_validate_empty_file_exits_1(capsys: Capture, write_image: WriteImage) -> None:
    assert run_cli(capsys, "validate", write_image(b""))[0] == 1


def test_validate_lists_problem_with_hex_offset(capsys: Capture, tiny_image: BuildImage,
                                                write_image: WriteImage) -> None:
    image = tiny_image()
    image[0:4] = b"XOLI"
    ff.refresh_checksums(image)
    code, out, _ = run_cli(capsys, "validate", write_image(image))
    assert code == 1 and "COL_ERR_BAD_MAGIC at 0x0" in out


def test_validate_json_lists_problems(capsys: Capture, tiny_image: BuildImage,
                                      write_image: WriteImage) -> None:
    image = tiny_image()
    image[0:4] = b"XOLI"
    ff.refresh_checksums(image)
    code, out, _ = run_cli(capsys, "validate", write_image(image), "--json")
    doc = json.loads(out)
    assert (code, doc["valid"], doc["problems"][0]["code_name"]) == (1, False,
                                                                    "COL_ERR_BAD_MAGIC")


def test_validate_json_clean(capsys: Capture, tiny_model_path: BuildPath) -> None:
    _, out, _ = run_cli(capsys, "validate", tiny_model_path(), "--json")
    assert json.loads(out) == {"valid": True, "format": "colibri", "problems": []}


def test_validate_garbage_has_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "garbage.colibri"
    path.write_bytes(b"COLI" + bytes(range(256)) * 3)
    proc = subprocess.run([sys.executable, "-m", "colibri.cli", "validate", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------------------------
# info and dump


def test_info_lists_tensors(capsys: Capture, tiny_model: BuildModel) -> None:
    tm = tiny_model()
    code, out, _ = run_cli(capsys, "info", tm.path)
    assert code == 0 and all(name in out for name in tm.names)


def test_info_json(capsys: Capture, tiny_model: BuildModel) -> None:
    tm = tiny_model()
    _, out, _ = run_cli(capsys, "info", tm.path, "--json")
    doc = json.loads(out)
    assert ([t["name"] for t in doc["tensors"]], doc["hparams"]["d_model"], doc["arch"]) == (
        tm.names, 32, "mixtral")


def test_info_missing_file_exits_2(capsys: Capture, tmp_path: Path) -> None:
    assert run_cli(capsys, "info", tmp_path / "missing.colibri")[0] == 2


def test_info_invalid_file_exits_1(capsys: Capture, write_image: WriteImage) -> None:
    code, _, err = run_cli(capsys, "info", write_image(b"not a colibri file" * 20))
    assert code == 1 and "COL_ERR_" in err


def test_dump_prints_shape_and_rows(capsys: Capture, tiny_model_path: BuildPath) -> None:
    code, out, _ = run_cli(capsys, "dump", tiny_model_path(), "--tensor", "layers.0.moe_w1",
                           "--rows", "2")
    assert code == 0 and "shape [4, 16, 32]" in out and "first 2 row(s)" in out


def test_dump_unknown_tensor_exits_1(capsys: Capture, tiny_model_path: BuildPath) -> None:
    assert run_cli(capsys, "dump", tiny_model_path(), "--tensor", "nope")[0] == 1


# ---------------------------------------------------------------------------------------------
# run


def test_run_generates_n_tokens(capsys: Capture, tiny_model_path: BuildPath) -> None:
    code, out, _ = run_cli(capsys, "run", tiny_model_path(), "--tokens", "1,3,4", "-n", "5")
    assert code == 0 and len(generated_tokens(out)) == 5


def test_run_is_deterministic(capsys: Capture, tiny_model_path: BuildPath) -> None:
    args = ("run", tiny_model_path("olmoe"), "--tokens", "1,3,4", "-n", "6")
    assert generated_tokens(run_cli(capsys, *args)[1]) == generated_tokens(run_cli(capsys, *args)[1])


def test_run_prompt_prints_text(capsys: Capture, tiny_model_path: BuildPath) -> None:
    code, out, _ = run_cli(capsys, "run", tiny_model_path(), "--prompt", "the cat", "-n", "3")
    assert code == 0 and "prompt tokens: 3,4" in out and "text: " in out


def test_run_prompt_without_tokenizer_exits_1(capsys: Capture,
                                              tiny_model_path: BuildPath) -> None:
    path = tiny_model_path(with_tokenizer=False)
    assert run_cli(capsys, "run", path, "--prompt", "the cat")[0] == 1


def test_run_tokens_ignore_broken_tokenizer(capsys: Capture, tiny_model_path: BuildPath) -> None:
    path = tiny_model_path(tokenizer_bytes=b"{not json")
    code, out, _ = run_cli(capsys, "run", path, "--tokens", "1,2", "-n", "2")
    assert code == 0 and len(generated_tokens(out)) == 2


def test_run_bad_token_exits_1(capsys: Capture, tiny_model_path: BuildPath) -> None:
    code, _, err = run_cli(capsys, "run", tiny_model_path(), "--tokens", "1,999")
    assert code == 1 and "COL_ERR_BAD_TOKEN" in err


def test_run_dump_logits_shape(capsys: Capture, tiny_model_path: BuildPath,
                               tmp_path: Path) -> None:
    out = tmp_path / "logits.npy"
    run_cli(capsys, "run", tiny_model_path(), "--tokens", "1,3,4", "-n", "5",
            "--dump-logits", out)
    logits = np.load(out)
    assert (logits.shape, logits.dtype) == ((3 + 5 - 1, 50), np.float32)


def test_run_dump_logits_match_greedy_tokens(capsys: Capture, tiny_model_path: BuildPath,
                                             tmp_path: Path) -> None:
    out = tmp_path / "logits.npy"
    _, text, _ = run_cli(capsys, "run", tiny_model_path(), "--tokens", "1,3,4", "-n", "4",
                         "--dump-logits", out)
    assert np.argmax(np.load(out)[2:], axis=1).tolist() == generated_tokens(text)


def test_run_dump_trace_shapes(capsys: Capture, tiny_model_path: BuildPath,
                               tmp_path: Path) -> None:
    out = tmp_path / "trace.npz"
    run_cli(capsys, "run", tiny_model_path(), "--tokens", "1,3,4", "-n", "5", "--dump-trace", out)
    with np.load(out) as trace:
        shapes = {k: (trace[k].shape, trace[k].dtype) for k in
                  ("expert_ids", "expert_weights", "router_logits", "selection_scores",
                   "moe_layers")}
        # Mixtral's softmax without a correction bias ranks the logits themselves; no groups
        assert np.array_equal(trace["selection_scores"], trace["router_logits"])
        assert "chosen_groups" not in trace.files
    assert shapes == {"expert_ids": ((7, 2, 2), np.int32),
                      "expert_weights": ((7, 2, 2), np.float32),
                      "router_logits": ((7, 2, 4), np.float32),
                      "selection_scores": ((7, 2, 4), np.float32),
                      "moe_layers": ((2,), np.int32)}


def test_run_names_its_numerics_in_the_output_and_the_trace(capsys: Capture, tiny_model_path: BuildPath,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "trace.npz"
    _, text, _ = run_cli(capsys, "run", tiny_model_path(), "--tokens", "1,3,4", "-n", "2", "--numerics", "dot-bf16",
                         "--dump-trace", out)
    assert "numerics: dot-bf16" in text.splitlines()
    with np.load(out) as trace:
        assert str(trace["numerics"]) == "dot-bf16"
    _, text, _ = run_cli(capsys, "run", tiny_model_path(), "--tokens", "1,3,4", "-n", "2", "--dump-trace", out)
    assert "numerics" not in text
    with np.load(out) as trace:
        assert "numerics" not in trace.files


def test_run_debug_routing_one_line_per_position_and_layer(capsys: Capture,
                                                          tiny_model_path: BuildPath) -> None:
    _, out, _ = run_cli(capsys, "run", tiny_model_path(), "--tokens", "1,3,4", "-n", "3",
                        "--debug-routing")
    lines = [l for l in out.splitlines() if l.startswith("pos ")]
    assert len(lines) == (3 + 3 - 1) * 2 and "experts [" in lines[0] and "weights [" in lines[0]


@pytest.mark.parametrize("routing", ["topk", "stable", "soft", "gumbel"])
def test_run_routing_modes(capsys: Capture, tiny_model_path: BuildPath, routing: str) -> None:
    code, out, _ = run_cli(capsys, "run", tiny_model_path(), "--tokens", "1,3", "-n", "2",
                           "--routing", routing)
    assert code == 0 and len(generated_tokens(out)) == 2


def test_run_stops_at_eos(capsys: Capture, tiny_model_path: BuildPath) -> None:
    _, out, _ = run_cli(capsys, "run", tiny_model_path(), "--tokens", "1,3,4", "-n", "6")
    first = generated_tokens(out)[0]
    _, out, _ = run_cli(capsys, "run", tiny_model_path(eos_token_id=first), "--tokens", "1,3,4",
                        "-n", "6")
    assert generated_tokens(out) == [first]


# ---------------------------------------------------------------------------------------------
# arguments shared by the commands


@pytest.mark.parametrize("command", ["run", "serve", "trace", "jitter", "epsilon", "bench"])
def test_generate_and_threads_are_spelled_alike_everywhere(command: str) -> None:
    from colibri.cli import build_parser

    extra = {"run": ["--tokens", "1"], "trace": ["--tokens", "1", "--out", "x.json"],
             "jitter": ["--tokens", "1"], "epsilon": ["--tokens", "1"]}.get(command, [])
    parser = build_parser()
    short = parser.parse_args([command, "f.colibri", *extra, "-n", "5", "-t", "3"])
    long = parser.parse_args([command, "f.colibri", *extra, "--generate", "5", "--threads", "3"])
    assert (short.generate, short.threads) == (long.generate, long.threads) == (5, 3)


@pytest.mark.parametrize("command", ["run", "trace", "jitter", "epsilon"])
def test_token_ids_are_parsed_alike_everywhere(command: str, capsys: Capture) -> None:
    from colibri.cli import build_parser

    extra = ["--out", "x.json"] if command == "trace" else []
    args = build_parser().parse_args([command, "f.colibri", "--tokens", " 3, 4,,5 ", *extra])
    assert args.tokens == [3, 4, 5]
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "f.colibri", "--tokens", "3,four", *extra])
    assert exit_info.value.code == 2
    assert "expected comma-separated token ids, got '3,four'" in capsys.readouterr().err


def test_run_generate_is_the_old_n(capsys: Capture, tiny_model_path: BuildPath) -> None:
    args = ("run", tiny_model_path(), "--tokens", "1,3,4")
    assert generated_tokens(run_cli(capsys, *args, "-n", "4")[1]) == generated_tokens(
        run_cli(capsys, *args, "--generate", "4")[1])


def test_run_beyond_the_models_context_is_refused_in_the_engines_words(
        capsys: Capture, tiny_model_path: BuildPath) -> None:
    code, out, err = run_cli(capsys, "run", tiny_model_path(), "--tokens", "1,3,4", "-n", "100")
    assert code == 1 and out == ""
    assert err.startswith("colibri: ") and "max_context 102 exceeds the model's 64" in err


def test_errors_are_one_line_on_stderr(capsys: Capture, tiny_model_path: BuildPath,
                                       tmp_path: Path) -> None:
    for argv, code in ((["info", tmp_path / "missing.colibri"], 2),
                       (["dump", tiny_model_path(), "--tensor", "nope"], 1),
                       (["run", tiny_model_path(with_tokenizer=False), "--prompt", "x"], 1)):
        got, out, err = run_cli(capsys, *argv)
        assert got == code and out == "" and err.count("\n") == 1 and err.startswith("colibri: ")


# ---------------------------------------------------------------------------------------------
# convert (the converter module is stubbed: these tests are about the CLI's contract)


class FakeConversionError(Exception):
    pass


def fake_converter(fail: bool, warnings: tuple[str, ...] = ()) -> types.ModuleType:
    module = types.ModuleType("colibri.convert")
    calls: list[tuple[str, str, str, str]] = []

    def convert(hf_dir: str, out_path: str, dtype: str = "f32", progress: object = None,
                layout: str = "panels") -> list[str]:
        calls.append((str(hf_dir), str(out_path), dtype, layout))
        if fail:
            raise FakeConversionError("config.json: unsupported model_type 'llama'")
        return list(warnings)

    module.convert = convert  # type: ignore[attr-defined]
    module.ConversionError = FakeConversionError  # type: ignore[attr-defined]
    module.calls = calls  # type: ignore[attr-defined]
    return module


def install(monkeypatch: pytest.MonkeyPatch, module: types.ModuleType) -> None:
    import colibri

    monkeypatch.setitem(sys.modules, "colibri.convert", module)
    monkeypatch.setattr(colibri, "convert", module, raising=False)


def test_convert_passes_arguments(capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_converter(fail=False)
    install(monkeypatch, module)
    code, _, _ = run_cli(capsys, "convert", "hf", "out.colibri", "--dtype", "bf16")
    code2, _, _ = run_cli(capsys, "convert", "hf", "out.colibri", "--layout", "rows")
    assert (code, code2) == (0, 0)
    assert module.calls == [("hf", "out.colibri", "bf16", "panels"),  # type: ignore[attr-defined]
                            ("hf", "out.colibri", "f32", "rows")]


def test_convert_prints_the_converters_warnings(capsys: Capture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, fake_converter(fail=False, warnings=("hf has no tokenizer.json",)))
    code, out, err = run_cli(capsys, "convert", "hf", "out.colibri")
    assert code == 0 and "wrote out.colibri" in out
    assert "colibri: warning: hf has no tokenizer.json" in err


def test_convert_error_exits_1(capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, fake_converter(fail=True))
    code, _, err = run_cli(capsys, "convert", "hf", "out.colibri")
    assert code == 1 and "unsupported model_type" in err


def test_convert_then_run_matches_transformers(capsys: Capture, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import hf_reference

    variant = hf_reference.VARIANTS[0]
    model = hf_reference.build(variant)
    hf_dir = hf_reference.save(model, tmp_path / "hf")
    out = tmp_path / "model.colibri"
    assert run_cli(capsys, "convert", hf_dir, out)[0] == 0
    _, text, _ = run_cli(capsys, "run", out, "--tokens", "5,17,3,99", "-n", "6")
    assert generated_tokens(text) == hf_reference.run(model, [5, 17, 3, 99], 6).generated


def test_convert_missing_config_exits_1(capsys: Capture, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "convert", tmp_path, tmp_path / "out.colibri")
    assert code == 1 and "conversion failed" in err


def test_bench_json_states_decode_against_the_same_run_probe(capsys: Capture) -> None:
    """`colibri bench` on the demo model: the bytes per token come from the tensor table (one
    embedding row, the whole table again when it is also the LM head, k/E of every expert
    tensor, all of everything else), and the limit and the
    fraction are the probe's bandwidth over those bytes."""
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    assert main(["bench", str(demo), "-p", "8", "-n", "4", "-r", "2", "-t", "2",
                 "--probe-mb", "64", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    from colibri.engine import Model
    with Model.open(demo) as m:
        hp = m.hparams
        expected = sum(t.nbytes // hp.vocab_size if t.name == "token_embd"
                       else t.nbytes * hp.n_experts_active // hp.n_experts
                       if t.name.rsplit(".", 1)[-1] in ("moe_w1", "moe_w2", "moe_w3") else t.nbytes
                       for t in m.tensors)
        tied = next(t.nbytes for t in m.tensors if t.name == "token_embd") if hp.flags & 2 else 0
    per_token = expected + tied
    assert r["weight_bytes_per_token"] == per_token
    # decoded positions 8..11 read the keys and values of 9..12 positions in every layer
    kv_per_position = 2 * hp.n_layers * hp.n_kv_heads * hp.head_dim * 4
    assert r["kv_bytes_per_token"] == kv_per_position * (9 + 10 + 11 + 12) // 4
    assert r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 and r["trace_on_decode_tok_s"] > 0
    assert r["limit_tok_s"] == pytest.approx(r["probe_gb_s"] * 1e9 / per_token)
    assert r["effective_gb_s"] == pytest.approx(per_token * r["decode_tok_s"] / 1e9)
    assert 0 < r["fraction_of_limit"]
    # the memory's latency read in the same run, before the runs and after them
    assert len(r["latency_ns"]) == 2 and all(ns > 0 for ns in r["latency_ns"])
    # the traced run's phases: every weight byte of a token is counted in exactly one part, the
    # KV cache in attention's
    assert set(r["phases"]) == {"attention", "feed-forward", "outside layers"}
    assert sum(p["mb"] for p in r["phases"].values()) * 1e6 == pytest.approx(
        per_token + r["kv_bytes_per_token"])
    assert all(p["ms"] > 0 and p["gb_s"] > 0 for p in r["phases"].values())


def test_bench_of_a_kv_cache_of_halves_counts_half_the_cache(capsys: Capture) -> None:
    """`--numerics kv-f16`: the KV bytes a step reads and the session's memory are the exact
    run's less half its cache; the variant is timed against the exact default."""
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    runs = {}
    for spec in ("default", "kv-f16"):
        assert main(["bench", str(demo), "-p", "8", "-n", "4", "-r", "1", "-t", "1",
                     "--probe-mb", "64", "--numerics", spec, "--json"]) == 0
        runs[spec] = json.loads(capsys.readouterr().out)
    exact, halves = runs["default"], runs["kv-f16"]
    assert halves["numerics"] == "kv-f16"
    assert halves["kv_bytes_per_token"] * 2 == exact["kv_bytes_per_token"]
    from colibri.engine import Model
    with Model.open(demo) as m:
        hp = m.hparams
    cache = 2 * hp.n_layers * hp.n_kv_heads * hp.head_dim * 4 * (8 + 4 + 8)  # the bench's context
    assert abs(exact["session_bytes"] - halves["session_bytes"] - cache // 2) < 2 * 64
    assert halves["default_decode_tok_s"] > 0


def test_bench_states_the_spread_of_its_repeats(capsys: Capture) -> None:
    """Each median of `colibri bench` comes with its slowest and fastest repeat (the fraction of
    the limit with its lowest and highest), in the JSON and in the text, so a reader of one run
    on a shared machine sees how far the repeats moved."""
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    args = ["bench", str(demo), "-p", "8", "-n", "4", "-r", "3", "-t", "2", "--probe-mb", "16", "--no-trace-check"]
    assert main([*args, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    for key in ("prefill_tok_s", "decode_tok_s", "fraction_of_limit"):
        lo, hi = r[key + "_range"]
        assert 0 < lo <= r[key] <= hi, key
    assert main(args) == 0
    text = capsys.readouterr().out
    assert re.search(r"^prefill .*; repeats [0-9.]+-[0-9.]+\)$", text, re.M)
    assert re.search(r"^decode .*; repeats [0-9.]+-[0-9.]+\)$", text, re.M)
    assert re.search(r"^of the limit .*; repeats [0-9.]+-[0-9.]+%\)$", text, re.M)


def test_bench_paired_ratio_takes_each_repeats_pair() -> None:
    """A cost is the median of each repeat's ratio (the two sides ran in turns within it), with the
    lowest and highest repeat."""
    from colibri.bench import paired_ratio

    median, (lo, hi) = paired_ratio([2.0, 3.3, 1.05], [2.0, 3.0, 1.0])
    assert median == pytest.approx(1.05) and (lo, hi) == (pytest.approx(1.0), pytest.approx(1.1))


def test_bench_states_the_cost_of_tracing_with_its_spread(capsys: Capture) -> None:
    """The traced decode's cost comes from the repeats that ran it in turns with the untraced one,
    with the lowest and highest repeat, in the JSON and in the text."""
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    args = ["bench", str(demo), "-p", "8", "-n", "4", "-r", "3", "-t", "1", "--probe-mb", "16"]
    assert main([*args, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    lo, hi = r["trace_cost_range"]
    assert lo <= r["trace_cost"] <= hi
    assert main(args) == 0
    text = capsys.readouterr().out
    assert re.search(r"^decode, trace on .*pairs run in turns; repeats [-+][0-9.]+ to [-+][0-9.]+%\)$", text, re.M)


def test_bench_states_how_the_decode_split_over_the_threads(capsys: Capture) -> None:
    """On two threads `colibri bench` gives each thread's share of the decode's multiply-adds (the
    engine's own counts), the workers' share in the repeats and the batches a token hands to every
    thread, so a run whose worker the machine starved says so; on one thread it gives none."""
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    args = ["bench", str(demo), "-p", "8", "-n", "4", "-r", "2", "--probe-mb", "16", "--no-trace-check"]
    assert main([*args, "-t", "2", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    caller, worker = r["decode_thread_shares"]
    assert caller + worker == pytest.approx(1.0)
    lo, hi = r["decode_worker_share_range"]
    assert 0 <= lo <= worker <= hi <= 1  # a worker the machine does not run leaves its share at 0
    assert r["decode_batches_per_token"] > 0 and 0 <= r["decode_batches_entered"] <= 1
    assert main([*args, "-t", "2"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^threads' work +[0-9.]+ / [0-9.]+ %  \(of the decode's multiply-adds", text, re.M)
    assert re.search(r"^shared batches +[0-9.]+ a token  \(handed to every thread; the workers entered "
                     r"[0-9.]+ %\)$", text, re.M)
    assert main([*args, "-t", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decode_thread_shares"] is None


def test_bench_runs_the_kernel_path_asked_for(capsys: Capture) -> None:
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    assert main(["bench", str(demo), "-p", "4", "-n", "2", "-r", "1", "--probe-mb", "16",
                 "--no-trace-check", "--kernels", "portable", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kernels"] == "portable"


def test_bench_missing_file_exits_2(capsys: Capture, tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "bench", tmp_path / "missing.colibri", "-p", "4", "-n", "2",
                           "-r", "1", "--probe-mb", "16")
    assert code == 2 and "missing.colibri" in err


def test_bench_refuses_an_unknown_numerics_spec(capsys: Capture) -> None:
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", str(demo), "--numerics", "act-bf17"])
    assert exit_info.value.code == 2
    assert "unknown numerics component 'act-bf17'" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["-n", "-p", "-r"])
def test_bench_refuses_a_count_of_zero_by_its_option(capsys: Capture, option: str) -> None:
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", str(demo), option, "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert option in err and "0 is less than 1" in err and "Traceback" not in err


def test_bench_runs_a_numerics_variant(capsys: Capture) -> None:
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    assert main(["bench", str(demo), "-p", "4", "-n", "2", "-r", "1", "--probe-mb", "16",
                 "--no-trace-check", "--numerics", "act-bf16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["numerics"] == "act-bf16"
    assert main(["bench", str(demo), "-p", "4", "-n", "2", "-r", "1", "--probe-mb", "16",
                 "--no-trace-check"]) == 0
    text = capsys.readouterr().out
    assert "numerics" not in text  # the exact computation needs no mention
    assert "default" not in text   # nor a cost against itself


def test_bench_times_a_variant_against_the_default_in_turns(capsys: Capture) -> None:
    """A variant's report gives the default computation's speed from the same repeats and the
    variant's time as a multiple of it, per repeat (median, lowest, highest)."""
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    args = ["bench", str(demo), "-p", "8", "-n", "4", "-r", "3", "--probe-mb", "16", "--no-trace-check",
            "--numerics", "seq"]
    assert main([*args, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["default_decode_tok_s"] > 0 and r["default_prefill_tok_s"] > 0
    for key in ("decode_cost", "prefill_cost"):
        lo, hi = r[key + "_range"]
        assert 0 < lo <= r[key] <= hi, key
    assert main(args) == 0
    text = capsys.readouterr().out
    assert re.search(r"^decode, default .* tok/s .*the variant takes [0-9.]+x its time; "
                     r"repeats [0-9.]+-[0-9.]+x\)$", text, re.M)
    assert re.search(r"^prefill, default .* tok/s .*the variant takes [0-9.]+x its time", text, re.M)


def _tool(name: str) -> Any:
    """tools/NAME.py as a module (registered while it loads: its dataclasses look their module
    up by name)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def test_bench_kernels_tool_compares_two_paths_in_one_process(capsys: Capture) -> None:
    """tools/bench_kernels.py: one session per path, alternating repeats, paired ratios."""
    from colibri.engine import best_kernels

    module = _tool("bench_kernels")
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    assert module.main([str(demo), "--a", "portable", "--b", best_kernels(), "-p", "4", "-n", "2",
                        "-t", "1", "-r", "2"]) == 0
    out = capsys.readouterr().out
    assert f"decode {best_kernels()}/portable: median" in out and "  portable  prefill" in out


def test_bench_compare_tool_runs_both_engines_on_one_model(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """tools/bench_compare.py: transformers and Colibri take turns on the same tiny Mixtral; the
    per-turn ratios are printed for prefill and decode."""
    pytest.importorskip("torch")
    hf_reference = pytest.importorskip("hf_reference")
    from colibri.convert import convert

    hf_dir = hf_reference.save(hf_reference.build(hf_reference.VARIANTS[0]), tmp_path / "hf")
    out = tmp_path / "tiny.colibri"
    convert(hf_dir, out, dtype="bf16")
    module = _tool("bench_compare")
    assert module.main([str(hf_dir), str(out), "--dtype", "bf16", "--numerics", "act-bf16", "-p", "8",
                        "-n", "2", "-t", "1", "-r", "2"]) == 0
    text = capsys.readouterr().out
    assert "numerics act-bf16" in text and "transformers: bf16" in text
    for phase in ("prefill", "decode"):
        line = next(x for x in text.splitlines() if x.startswith(phase))
        ratio = re.search(r"ratio colibri / transformers ([0-9.]+)x", line)
        assert ratio is not None and float(ratio.group(1)) > 0, line


def test_bench_products_tool_compares_one_product_with_torch(capsys: pytest.CaptureFixture[str]) -> None:
    """tools/bench_products.py: Colibri's bench_products and torch take turns on each shape and
    token count; one line per product with both rates and the per-turn ratio."""
    pytest.importorskip("torch")
    root = Path(__file__).resolve().parents[1]
    subprocess.run(["make", "-s", "-C", str(root / "engine_c"), "build/bench_products"], check=True)
    module = _tool("bench_products")
    assert module.main(["--shapes", "64x96", "--tokens", "1,6", "-t", "1", "-r", "2", "--megabytes", "1"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "tokens" in x and "ratio" in x]
    assert len(lines) == 2 and "    1 tokens" in lines[0] and "    6 tokens" in lines[1]
    for line in lines:
        ratio = re.search(r"ratio +([0-9.]+)x", line)
        assert ratio is not None and float(ratio.group(1)) > 0, line


def _has_avx512_vnni() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512f" in flags and " avx512_vnni" in flags


@pytest.mark.skipif(not _has_avx512_vnni(), reason="the probes need AVX-512 VNNI")
def test_bench_products_ceilings_reports_each_rate() -> None:
    """bench_products --ceilings: one JSON line with the core's int8 and f32 multiply-add rates and
    the rate of each float order's instruction mix, all measured (positive)."""
    root = Path(__file__).resolve().parents[1]
    subprocess.run(["make", "-s", "-C", str(root / "engine_c"), "build/bench_products"], check=True)
    out = subprocess.run([str(root / "engine_c" / "build" / "bench_products"), "--ceilings"],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    for key in ("int8_vnni_gmacs", "f32_fma_gmacs", "q8_lane_order_gmacs", "q4_lane_order_gmacs", "block_order_gmacs"):
        assert r[key] > 0, key


def _has_avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not _has_avx2(), reason="the AVX2 probes need AVX2")
def test_bench_products_ceilings_of_the_avx2_path_on_any_avx2_cpu() -> None:
    """bench_products --ceilings --kernels avx2: the AVX2 path's probes (vpmaddwd alone and each
    form of a q8_0 pass) even where the CPU has AVX-512 VNNI, so the AVX2 kernels can be held
    against their own bound on the machine at hand; another path after --ceilings is refused."""
    root = Path(__file__).resolve().parents[1]
    subprocess.run(["make", "-s", "-C", str(root / "engine_c"), "build/bench_products"], check=True)
    tool = str(root / "engine_c" / "build" / "bench_products")
    out = subprocess.run([tool, "--ceilings", "--kernels", "avx2"], check=True, capture_output=True,
                         text=True).stdout
    r = json.loads(out)
    for key in ("vpmaddwd_gmacs", "q8_avx2_sign_gmacs", "q8_avx2_int16_pairs_gmacs", "q8_avx2_int16_movsx_gmacs"):
        assert r[key] > 0, key
    refused = subprocess.run([tool, "--ceilings", "--kernels", "avx512"], capture_output=True, text=True)
    assert refused.returncode == 2 and "usage" in refused.stderr


def test_bench_session_times_every_repeat_of_a_prefill_and_its_decode() -> None:
    """engine_c's bench_session (public API only): one JSON line with the path that ran and the
    seconds of each repeat's prefill and of the steps after it."""
    root = Path(__file__).resolve().parents[1]
    subprocess.run(["make", "-s", "-C", str(root / "engine_c"), "build/bench_session"], check=True)
    out = subprocess.run([str(root / "engine_c" / "build" / "bench_session"),
                          str(root / "resources" / "demo" / "demo.colibri"), "--prompt", "12", "--decode", "5",
                          "--threads", "2", "--repeats", "3", "--kernels", "portable"],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    assert r["kernels"] == "portable" and (r["threads"], r["prompt"], r["decode"]) == (2, 12, 5)
    assert len(r["prefill_seconds"]) == len(r["decode_seconds"]) == 3
    assert all(s > 0 for s in r["prefill_seconds"] + r["decode_seconds"])


def test_bench_session_warms_up_with_a_prompt_shorter_than_its_warm_steps() -> None:
    """The warm-up steps reuse the prompt's tokens: a 1-token prompt ran them on the 3 ints past
    its array ("token 32738 outside [0, 32000)" on the Mixtral-shaped bench model)."""
    root = Path(__file__).resolve().parents[1]
    subprocess.run(["make", "-s", "-C", str(root / "engine_c"), "build/bench_session"], check=True)
    for prompt in ("1", "2", "3"):
        run = subprocess.run([str(root / "engine_c" / "build" / "bench_session"),
                              str(root / "resources" / "demo" / "demo.colibri"), "--prompt", prompt,
                              "--decode", "6", "--repeats", "1", "--kernels", "portable"],
                             capture_output=True, text=True, env={**os.environ, "MALLOC_PERTURB_": "165"})
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["prompt"] == int(prompt)


def test_bench_session_names_an_unreadable_file() -> None:
    root = Path(__file__).resolve().parents[1]
    subprocess.run(["make", "-s", "-C", str(root / "engine_c"), "build/bench_session"], check=True)
    run = subprocess.run([str(root / "engine_c" / "build" / "bench_session"), "/nonexistent.colibri"],
                         capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.startswith("bench_session: /nonexistent.colibri: ")


def test_bench_builds_tool_runs_two_builds_in_turns(capsys: Capture) -> None:
    """tools/bench_builds.py: builds the engine twice (here the working tree both times, which
    needs no git history), runs the two in turns and prints both rates and the paired ratio."""
    root = Path(__file__).resolve().parents[1]
    module = _tool("bench_builds")
    assert module.main([str(root / "resources" / "demo" / "demo.colibri"), "--a", "worktree", "--b", "worktree",
                        "-p", "8", "-n", "4", "--turns", "2", "-r", "1"]) == 0
    text = capsys.readouterr().out
    for phase in ("prefill", "decode"):
        line = next(x for x in text.splitlines() if x.startswith(phase))
        ratio = re.search(r"A +([0-9.]+) tok/s, B +([0-9.]+) tok/s; B / A ([0-9.]+) ", line)
        assert ratio is not None and all(float(v) > 0 for v in ratio.groups()), line


def test_bench_builds_tool_gives_one_build_its_own_compiler_flags(capsys: Capture) -> None:
    """--b-cflags reaches B's compiler and only B's: a constant B cannot compile stops the run
    with the build's command named, and the same flags on A are named in the header of a run."""
    root = Path(__file__).resolve().parents[1]
    module = _tool("bench_builds")
    demo = str(root / "resources" / "demo" / "demo.colibri")
    assert module.main([demo, "--a", "worktree", "--b", "worktree", "--b-cflags=-DCOL_DECODE_STREAMS=nonsense",
                        "-p", "8", "-n", "4", "--turns", "1", "-r", "1"]) == 1
    assert "building failed" in capsys.readouterr().err
    assert module.main([demo, "--a", "worktree", "--b", "worktree", "--a-cflags=-DCOL_DECODE_STREAMS=4",
                        "-p", "8", "-n", "4", "--turns", "2", "-r", "1"]) == 0
    assert "A = worktree -DCOL_DECODE_STREAMS=4, B = worktree" in capsys.readouterr().out


def test_bench_builds_tool_runs_b_on_its_own_file(capsys: Capture, tmp_path: Path) -> None:
    """--b-file: B times another file of the same model (e.g. its weights in another layout),
    A the positional one, and the header names B's file."""
    import shutil

    root = Path(__file__).resolve().parents[1]
    module = _tool("bench_builds")
    demo = root / "resources" / "demo" / "demo.colibri"
    other = tmp_path / "other-layout.colibri"
    shutil.copyfile(demo, other)
    assert module.main([str(demo), "--a", "worktree", "--b", "worktree", "--b-file", str(other),
                        "-p", "8", "-n", "4", "--turns", "2", "-r", "1"]) == 0
    assert "B = worktree on other-layout.colibri" in capsys.readouterr().out


def test_bench_vs_llamacpp_tool_compares_both_conversions_of_one_checkpoint(
        tmp_path: Path, capsys: Capture) -> None:
    """tools/bench_vs_llamacpp.py on a tiny Qwen3-MoE checkpoint: Colibri's converter and
    llama.cpp's (with a tokenizer trained for it) make q8 files of equal bytes per token, both
    engines run in turns, and the report has their speeds, fractions of the limit and ratios.
    Needs llama.cpp's tools already built by tools/llamacpp.py (never built here)."""
    pytest.importorskip("torch")
    hf_reference = pytest.importorskip("hf_reference")
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tools"))
    import llamacpp
    import make_gguf_fixtures

    bin_dir = llamacpp.LlamaCpp().build_dir / "bin"
    if not all((bin_dir / tool).is_file() for tool in llamacpp.TOOLS.values()):
        pytest.skip("llama.cpp's tools are not built (python tools/llamacpp.py build)")
    variant = hf_reference.Variant("tiny", "qwen3_moe", make_gguf_fixtures.CONFIGS["qwen3_moe"])
    hf = hf_reference.save(hf_reference.build(variant), tmp_path / "tiny-hf")
    module = _tool("bench_vs_llamacpp")
    assert module.main(["--models", "", "--checkpoint", str(hf), "--precisions", "bf16,q8",
                        "--turns", "1", "-r", "1", "-p", "8", "-n", "4", "-t", "1",
                        "--probe-mb", "64", "--work", str(tmp_path), "--json",
                        "--numerics", "dot-bf16", "--save", str(tmp_path / "saved.json")]) == 0
    report = json.loads(capsys.readouterr().out)
    saved = json.loads((tmp_path / "saved.json").read_text())
    assert saved["rows"] == report["rows"] and saved["turns"] == 1
    bf16, q8 = report["rows"]
    assert report["engines"] == ["colibri", "colibri dot-bf16", "llama.cpp"]
    assert (q8["model"], q8["precision"], q8["matched"]) == ("tiny-hf", "q8", True)
    assert q8["bytes_per_token"]["colibri"] == q8["bytes_per_token"]["llama.cpp"] > 0
    # the numerics mode runs where the file has bf16 weights only
    assert set(bf16["engines"]) == set(report["engines"])
    assert set(q8["engines"]) == {"colibri", "llama.cpp"}
    has_bf16_dot = report["compute_probe"]["best"]["bf16 dot"] > 0  # AVX512-BF16
    for row in (bf16, q8):
        for engine, speeds in row["engines"].items():
            assert speeds["prefill_tok_s"]["median"] > 0 and speeds["decode_tok_s"]["median"] > 0
            assert 0 < speeds["fraction_of_limit"]["median"]
            # prefill against the same-run compute probe of the arithmetic the engine uses;
            # bf16 on the AMX tiles has no probe, llama.cpp's bf16 needs AVX512-BF16's
            on_amx_tiles = row is bf16 and engine == "colibri" and {
                run["kernels"] for run in row["runs"][engine]} == {"amx"}
            needs_bf16_dot = row is bf16 and engine != "colibri"
            if on_amx_tiles:
                assert "prefill_of_compute" not in speeds
            elif has_bf16_dot or not needs_bf16_dot:
                assert 0 < speeds["prefill_of_compute"]["median"]
        assert row["ratios"]["llama.cpp"]["decode_tok_s"]["median"] > 0
        assert all(run["load"] >= 0 for runs in row["runs"].values() for run in runs)
        assert all(run["worker_share"] is None for run in row["runs"]["colibri"])  # one thread: no workers
    assert bf16["ratios"]["colibri dot-bf16/llama.cpp"]["prefill_tok_s"]["median"] > 0
    assert report["compute_probe"]["best"]["f32 FMA"] > 0 and report["compute_probe"]["best"]["int8 dot"] > 0
    # the memory's latency beside each run: the readings before and after it
    assert report["latency_ns"]["lowest"] > 0
    assert all(len(run["latency_ns"]) == 2 for runs in q8["runs"].values() for run in runs)
    report_file = tmp_path / "report.json"
    report_file.write_text(json.dumps(report))
    assert module.main(["--from-json", str(report_file)]) == 0
    text = capsys.readouterr().out
    assert "| tiny-hf | q8 | llama.cpp |" in text and "memory latency (dependent loads" in text
    assert "| tiny-hf | bf16 | colibri dot-bf16 |" in text and "| tiny-hf | bf16 | dot-bf16 | " in text


def test_bench_vs_llamacpp_turns_llama_cpp_repacking_off_where_it_faults(tmp_path: Path) -> None:
    """A llama-bench that dies by a signal with its weight repacking on (llama.cpp 0.3.36's AMX
    kernels do on some Xeons) is run with `--repack 0` from then on; one that runs keeps the
    arguments it was given, and an explicit --repack is never overridden."""
    import types

    module = _tool("bench_vs_llamacpp")
    faulting = tmp_path / "faulting-llama-bench"
    faulting.write_text('#!/bin/sh\ncase "$*" in *"--repack 0"*) echo "[]";; *) kill -SEGV $$;; esac\n')
    faulting.chmod(0o755)
    working = tmp_path / "working-llama-bench"
    working.write_text('#!/bin/sh\necho "[]"\n')
    working.chmod(0o755)
    cells = [types.SimpleNamespace(gguf_file=tmp_path / "a.gguf"),
             types.SimpleNamespace(gguf_file=tmp_path / "b.gguf")]

    assert module.llama_cpp_arguments(faulting, cells, []) == ["--repack", "0"]
    assert module.llama_cpp_arguments(faulting, cells, ["-fa", "1"]) == ["-fa", "1", "--repack", "0"]
    assert module.llama_cpp_arguments(working, cells, ["-fa", "1"]) == ["-fa", "1"]
    assert module.llama_cpp_arguments(faulting, cells, ["--repack", "1"]) == ["--repack", "1"]


def test_bench_vs_llamacpp_times_the_peers_decode_after_the_prompt(tmp_path: Path) -> None:
    """Colibri's decode follows its prefill and reads the prompt's KV cache, so the peers' decode
    is timed after the prompt as well: llama.cpp at depth P (its prefill at depth 0), ik_llama.cpp
    by its tg-after-pp test; `--peer-decode empty` keeps llama-bench's plain tg."""
    import argparse

    module = _tool("bench_vs_llamacpp")
    rows = [  # what each llama-bench prints for -p 16 and its decode arguments below, -o json
        {"n_prompt": 16, "n_gen": 0, "n_depth": 0, "samples_ts": [300.0]},
        {"n_prompt": 0, "n_gen": 4, "n_depth": 0, "samples_ts": [90.0]},
        {"n_prompt": 16, "n_gen": 0, "n_depth": 16, "samples_ts": [280.0]},
        {"n_prompt": 0, "n_gen": 4, "n_depth": 16, "samples_ts": [80.0]},
    ]
    ik_rows = [{"n_prompt": 16, "n_gen": 0, "samples_ts": [400.0]},
               {"n_prompt": 16, "n_gen": 4, "samples_ts": [70.0]}]
    bench = tmp_path / "llama-bench"
    bench.write_text("#!/bin/sh\necho \"$*\" > \"$0.args\"\ncat \"$0.json\"\n")
    bench.chmod(0o755)
    cell = module.Cell("tiny", "q8", tmp_path / "a.colibri", tmp_path / "a.gguf", {}, {})
    args = argparse.Namespace(p=16, n=4, threads=1, repeats=1, peer_decode="after-prompt")

    def run(engine: str, json_rows: list[dict[str, object]]) -> tuple[float, float, str]:
        (tmp_path / "llama-bench.json").write_text(json.dumps(json_rows))
        return module.run_llama_bench(bench, engine, cell, args, [])

    assert run("llama.cpp", rows)[:2] == (300.0, 80.0)
    assert "-n 4 -d 0,16" in (tmp_path / "llama-bench.args").read_text()
    assert run("ik_llama.cpp", ik_rows)[:2] == (400.0, 70.0)
    assert "-n 0 -gp 16,4" in (tmp_path / "llama-bench.args").read_text()
    args.peer_decode = "empty"
    assert run("llama.cpp", rows[:2])[:2] == (300.0, 90.0)
    assert " -d " not in (tmp_path / "llama-bench.args").read_text()


def test_bench_vs_llamacpp_keeps_colibri_to_the_kernel_path_asked_for() -> None:
    """`--kernels PATH` runs Colibri's bench on that path even where the machine has a better one
    (how an AMX machine shows where a CPU without AMX stands); without it, on the best path."""
    import argparse

    from colibri.engine import best_kernels

    module = _tool("bench_vs_llamacpp")
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    cell = module.Cell("demo", "bf16", demo, demo, {}, {})
    args = argparse.Namespace(p=4, n=2, threads=1, repeats=1, kernels="portable")
    prefill, decode, kernels, huge, workers = module.run_colibri(cell, args, None)
    assert kernels == "portable" and prefill > 0 and decode > 0 and workers is None  # one thread
    # the share of the file's resident pages in 2 MiB pages, where smaps says
    assert (huge is None) is (not Path("/proc/self/smaps").exists()) and (huge is None or 0 <= huge <= 1)
    # the compute limits are that path's: the portable path has no vector instruction to probe
    assert set(module.compute_probe(args).values()) == {None}
    args.kernels, args.threads = None, 2
    _, _, kernels, _, workers = module.run_colibri(cell, args, None)
    assert kernels == best_kernels()
    assert workers is not None and 0 <= workers <= 1  # the worker's share of the decode's multiply-adds


def test_bench_peak_memory_leaves_out_the_probe_and_names_the_mapped_file() -> None:
    """The peak RSS `colibri bench` reports is that of the runs: a 512 MiB probe buffer does not
    show in it, and the resident pages of the mapped model file are given apart."""
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    args = ["bench", str(demo), "-p", "8", "-n", "4", "-r", "1", "--probe-mb", "512",
            "--no-trace-check"]

    def bench(*extra: str) -> str:   # a fresh process: the test run's own heap is not measured
        run = subprocess.run([sys.executable, "-c", "import sys; from colibri.cli import main; "
                              "sys.exit(main(sys.argv[1:]))", *args, *extra],
                             capture_output=True, text=True, timeout=300, check=False)
        assert run.returncode == 0, run.stderr
        return run.stdout

    r = json.loads(bench("--json"))
    assert r["peak_rss_excludes_probe"] is (sys.platform == "linux")
    if r["peak_rss_excludes_probe"]:
        assert r["peak_rss_mb"] < 512
    assert 0 < r["mapped_rss_mb"] <= demo.stat().st_size / 2**20 + 0.01
    assert r["model_bytes"] < demo.stat().st_size and r["probe_mb"] == 512
    line = next(x for x in bench().splitlines() if x.startswith("peak RSS"))
    assert "MiB the mapped model file" in line and "512 MiB bandwidth probe" in line
    assert "before the model was opened" in line


def uncached_copy(source: Path, target: Path) -> Path:
    """`source` copied to `target`, then its pages dropped from the page cache (they are clean once
    synced), so the next reader brings them in again."""
    target.write_bytes(source.read_bytes())
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return target


def pmd_mapped_bytes(path: Path) -> int:
    """Bytes of this process's mappings of `path` mapped 2 MiB at a time (smaps FilePmdMapped)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            inside = len(fields) >= 6 and fields[5] == str(path)
        elif inside and fields and fields[0] == "FilePmdMapped:":
            total += int(fields[1]) * 1024
    return total


def hinted_mappings_get_huge_pages(tmp_path: Path) -> bool:
    """Whether this kernel and file system map a file read in through a mapping that asks for
    huge pages 2 MiB at a time (Python's own mapping of an 8 MiB file)."""
    import mmap
    if not hasattr(mmap, "MADV_HUGEPAGE") or not Path("/proc/self/smaps").exists():
        return False
    probe = tmp_path / "probe.bin"
    probe.write_bytes(os.urandom(8 << 20))
    probe = uncached_copy(probe, tmp_path / "probe-uncached.bin")
    with open(probe, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        m.madvise(mmap.MADV_HUGEPAGE)
        sum(m[i] for i in range(0, len(m), 4096))
        return pmd_mapped_bytes(probe.resolve()) > 0


def test_bench_reports_a_file_read_in_through_its_mapping_in_2_mib_pages(tmp_path: Path) -> None:
    """The engine's mapping asks for huge pages: a model file out of the page cache comes back in
    2 MiB pages, and `colibri bench` reports that share of the mapped file's resident pages."""
    if not hinted_mappings_get_huge_pages(tmp_path):
        pytest.skip("this kernel or file system maps no file 2 MiB at a time")
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    model = uncached_copy(demo, tmp_path / "demo.colibri")
    run = subprocess.run([sys.executable, "-c", "import sys; from colibri.cli import main; "
                          "sys.exit(main(sys.argv[1:]))", "bench", str(model), "-p", "8", "-n", "4",
                          "-r", "1", "--probe-mb", "64", "--no-trace-check", "--json"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout)
    assert 0 < r["mapped_huge_mb"] <= r["mapped_rss_mb"]


def test_bench_peak_memory_beyond_the_interpreter_is_the_sessions() -> None:
    """What `colibri bench` adds to the process's resident set beyond the interpreter and the
    mapped file is the engine's sessions (their memory estimate) and a few MiB of thread stacks
    and arrays: the 1.1 GiB it once reported for the 13 MB demo model (the probe's buffer) or a
    KV cache sized for the full context would show here."""
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    run = subprocess.run([sys.executable, "-c", "import sys; from colibri.cli import main; "
                          "sys.exit(main(sys.argv[1:]))", "bench", str(demo), "-p", "8", "-n", "4",
                          "-r", "1", "-t", "2", "--probe-mb", "256", "--no-trace-check", "--json"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    r = json.loads(run.stdout)
    if not r["peak_rss_excludes_probe"]:
        pytest.skip("the peak RSS cannot be reset on this platform")
    assert r["baseline_rss_mb"] > 0 and r["n_sessions"] == 1
    rest = r["peak_rss_mb"] - r["baseline_rss_mb"] - r["mapped_rss_mb"]
    assert rest <= r["session_bytes"] / 2**20 + 16


def test_info_loads_no_other_command_s_machinery() -> None:
    """`colibri info` on the demo model loads what it reads the file with, not what other
    commands need: every command once paid for pyarrow, the converter and the jitter lab at
    start-up (33.5 MiB of resident memory before a model was opened)."""
    demo = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
    heavy = ("pyarrow", "torch", "transformers", "PySide6", "pyqtgraph", "colibri.convert",
             "colibri.convert_gguf", "colibri.jitter.analysis", "colibri.profile.job",
             "colibri.reference.diff")
    code = ("import sys; from colibri.cli import main; code = main(sys.argv[1:]); "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r} "
            f"or m.startswith({heavy!r})), file=sys.stderr); sys.exit(code)")
    run = subprocess.run([sys.executable, "-c", code, "info", str(demo)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert "tensors:" in run.stdout
    assert run.stderr.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("command", [["--help"], ["convert", "--help"], ["jitter", "--help"],
                                     ["profile", "--help"]])
def test_the_command_line_s_parser_loads_no_engine(command: list[str]) -> None:
    """Reading the command line loads neither the engine's binding nor its compiled extension:
    the parser once loaded both for every command, through the jitter variants' kernel paths
    (the `jitter` and `profile` commands name the default variants in their help)."""
    code = ("import sys; from colibri.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as exc:\n    code = exc.code\n"
            "print(sorted(m for m in sys.modules if m.startswith(('colibri.engine', "
            "'colibri._colibri_cffi'))), file=sys.stderr); sys.exit(code)")
    run = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert "usage: colibri" in run.stdout
    assert run.stderr.strip().splitlines()[-1] == "[]"


def test_bench_explains_a_model_that_fits_in_the_cache() -> None:
    """Above 100% of the bandwidth limit is no mystery when the weights fit in the last-level
    cache: the report says so, and says why otherwise."""
    from colibri.bench import BenchResult, limit_note

    def result(model_bytes: int, cache_bytes: int, fraction: float) -> BenchResult:
        return BenchResult("m", "avx2", "default", 1, 8, 4, 1, 1.0, 1.0, 1.0, 1, 0, 1.0, 1.0,
                           1.0, fraction, (1.0, 1.0), (1.0, 1.0), (fraction, fraction), 1.0,
                           0.0, 50.0, 10.0, True, 1024.0, model_bytes, cache_bytes, 1, {})

    fits = limit_note(result(13_000_000, 32 << 20, 1.62))
    assert "fit in this machine's 32 MiB last-level cache" in fits and "not bandwidth-bound" in fits
    assert "above 100%" in limit_note(result(10**9, 32 << 20, 1.05))
    assert limit_note(result(10**9, 32 << 20, 0.8)) == ""
