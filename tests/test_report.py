"""`colibri validate`'s text: a problem names its tensor once, and a truncated file's run of
near-identical lines (every tensor past the cut) is its first line plus one summary, for a
.colibri file and a GGUF file alike."""

from __future__ import annotations

from pathlib import Path

from colibri.cli import main
from colibri.engine import validate
from colibri.inspection.report import problem_lines

DEMO = Path(__file__).resolve().parents[1] / "resources" / "demo" / "demo.colibri"
CORPUS = Path(__file__).resolve().parent / "corpus"
GGUF = Path(__file__).resolve().parent / "fixtures" / "gguf" / "qwen2_moe-q4_0.gguf"


def test_a_problem_names_its_tensor_once() -> None:
    (p,) = validate(CORPUS / "tensor_bounds.colibri")
    assert p.tensor == "output" and not p.message.startswith("tensor '")
    assert problem_lines([p]) == [
        "error: COL_ERR_TENSOR_BOUNDS at 0xDE8 tensor 'output': offset 0x22C0 + 512 beyond file "
        "end 0x22C0"]


def test_a_truncated_file_summarises_the_tensors_past_the_cut(tmp_path: Path, capsys) -> None:
    cut = tmp_path / "truncated.colibri"
    cut.write_bytes(DEMO.read_bytes()[:5_000_000])
    problems = validate(cut)
    bounds = [p for p in problems if p.code_name == "COL_ERR_TENSOR_BOUNDS"]
    assert len(bounds) > 20
    assert main(["validate", str(cut)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("error: COL_ERR_TRUNCATED at 0x4C4B40")
    assert out[1] == f"error: COL_ERR_TENSOR_BOUNDS at 0x{bounds[0].offset:X} tensor " \
                     f"'{bounds[0].tensor}': {bounds[0].message}"
    assert out[2] == (f"  ... and {len(bounds) - 1} more COL_ERR_TENSOR_BOUNDS errors like it, "
                      f"for tensors '{bounds[1].tensor}' to '{bounds[-1].tensor}' (table entries "
                      f"0x{bounds[1].offset:X}..0x{bounds[-1].offset:X}; --json lists each)")
    assert out[3].endswith(f"INVALID ({len(problems)} error(s), 0 warning(s))")
    assert len(out) == 4


def test_short_runs_are_listed_in_full() -> None:
    problems = validate(CORPUS / "tensor_bounds.colibri") * 3
    assert len(problem_lines(problems)) == 3


def test_a_truncated_gguf_file_is_summarised_too_and_its_verdict_names_the_format(
        tmp_path: Path, capsys) -> None:
    from colibri.formats import validate as validate_foreign

    data = GGUF.read_bytes()
    cut = tmp_path / "truncated.gguf"
    cut.write_bytes(data[:len(data) // 3])
    _, problems = validate_foreign(cut)
    bounds = [p for p in problems if p.code_name == "COL_ERR_TENSOR_BOUNDS"]
    assert len(bounds) > 20
    assert main(["validate", str(cut)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [*problem_lines(problems),
                   f"{cut}: gguf, INVALID ({len(problems)} error(s), 0 warning(s))"]
    assert len(out) == 4 and out[2].startswith(f"  ... and {len(bounds) - 1} more ")
