"""`colibri run` with expert caching (--routing cached --cache-threshold T, --expert-cache N) and
embedding input (--embedding X.npy): the run summary, --debug-routing, --dump-trace, and the
errors for bad combinations and bad files."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from colibri.cli import main
from colibri.engine import Model, Session

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
PROMPT = "def read_header(self, data):"
Capture = pytest.CaptureFixture[str]


def run_cli(capsys: Capture, *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def line(out: str, prefix: str) -> str:
    return next(l for l in out.splitlines() if l.startswith(prefix))


def test_summary_states_the_hit_rate_and_kept_decisions(capsys: Capture) -> None:
    """The numbers are the session's: the same run through the API counts the same."""
    code, out, _ = run_cli(capsys, "run", DEMO, "--prompt", PROMPT, "-n", "8", "--routing",
                           "cached", "--cache-threshold", "0.5", "--expert-cache", "4")
    assert code == 0
    with Model.open(DEMO) as model, Session(model, routing="cached", cache_threshold=0.5,
                                            expert_cache=4, trace=False) as s:
        ids = list(model.tokenizer.encode(PROMPT).ids)
        s.generate(ids, 8)
        stats = s.cache_stats()
    lookups = stats.hits + stats.misses
    assert line(out, "expert cache: ") == (
        f"expert cache: {stats.hits} hits, {stats.misses} misses of {lookups} lookups "
        f"({100 * stats.hits / lookups:.1f} % hit rate; 4 of 8 experts resident per MoE layer)")
    assert line(out, "cached routing: ") == (
        f"cached routing: kept the previous experts in {stats.kept} of {stats.decisions} "
        f"decisions (threshold 0.5)")
    assert stats.kept > 0


def test_the_lru_alone_under_plain_routing(capsys: Capture, tmp_path: Path) -> None:
    """Room for every expert: the only misses are each layer's first use of an expert."""
    dump = tmp_path / "trace.npz"
    _, out, _ = run_cli(capsys, "run", DEMO, "--prompt", PROMPT, "-n", "4", "--expert-cache", "8",
                        "--dump-trace", dump)
    with np.load(dump) as z:
        ids = z["expert_ids"]
        first_uses = sum(len(np.unique(ids[:, m])) for m in range(ids.shape[1]))
        assert (~z["cache_hits"]).sum() == first_uses
    assert re.search(rf"^expert cache: {ids.size - first_uses} hits, {first_uses} misses of "
                     rf"{ids.size} lookups", out, re.M)
    assert "cached routing" not in out


def test_debug_routing_marks_kept_sets_and_lru_hits(capsys: Capture) -> None:
    _, out, _ = run_cli(capsys, "run", DEMO, "--prompt", PROMPT, "-n", "8", "--routing",
                        "cached", "--cache-threshold", "0.5", "--expert-cache", "4",
                        "--debug-routing")
    kept = [l for l in out.splitlines() if "kept the previous experts over top-k" in l]
    assert kept and all(re.search(r"margin [0-9.e-]+\) lru \[(hit|miss),(hit|miss)\]$", l)
                        for l in kept)
    assert line(out, "pos 0 ").endswith("lru [miss,miss]")


def test_dump_trace_holds_the_caching_arrays(capsys: Capture, tmp_path: Path) -> None:
    out_path = tmp_path / "trace.npz"
    run_cli(capsys, "run", DEMO, "--prompt", PROMPT, "-n", "4", "--routing", "cached",
            "--cache-threshold", "0.5", "--expert-cache", "4", "--dump-trace", out_path)
    with np.load(out_path) as z:
        P = z["expert_ids"].shape[0]
        assert z["cache_kept"].shape == (P, 4) and z["cache_kept"].dtype == np.bool_
        assert z["cache_margin"].dtype == np.float32 and np.isnan(z["cache_margin"][0]).all()
        assert z["fresh_ids"].shape == (P, 4, 2) and z["cache_hits"].shape == (P, 4, 2)
        kept = z["cache_kept"]
        assert (z["fresh_ids"][~kept] == z["expert_ids"][~kept]).all()
    run_cli(capsys, "run", DEMO, "--prompt", PROMPT, "-n", "4", "--dump-trace", out_path)
    with np.load(out_path) as z:
        assert not {"cache_kept", "cache_margin", "fresh_ids", "cache_hits"} & set(z.files)


@pytest.mark.parametrize("argv, words", [
    (["--routing", "cached"], "--routing cached needs --cache-threshold T"),
    (["--cache-threshold", "0.5"], "--cache-threshold applies to --routing cached"),
    (["--routing", "cached", "--cache-threshold", "-1"], "cache_threshold must be finite and >= 0"),
    (["--expert-cache", "1"], r"expert_cache 1 outside 2\.\.8"),
    (["--routing", "soft", "--expert-cache", "4"], r"expert_cache 4 outside 8\.\.8"),
])
def test_bad_caching_options_are_named(capsys: Capture, argv: list[str], words: str) -> None:
    code, _, err = run_cli(capsys, "run", DEMO, "--tokens", "1,2", "-n", "2", *argv)
    assert code == 1 and re.search(words, err)


def embedding_file(tmp_path: Path, rows: np.ndarray, name: str = "x.npy") -> Path:
    path = tmp_path / name
    np.save(path, rows)
    return path


def demo_rows(text: str = PROMPT) -> np.ndarray:
    with Model.open(DEMO) as model:
        ids = list(model.tokenizer.encode(text).ids)
        return np.ascontiguousarray(model.tensor_f32("token_embd")[ids])


def test_embedding_rows_of_the_table_run_as_the_tokens(capsys: Capture, tmp_path: Path) -> None:
    """The issue's acceptance test: the demo model's own embedding rows give bit-identical
    logits to its token ids, end to end through the command line."""
    x = embedding_file(tmp_path, demo_rows())
    by_rows, by_ids = tmp_path / "rows.npy", tmp_path / "ids.npy"
    code, out, _ = run_cli(capsys, "run", DEMO, "--embedding", x, "-n", "8",
                           "--dump-logits", by_rows, "--debug-routing")
    assert code == 0
    assert line(out, "prompt: ") == "prompt: 9 embedding rows from x.npy"
    assert "prompt tokens" not in out
    assert line(out, "pos 0 ").startswith("pos 0 token <embedding> layer 0: experts [")
    _, out_ids, _ = run_cli(capsys, "run", DEMO, "--prompt", PROMPT, "-n", "8",
                            "--dump-logits", by_ids)
    assert line(out, "tokens: ") == line(out_ids, "tokens: ")
    assert line(out, "text: ") == line(out_ids, "text: ")
    assert np.load(by_rows).tobytes() == np.load(by_ids).tobytes()


@pytest.mark.parametrize("rows, words", [
    (np.zeros((3, 256), np.float64), "x.npy: embeddings must be float32, got float64"),
    (np.zeros((3, 100), np.float32),
     r"x.npy: embeddings of shape \[3, 100\], expected \[positions, 256\]"),
    (np.zeros((1, 3, 256), np.float32), r"\[1, 3, 256\].*a batch of one is x\[0\]"),
    (np.zeros((0, 256), np.float32), r"x.npy: no rows \(shape \[0, 256\]\)"),
])
def test_bad_embedding_files_are_named(capsys: Capture, tmp_path: Path, rows: np.ndarray,
                                       words: str) -> None:
    code, out, err = run_cli(capsys, "run", DEMO, "--embedding", embedding_file(tmp_path, rows))
    assert code == 1 and re.search(words, err) and "tokens:" not in out


def test_a_non_finite_row_and_a_file_that_is_not_npy(capsys: Capture, tmp_path: Path) -> None:
    rows = demo_rows()
    rows[4, 9] = np.nan
    code, _, err = run_cli(capsys, "run", DEMO, "--embedding", embedding_file(tmp_path, rows))
    assert code == 1 and "embedding row 4, element 9 is NaN" in err
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"not numpy")
    code, _, err = run_cli(capsys, "run", DEMO, "--embedding", junk)
    assert code == 1 and "junk.npy: not a .npy array file" in err
    code, _, err = run_cli(capsys, "run", DEMO, "--embedding", tmp_path / "missing.npy")
    assert code == 2 and "missing.npy: no such file" in err


def test_embedding_excludes_the_other_prompts(capsys: Capture, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(DEMO), "--tokens", "1", "--embedding", str(tmp_path / "x.npy")])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["serve", "profile"])
def test_commands_without_caching_do_not_offer_it(command: str) -> None:
    from colibri.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args([command, str(DEMO), "--routing", "cached"])


def test_trace_runs_the_debugger_with_caching(capsys: Capture, tmp_path: Path) -> None:
    """`colibri trace` records a cached run: the router slices carry what caching did, the
    saved session its settings."""
    import json

    from colibri.debugging.session_file import load_session

    out, session = tmp_path / "t.json", tmp_path / "s.colibri-session"
    code, _, _ = run_cli(capsys, "trace", DEMO, "--prompt", PROMPT, "-n", "4", "--routing",
                         "cached", "--cache-threshold", "0.5", "--expert-cache", "4",
                         "--out", out, "--session", session)
    assert code == 0
    routers = [e["args"] for e in json.loads(out.read_text())["traceEvents"]
               if e.get("name") == "router" and "args" in e]
    assert routers and all("cache_hits" in a and "cache_kept" in a for a in routers)
    saved = load_session(session)
    assert (saved.settings.routing, saved.settings.cache_threshold,
            saved.settings.expert_cache) == ("cached", 0.5, 4)


def test_the_c_tool_counts_what_the_api_counts() -> None:
    """engine_c's own `colibri-c run` (no Python) runs cached routing with an expert cache and
    reports the session's counts on stderr."""
    import subprocess

    engine = Path(__file__).resolve().parents[1] / "engine_c"
    subprocess.run(["make", "-s", "-C", str(engine), "build/colibri-c"], check=True)
    with Model.open(DEMO) as model:
        ids = list(model.tokenizer.encode(PROMPT).ids)
        with Session(model, routing="cached", cache_threshold=0.5, expert_cache=4,
                     trace=False) as s:
            generated = s.generate(ids, 8).generated
            stats = s.cache_stats()
    result = subprocess.run([str(engine / "build" / "colibri-c"), "run", str(DEMO), "--tokens",
                             ",".join(map(str, ids)), "-n", "8", "--routing", "cached",
                             "--cache-threshold", "0.5", "--expert-cache", "4"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ",".join(map(str, generated))
    assert f"expert cache: {stats.hits} hits, {stats.misses} misses (4 experts per MoE layer)" \
        in result.stderr
    assert f"cached routing: kept the previous experts in {stats.kept} of {stats.decisions} " \
           f"decisions" in result.stderr


def test_the_readme_shows_what_the_tool_prints(capsys: Capture) -> None:
    """The README's expert-caching example: its shown lines are lines of the real run."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = readme.index("--routing cached --cache-threshold 0.5 --expert-cache 4 --debug-routing")
    block = readme[start:readme.index("```", start)]
    shown = [l for l in block.splitlines()[1:] if l and l != "..."]
    code, out, _ = run_cli(capsys, "run", DEMO, "--prompt", PROMPT, "-n", "16", "--routing",
                           "cached", "--cache-threshold", "0.5", "--expert-cache", "4",
                           "--debug-routing")
    assert code == 0 and len(shown) == 4
    # a near tie's margin (3.8e-06) is at the kernels' rounding: its digits differ by path (AVX2,
    # AVX-512), so numbers below 1e-4 are compared as such, every other character exactly
    noise = re.compile(r"\d(\.\d{1,3})?e-(0[5-9]|[1-9]\d)")
    printed = {noise.sub("~", l) for l in out.splitlines()}
    assert all(noise.sub("~", l) in printed for l in shown), shown
    _, plain, _ = run_cli(capsys, "run", DEMO, "--prompt", PROMPT, "-n", "16", "--expert-cache",
                          "4")
    assert "expert cache: 136 hits" in plain and "(plain top-k with the same cache: 136 hits, " \
        "70.8 %)" in readme and "70.8 % hit rate" in plain
