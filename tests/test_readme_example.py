"""The README's DeepSeek-V3 example is what the tools print: its two scripts, run as shown
(make the tiny model with transformers, convert, run with --debug-routing and --dump-trace,
explain one decision), give the README's lines."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

pytest.importorskip("torch")

from colibri.cli import main  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "A DeepSeek-V3 routing decision, from a checkpoint"


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block of `text`."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w+)\n(.*?)```", text, re.S)]


def test_readme_deepseek_v3_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture) -> None:
    text = README.read_text()
    start = text.index(SECTION)
    blocks = _blocks(text[start:text.index("The demo's near-ties", start)])
    (_, make), (_, session), (_, explain), (_, explained) = blocks
    monkeypatch.chdir(tmp_path)
    (tmp_path / "make_tiny_v3.py").write_text(make)
    (tmp_path / "explain.py").write_text(explain)
    runpy.run_path("make_tiny_v3.py")
    assert main(["convert", "tiny-v3", "tiny-v3.colibri"]) == 0
    capsys.readouterr()
    assert main(["info", "tiny-v3.colibri"]) == 0
    info = capsys.readouterr().out.splitlines()
    shown = session.splitlines()
    rules = [line for line in shown if line.startswith("  layer ")]
    assert len(rules) == 3 and all(line in info for line in rules)
    command = next(line for line in shown if line.startswith("$ colibri run "))
    assert main(command[len("$ colibri "):].split()) == 0
    run = capsys.readouterr().out.splitlines()
    printed = [line for line in shown if line.startswith(("pos ", "tokens: "))]
    assert printed and all(line in run for line in printed)
    runpy.run_path("explain.py")
    out = capsys.readouterr().out
    assert out == explained.split("\n", 1)[1]   # after the "$ python explain.py" line


INTERVENTION = "Change a routing decision and see what follows"


def test_readme_intervention_example(capsys: pytest.CaptureFixture) -> None:
    """The README's --intervene example prints the lines shown (on the AVX-512 kernels it was
    recorded on: another path can settle the demo's 1-ULP tie the other way), and the ablation
    the text describes gives its figures."""
    from colibri.engine import best_kernels

    if best_kernels() not in ("avx512", "avx512f"):  # avx512f computes avx512's bits
        pytest.skip(f"the README's figures are from the avx512 kernels; this machine runs "
                    f"{best_kernels()}")
    text = README.read_text()
    start = text.index(INTERVENTION)
    (_, shown), = _blocks(text[start:text.index("Other commands:", start)])
    command, *expected = shown.replace("\\\n      ", "").splitlines()
    demo = str(README.parent / "resources" / "demo" / "demo.colibri")
    args = ["run", demo, "--prompt", "def read_header(self, data):", "-n", "8",
            "--intervene", "forbid:pos=4,layer=1,experts=1"]
    assert command == ('$ colibri run resources/demo/demo.colibri --prompt "def read_header(self, '
                       'data):" -n 8 --intervene forbid:pos=4,layer=1,experts=1')
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    for line in expected:
        if line != "...":
            assert line in out, line
    assert main(["run", demo, "--prompt", "def read_header(self, data):", "-n", "8",
                 "--intervene", "ablate:layer=2,expert=0"]) == 0
    out = capsys.readouterr().out
    assert "10 of 64 routing decisions changed (6 of the 16 made under an intervention, " \
           "4 downstream)" in out and "max KL 0.318" in out
    assert "text: \n        if self.is_error is\n" in out


DEMO_DIFF = "On the demo model, with its own weights written back as a transformers checkpoint"


def test_readme_demo_diff_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture) -> None:
    """The README's diff of the demo against its own weights in transformers is what the tools
    print, up to differences below 1e-4 (recorded on the avx512 kernels, whose last bits settle
    the near tie it finds), and
    the divergence it reports is the intervention example's decision, with the same logit
    difference."""
    pytest.importorskip("transformers")
    from colibri.engine import best_kernels

    if best_kernels() not in ("avx512", "avx512f"):  # avx512f computes avx512's bits
        pytest.skip(f"the README's figures are from the avx512 kernels; this machine runs "
                    f"{best_kernels()}")
    text = README.read_text()
    start = text.index(DEMO_DIFF)
    (_, shown), = _blocks(text[start:text.index("Routing over a whole corpus", start)])
    make, diff, *expected = shown.splitlines()
    assert make == "$ python tools/demo_checkpoint.py demo-hf"
    monkeypatch.chdir(README.parent)
    tool = runpy.run_path(str(README.parent / "tools" / "demo_checkpoint.py"))
    tool["write_checkpoint"](README.parent / "resources" / "demo" / "demo.colibri",
                             tmp_path / "demo-hf")
    assert diff == ('$ colibri diff resources/demo/demo.colibri demo-hf --prompt "def '
                    'read_header(self, data):"')
    capsys.readouterr()
    assert main(["diff", "resources/demo/demo.colibri", str(tmp_path / "demo-hf"), "--prompt",
                 "def read_header(self, data):"]) == 0
    out = capsys.readouterr().out.replace(str(tmp_path / "demo-hf"), "demo-hf")

    def masked(lines: list[str]) -> list[str]:
        """Differences below 1e-4 vary with transformers' thread count (summation order)."""
        return [re.sub(r"\d\.\d\de-(0[5-9]|[1-9]\d)", "~", line) for line in lines]

    assert masked(out.splitlines()) == masked(expected)
    # the same decision and the same logit difference as the intervention example
    assert "layer 1 position 4: colibri [6,1], transformers [6,2]" in out
    intervention = text[text.index(INTERVENTION):]
    assert "max |dlogit| 0.0279" in intervention and "logits         2.79e-02" in out
