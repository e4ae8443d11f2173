"""The jitter lab's Qt views show the numbers of the CLI's JSON reports; the lab runs on a
TaskRunner with progress and cancel and round-trips its results."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pyqtgraph")

from colibri.cli import main  # noqa: E402
from colibri.engine import Model  # noqa: E402
from colibri.inspector.jitter import QtJitterLab  # noqa: E402
from colibri.jitter import BASELINE, EpsilonReport, JitterReport  # noqa: E402
from colibri.jitter import report_json  # noqa: E402

from jitter_models import TIE_LAYER, make_tie_model  # noqa: E402

PROMPT = "3,4,5,6,7"
VARIANTS = "seq,blocked8+fma,act-bf16,noise1,noise2,noise4"
EPS = "0,1e-9,1e-6,1e-5"


@pytest.fixture(scope="module")
def tie_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tie_model(tmp_path_factory.mktemp("jitter-qt"))


@pytest.fixture(scope="module")
def cli_reports(tie_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    out = tmp_path_factory.mktemp("jitter-json")
    common = ["--tokens", PROMPT, "--generate", "8", "--variants", VARIANTS]
    assert main(["jitter", str(tie_path), *common, "--json", str(out / "j.json")]) == 0
    assert main(["epsilon", str(tie_path), *common, "--eps", EPS,
                 "--json", str(out / "e.json")]) == 0
    return (json.loads((out / "j.json").read_text()), json.loads((out / "e.json").read_text()))


@pytest.fixture
def lab(qtbot, tie_path: Path) -> QtJitterLab:
    w = QtJitterLab()
    qtbot.addWidget(w)
    w.set_model(Model.open(tie_path))
    w.prompt.setText(PROMPT)
    w.generate.setValue(8)
    w.variants.setText(VARIANTS)
    w.eps.setText(EPS)
    yield w
    w.shutdown()


def _run(qtbot, lab: QtJitterLab, kind: str) -> None:
    with qtbot.waitSignal(lab.sig_report_ready, timeout=60000) as blocker:
        lab.start(kind)
    assert blocker.args == [kind]


def test_views_show_the_cli_numbers(qtbot, lab: QtJitterLab, cli_reports: tuple[dict, dict]
                                    ) -> None:
    jd, ed = cli_reports
    _run(qtbot, lab, "jitter")
    _run(qtbot, lab, "epsilon")
    # the worker's reports are the CLI's, byte for byte
    assert report_json(lab.jitter_report) == json.dumps(jd, sort_keys=True,
                                                        separators=(",", ":")).encode()
    assert report_json(lab.epsilon_report) == json.dumps(ed, sort_keys=True,
                                                         separators=(",", ":")).encode()
    assert np.array_equal(lab.heatmap.values(), np.asarray(jd["cell_flip_rate"]))
    assert np.array_equal(lab.margins.values(), np.asarray(jd["margin_ulps"]))
    counts = np.sum([np.asarray(jd["flips"][n]) for n in jd["variants"]], axis=0)
    assert np.array_equal(lab.scatter.points()[:, 1], counts.ravel())
    assert lab.scatter.bins() == jd["flips_vs_margin"]
    assert lab.curve.curve() == ed["curve"]
    assert lab.curve.recommended() == ed["recommended"]["eps"]


def test_run_all_three_fills_every_view_with_the_cli_reports(qtbot, lab: QtJitterLab,
                                                             cli_reports: tuple[dict, dict],
                                                             tie_path: Path,
                                                             tmp_path: Path) -> None:
    """One click makes the jitter report, the sweep and the remedies (their passes shared):
    each is the report its own CLI command writes, and every tab shows it."""
    jd, ed = cli_reports
    out = tmp_path / "remedies.json"
    assert main(["remedies", str(tie_path), "--tokens", PROMPT, "--generate", "8",
                 "--variants", VARIANTS, "--json", str(out)]) == 0
    with qtbot.waitSignal(lab.sig_report_ready, timeout=60000) as blocker:
        lab.run_all_button.click()
    assert blocker.args == ["all"]
    for report, want in ((lab.jitter_report, jd), (lab.epsilon_report, ed),
                         (lab.remedy_report, json.loads(out.read_text()))):
        assert report_json(report) == json.dumps(want, sort_keys=True,
                                                 separators=(",", ":")).encode()
    assert np.array_equal(lab.heatmap.values(), np.asarray(jd["cell_flip_rate"]))
    assert lab.curve.curve() == ed["curve"]
    assert len(lab.remedies.rows()) == len(lab.remedy_report.rows)
    assert lab.status.text().count(" | ") == 2 and lab.run_all_button.isEnabled()


def test_clicking_a_cell_opens_the_token_view(qtbot, lab: QtJitterLab,
                                              cli_reports: tuple[dict, dict]) -> None:
    jd, _ = cli_reports
    _run(qtbot, lab, "jitter")
    lab.heatmap.sig_cell_selected.emit(2, TIE_LAYER)
    assert lab.tabs.currentWidget() is lab.token
    shown = lab.token.table_values()
    assert list(shown) == [BASELINE, *jd["variants"]]
    for name, logits in shown.items():
        expected = np.asarray(jd["router_logits"][name][2][TIE_LAYER], dtype=np.float32)
        assert np.array_equal(np.asarray(logits, dtype=np.float32), expected)


def test_ab_view_marks_the_first_divergence(qtbot, lab: QtJitterLab,
                                            cli_reports: tuple[dict, dict]) -> None:
    jd, ed = cli_reports
    lab.set_reports(JitterReport.from_dict(jd), EpsilonReport.from_dict(ed))
    for name in jd["variants"]:
        lab.ab.set_pair(BASELINE, name)
        assert lab.ab.first_divergence() == jd["downstream"][name]["first_expert_divergence"]
    lab.ab.set_pair(BASELINE, "stable eps=1e-05")
    bias = ed["rows"][-1]["bias_cells"]
    assert lab.ab.first_divergence() == (min(p for p, _ in bias) if bias else None)


def test_cancel_and_state_round_trip(qtbot, lab: QtJitterLab, tmp_path: Path,
                                     cli_reports: tuple[dict, dict]) -> None:
    jd, ed = cli_reports
    lab.variants.setText("")  # the full default list: long enough to cancel
    with qtbot.waitSignal(lab.runner.sig_cancelled, timeout=60000):
        lab.start("epsilon")
        lab.cancel()
    assert lab.status.text() == "cancelled" and lab.run_jitter_button.isEnabled()
    lab.set_reports(JitterReport.from_dict(jd), EpsilonReport.from_dict(ed))
    lab.save_json(str(tmp_path / "lab.json"))
    other = QtJitterLab()
    qtbot.addWidget(other)
    other.load_json(str(tmp_path / "lab.json"))
    assert other.state() == lab.state()


DEMO = Path(__file__).resolve().parents[2] / "resources" / "demo" / "demo.colibri"
DEMO_PROMPT = "def read_header(self, data):"
DEMO_VARIANTS = "seq,blocked16+fma,seq+split4,act-bf16,w-bf16,noise4"


def test_on_the_demo_model_the_cli_and_the_lab_agree(qtbot, tmp_path: Path) -> None:
    out = tmp_path / "demo-jitter.json"
    assert main(["jitter", str(DEMO), "--prompt", DEMO_PROMPT, "--generate", "12",
                 "--variants", DEMO_VARIANTS, "--json", str(out)]) == 0
    cli = json.loads(out.read_text())
    w = QtJitterLab()
    qtbot.addWidget(w)
    w.set_model(Model.open(DEMO))
    w.prompt.setText(DEMO_PROMPT)
    w.generate.setValue(12)
    w.variants.setText(DEMO_VARIANTS)
    try:
        _run(qtbot, w, "jitter")
        assert report_json(w.jitter_report) == json.dumps(cli, sort_keys=True,
                                                          separators=(",", ":")).encode()
        assert np.array_equal(w.heatmap.values(), np.asarray(cli["cell_flip_rate"]))
        assert np.array_equal(w.margins.values(), np.asarray(cli["margin_ulps"]))
        assert w.scatter.bins() == cli["flips_vs_margin"]
    finally:
        w.shutdown()


def test_token_view_shows_what_the_choice_ranked(qtbot, tmp_path: Path) -> None:
    """On a DeepSeek-V3-style rule the token view's table holds the selection scores (sigmoid +
    correction bias), where the two tied experts read the same, not the router logits."""
    from colibri.jitter import Runner, analyze_jitter
    from jitter_models import make_selection_tie_model

    tokens = [3, 4, 5, 6, 7, 8, 9, 10]
    path, (a, b) = make_selection_tie_model(tmp_path, tokens, 3)
    with Runner.open(path) as runner:
        report = analyze_jitter(runner, tokens, "seq,act-bf16")
    view = QtJitterLab()
    qtbot.addWidget(view)
    try:
        view.set_reports(report, None)
        view.select_cell(3, 0)
        shown = view.token.table_values()
        for name, values in shown.items():
            np.testing.assert_array_equal(np.asarray(values, dtype=np.float32),
                                          report.selection_scores[name][3, 0])
        assert shown[BASELINE][a] == shown[BASELINE][b]
        assert "margin 0 ULP" in view.token.title.text()
    finally:
        view.shutdown()


def test_the_remedies_tab_shows_the_cli_numbers(qtbot, tmp_path: Path) -> None:
    """Compare remedies from the lab on the demo model: the same report as `colibri remedies
    --json`, its rows in the table, and the report saved and loaded with the lab's state."""
    out = tmp_path / "remedies.json"
    assert main(["remedies", str(DEMO), "--prompt", DEMO_PROMPT, "--generate", "8",
                 "--variants", "seq,noise4", "--eps", "1e-6", "--cache-threshold", "0.05,0.5",
                 "--expert-cache", "4", "--json", str(out)]) == 0
    cli = json.loads(out.read_text())
    w = QtJitterLab()
    qtbot.addWidget(w)
    w.set_model(Model.open(DEMO))
    w.prompt.setText(DEMO_PROMPT)
    w.generate.setValue(8)
    w.variants.setText("seq,noise4")
    w.remedy_eps.setText("1e-6")
    w.thresholds.setText("0.05,0.5")
    w.expert_cache.setValue(4)
    try:
        with qtbot.waitSignal(w.sig_report_ready, timeout=60000) as blocker:
            w.run_remedies_button.click()
        assert blocker.args == ["remedies"]
        assert report_json(w.remedy_report) == json.dumps(cli, sort_keys=True,
                                                          separators=(",", ":")).encode()
        shown = w.remedies.rows()
        assert [r["remedy"] for r in shown] == [r["label"] for r in cli["rows"]]
        for row, want in zip(shown, cli["rows"]):
            assert row["decisions changed"] == want["changed"]
            assert row["jitter left"] == want["jitter_left"]
            assert row["flips removed"] == want["flips_removed"]
            assert row["hit rate"] == want["hit_rate"]
        table = w.remedies.table
        assert table.rowCount() == 5 and table.verticalHeaderItem(2).text() == "soft routing"
        assert table.item(2, w.remedies.COLUMNS.index("hit rate")).text() == "-"
        w.save_json(str(tmp_path / "lab.json"))
        other = QtJitterLab()
        qtbot.addWidget(other)
        other.load_json(str(tmp_path / "lab.json"))
        assert other.state() == w.state() and other.remedies.rows() == shown
        other.load_json(str(out))
        assert other.remedies.rows() == shown
        w.thresholds.setText("x")
        w.start("remedies")
        assert "comma-separated cache thresholds" in w.status.text()
    finally:
        w.shutdown()


def test_loading_a_file_that_is_not_a_report_is_told_not_raised(qtbot, lab: QtJitterLab,
                                                                tmp_path: Path,
                                                                monkeypatch) -> None:
    from colibri.inspector import export
    bad = tmp_path / "not-a-report.json"
    bad.write_text("{\"schema\": ")
    monkeypatch.setattr(export.QFileDialog, "getOpenFileName",
                        lambda *a, **k: (str(bad), export.JSON_FILTER))
    lab.load_button.click()
    assert lab.status.text().startswith(f"cannot load {bad}")
