"""`colibri run --intervene`: the run under the interventions is the engine's, the comparison
is printed, --dump-trace records what was applied, and a bad spec is named with its field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from colibri.cli import main
from colibri.engine import Model, Session
from colibri.interventions import KINDS, Intervention

Capture = pytest.CaptureFixture[str]
PROMPT = "3,4,5,6,7"
SPECS = ("force:pos=3,layer=2,experts=5+6", "ablate:layer=0,expert=1")


@pytest.fixture(scope="module")
def path(tiny_model_path: Callable[..., Path]) -> Path:
    return tiny_model_path("qwen2_moe", n_layers=3, n_experts=8, top_k=2, dense_layers=(1,))


def run(capsys: Capture, *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def intervene_args(*specs: str) -> list[str]:
    return [a for s in specs for a in ("--intervene", s)]


def test_the_dumped_trace_is_the_engines_run_under_them(capsys: Capture, path: Path,
                                                        tmp_path: Path) -> None:
    out_npz = tmp_path / "t.npz"
    code, out, _ = run(capsys, "run", path, "--tokens", PROMPT, "-n", "4", "--dump-trace", out_npz,
                       *intervene_args(*SPECS))
    assert code == 0
    dumped = np.load(out_npz)
    assert list(dumped["interventions"]) == list(SPECS[:1]) + ["ablate:layer=0,experts=1"]
    with Model.open(path) as m, Session(m) as s:
        s.set_interventions([Intervention.parse(x) for x in SPECS])
        run_ = s.generate([3, 4, 5, 6, 7], 4)
        trace = s.trace
        assert np.array_equal(dumped["expert_ids"], trace.expert_ids)
        assert np.array_equal(dumped["intervened"], trace.intervened)
    assert dumped["intervened"][3, 1] == 1 << KINDS.index("force")
    assert (dumped["intervened"][:, 0] == 1 << KINDS.index("ablate")).all()
    assert f"tokens: {','.join(map(str, run_.generated))}" in out
    for spec in SPECS:
        assert f"intervention: {Intervention.parse(spec).spec} (" in out
    assert "counterfactual from position 0:" in out   # ablate acts from the first position
    assert "(* = a decision made under an intervention)" in out


def test_no_compare_runs_under_them_only(capsys: Capture, path: Path) -> None:
    _, compared, _ = run(capsys, "run", path, "--tokens", PROMPT, "-n", "4",
                         *intervene_args(SPECS[0]))
    code, alone, _ = run(capsys, "run", path, "--tokens", PROMPT, "-n", "4", "--no-compare",
                         *intervene_args(SPECS[0]))
    assert code == 0 and "counterfactual" not in alone
    assert [l for l in alone.splitlines() if l.startswith("tokens:")] == \
        [l for l in compared.splitlines() if l.startswith("tokens:")]
    assert "counterfactual from position 3:" in compared


def test_debug_routing_marks_the_decisions_made_under_them(capsys: Capture, path: Path) -> None:
    code, out, _ = run(capsys, "run", path, "--tokens", PROMPT, "-n", "2", "--debug-routing",
                       *intervene_args(SPECS[0]))
    assert code == 0
    marked = [l for l in out.splitlines() if "[intervened:" in l]
    assert len(marked) == 1
    assert marked[0].startswith("pos 3 token 'on' layer 2: experts [5,6] weights [")
    assert marked[0].endswith("] [intervened: force]")


def test_after_the_run_nothing_changes(capsys: Capture, path: Path) -> None:
    code, out, _ = run(capsys, "run", path, "--tokens", PROMPT, "-n", "2",
                       *intervene_args("forbid:pos=40,experts=1"))
    assert code == 0 and "act after the run's last position: nothing changed" in out


def test_cached_routing_under_them_dumps_the_engines_run(capsys: Capture, path: Path,
                                                          tmp_path: Path) -> None:
    """--routing cached with an expert cache: the dumped trace holds both the caching arrays and
    the interventions of the engine's run under them (the comparison's rerun from position 3
    rebuilt the caching state there), and the summary counts are that run's."""
    out_npz = tmp_path / "t.npz"
    code, out, _ = run(capsys, "run", path, "--tokens", PROMPT, "-n", "6", "--dump-trace", out_npz,
                       "--routing", "cached", "--cache-threshold", "0.5", "--expert-cache", "4",
                       *intervene_args(SPECS[0]))
    assert code == 0 and "counterfactual from position 3:" in out
    dumped = np.load(out_npz)
    with Model.open(path) as m, Session(m, routing="cached", cache_threshold=0.5,
                                        expert_cache=4) as s:
        s.set_interventions([Intervention.parse(SPECS[0])])
        s.generate([3, 4, 5, 6, 7], 6)
        trace, stats = s.trace, s.cache_stats()
        for name in ("expert_ids", "expert_weights", "intervened", "cache_kept", "fresh_ids",
                     "cache_hits"):
            assert np.array_equal(dumped[name], getattr(trace, name)), name
        assert dumped["cache_margin"].tobytes() == trace.cache_margin.tobytes()
    assert list(dumped["fresh_ids"][3, 1]) == [5, 6] and not dumped["cache_kept"][3, 1]
    assert (f"expert cache: {stats.hits} hits, {stats.misses} misses of "
            f"{stats.hits + stats.misses} lookups") in out
    assert f"cached routing: kept the previous experts in {stats.kept} of {stats.decisions}" in out


def test_embedding_rows_take_them_as_token_ids_do(capsys: Capture, path: Path,
                                                  tmp_path: Path) -> None:
    """--embedding with --intervene: the model's own table rows give the token ids' comparison,
    line for line after the prompt line (a prompt position's next token reads <embedding>)."""
    with Model.open(path) as m:
        rows = np.ascontiguousarray(m.tensor_f32("token_embd")[[3, 4, 5, 6, 7]])
    np.save(tmp_path / "x.npy", rows)
    _, by_ids, _ = run(capsys, "run", path, "--tokens", PROMPT, "-n", "4", *intervene_args(*SPECS))
    code, by_rows, _ = run(capsys, "run", path, "--embedding", tmp_path / "x.npy", "-n", "4",
                           *intervene_args(*SPECS))
    assert code == 0
    tail = lambda text: text[text.index("\ntokens: "):].splitlines()  # noqa: E731
    assert "counterfactual from position 0:" in by_rows
    assert len(tail(by_rows)) == len(tail(by_ids))
    for row, want in zip(tail(by_rows), tail(by_ids)):
        if "<embedding>" in row:   # the same position, layers changed, max |dlogit| and KL
            assert row.split()[:1] + row.split()[-3:] == want.split()[:1] + want.split()[-3:]
        else:
            assert row == want


@pytest.mark.parametrize("spec,code,message", [
    ("force:pos=3,layer=2,experts=5+9", 1, "experts: expert 9 outside 0..7"),
    ("force:pos=3,layer=1,experts=5", 1, "layer: layer 1 is dense"),
    ("force:pos=3,experts=1+2+3", 1, "experts: 3 given, force takes 1..2"),
    ("force:pos=3", 2, "experts: missing"),
    ("forbid:pos=3,layer=two,experts=1", 2, "layer: 'two' is not a layer index"),
    ("ablate:pos=3,expert=1", 2, "pos: ablate removes an expert at every position"),
])
def test_a_bad_spec_is_named_with_its_field(capsys: Capture, path: Path, spec: str, code: int,
                                            message: str) -> None:
    if code == 2:   # the grammar: argparse's usage error
        with pytest.raises(SystemExit) as info:
            main(["run", str(path), "--tokens", PROMPT, "--intervene", spec])
        assert info.value.code == 2
        err = capsys.readouterr().err
    else:           # the engine's checks: the command's error line, exit 1
        got, _, err = run(capsys, "run", path, "--tokens", PROMPT, "--intervene", spec)
        assert got == 1
    assert f"intervention {spec!r}: {message}" in err
