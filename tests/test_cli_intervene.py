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
