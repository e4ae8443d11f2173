"""Chrome Trace Event export, CSV export, stats and the `colibri trace` command."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from colibri.cli import main
from colibri.debugging import Debugger, RunSettings
from colibri.debugging.session_file import load_session
from colibri.debugging.stats import (LatencySeries, co_selection, expert_load, load_balance,
                                     routing_matrix)
from colibri.debugging.trace_export import (CSV_COLUMNS, check_trace_events, chrome_trace,
                                            write_chrome_trace, write_routing_csv)
from colibri.engine import Model
from colibri.interventions import Intervention

from dbg_helpers import PROMPT


def _run(model: Model, n: int = 6) -> Debugger:
    dbg = Debugger(model, RunSettings(PROMPT, n))
    dbg.run()
    return dbg


def _nests(slices: list[dict]) -> bool:
    """Independent check: sorted by start, each slice lies inside or after the previous ones."""
    spans = sorted((round(s["ts"] * 1000), -round(s["dur"] * 1000)) for s in slices)
    stack: list[int] = []
    for start, neg in spans:
        end = start - neg
        while stack and stack[-1] <= start:
            stack.pop()
        if stack and end > stack[-1]:
            return False
        stack.append(end)
    return True


def test_chrome_trace_follows_the_format(model: Model, tmp_path: Path) -> None:
    dbg = _run(model)
    out = tmp_path / "trace.json"
    write_chrome_trace(out, dbg.events, dbg.settings, other={"model_name": "tiny"})
    doc = json.loads(out.read_text())
    assert set(doc) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert doc["displayTimeUnit"] == "ns"
    assert check_trace_events(doc) == []
    events = doc["traceEvents"]
    for e in events:
        assert {"name", "ph", "ts", "pid", "tid"} <= set(e)
        if e["ph"] == "X":
            assert e["dur"] >= 0
    names = {(e["name"], e["args"]["name"]) for e in events if e["ph"] == "M" and "name" in
             e.get("args", {})}
    assert ("thread_name", "prefill") in names and ("thread_name", "decode") in names
    assert ("process_name", "colibri tiny") in names
    P, L = dbg.position, model.hparams.n_layers
    tokens = [e for e in events if e.get("cat") == "token"]
    assert len(tokens) == P
    assert tokens[0]["name"] == "token 0 'the'"
    assert [e["tid"] for e in tokens] == [1] * len(PROMPT) + [2] * (P - len(PROMPT))
    assert len([e for e in events if e.get("cat") == "layer"]) == P * L
    routers = [e for e in events if e["name"] == "router"]
    assert len(routers) == P * dbg.record.n_moe_layers
    for e in routers:
        a = e["args"]
        ev = dbg.events[dbg.events.index_of(a["position"], a["moe_index"])]
        assert a["experts"] == list(ev.expert_ids) and a["weights"] == list(ev.expert_weights)
        assert a["margin"] == ev.margin and a["margin_ulps"] == ev.margin_ulps
        assert a["layer"] == ev.layer
    assert len([e for e in events if e["ph"] == "C"]) == P
    for tid in (1, 2):
        assert _nests([e for e in events if e["ph"] == "X" and e["tid"] == tid])
    # every phase slice lies inside its layer, every layer inside its token
    for tok in tokens:
        t0, t1 = tok["ts"], tok["ts"] + tok["dur"]
        inner = [e for e in events if e["ph"] == "X" and e.get("cat") in ("layer", "phase")
                 and e["args" if "args" in e else "name"] is not None and e["tid"] == tok["tid"]
                 and t0 <= e["ts"] < t1]
        assert len(inner) >= L
    assert doc["otherData"]["settings"]["prompt_tokens"] == list(PROMPT)


def test_checker_catches_partial_overlap_and_missing_fields() -> None:
    bad = {"traceEvents": [
        {"name": "a", "ph": "X", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"name": "b", "ph": "X", "ts": 5, "dur": 10, "pid": 1, "tid": 1},
        {"name": "c", "ph": "X", "ts": 0, "pid": 1, "tid": 2},
        {"name": "d", "ph": "i", "pid": 1, "tid": 1},
    ]}
    problems = check_trace_events(bad)
    assert any("overlaps" in p for p in problems)
    assert any("X without" in p for p in problems)
    assert any("missing 'ts'" in p for p in problems)


def test_routing_csv(model: Model, tmp_path: Path) -> None:
    dbg = _run(model)
    out = tmp_path / "routing.csv"
    n = write_routing_csv(out, dbg.events)
    with out.open(newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == CSV_COLUMNS
    rec = dbg.record
    assert n == len(rows) - 1 == dbg.position * rec.n_moe_layers * rec.k
    for row in rows[1:]:
        p, layer, rank, expert = int(row[0]), int(row[3]), int(row[4]), int(row[5])
        m = list(rec.moe_layers).index(layer)
        assert rec.expert_ids[p, m, rank] == expert
        assert np.float32(float(row[6])) == rec.expert_weights[p, m, rank]
        assert np.float32(float(row[7])) == rec.router_logits[p, m, expert]
        assert row[2] == rec.token_text(p)


def test_stats(model: Model) -> None:
    dbg = _run(model, 8)
    rec = dbg.record
    P, M, k, E = rec.n_positions, rec.n_moe_layers, rec.k, rec.n_experts
    rm = routing_matrix(rec)
    assert rm.shape == (P, M) and np.array_equal(rm.top1, rec.expert_ids[:, :, 0])
    assert "pos 0 'the'" in rm.hover(0, 0)
    load = expert_load(rec)
    assert load.shape == (M, E) and (load.sum(axis=1) == P * k).all()
    ratio, cv = load_balance(load)
    assert (ratio >= 1).all() and (ratio <= E / k).all() and (cv >= 0).all()
    even, _ = load_balance(np.full((1, E), 3))
    assert even[0] == 1.0
    co = co_selection(rec)
    assert co.shape == (M, E, E) and np.array_equal(np.diagonal(co, axis1=1, axis2=2), load)
    assert np.array_equal(co, co.transpose(0, 2, 1))
    lat = LatencySeries(rec)
    pc = lat.percentiles()
    assert pc["p50"] <= pc["p95"] <= pc["p99"]
    assert lat.rolling_percentiles(4).shape == (P, 3)
    assert lat.tokens_per_second() > 0 and lat.tokens_per_second(window=3, wall=True) > 0
    assert lat.per_layer_phases(0).shape == (model.hparams.n_layers, 4)


def test_latency_keeps_the_prompts_prefill_apart(model: Model) -> None:
    """The prompt's positions share their pieces' time, so the windows after it leave them out
    and the prefill's rate is its own figure."""
    dbg = _run(model, 8)
    rec, n_prompt = dbg.record, len(PROMPT)
    lat = LatencySeries(rec, n_prompt)
    generated = rec.token_ns[n_prompt:].astype(np.float64)
    assert lat.decode_start == n_prompt
    assert lat.percentiles()["p50"] == np.percentile(generated, 50)
    assert lat.tokens_per_second() == generated.size * 1e9 / generated.sum()
    prompt = rec.token_ns[:n_prompt].astype(np.float64)
    assert lat.prompt_tokens_per_second() == n_prompt * 1e9 / prompt.sum()
    whole = LatencySeries(rec)
    assert whole.decode_start == 0 and whole.tokens_per_second() == rec.n_positions * 1e9 / float(
        rec.token_ns.astype(np.float64).sum())
    only_prompt = Debugger(model, RunSettings(PROMPT, 8))
    only_prompt.run(max_positions=len(PROMPT))
    # before any generated position the windows are of the prompt's
    assert LatencySeries(only_prompt.record, n_prompt).decode_start == 0


def test_cli_trace_records_the_numerics_it_ran(model_path: Path, tmp_path: Path) -> None:
    """An opt-in numerics mode (dot-bf16) is an explicit choice the trace records in its
    settings, and a saved session reruns with it; without one the trace says 'default'."""
    from colibri.debugging.session_file import load_session

    out, sess = tmp_path / "t.json", tmp_path / "s.colibri-session"
    assert main(["trace", str(model_path), "--tokens", "3,4", "-n", "2", "--numerics", "dot-bf16",
                 "--out", str(out), "--session", str(sess)]) == 0
    assert json.loads(out.read_text())["otherData"]["settings"]["numerics"] == "dot-bf16"
    assert load_session(sess).settings.numerics == "dot-bf16"
    assert main(["trace", str(model_path), "--tokens", "3,4", "-n", "2", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["otherData"]["settings"]["numerics"] == "default"


def test_cli_trace(model_path: Path, tmp_path: Path, capsys) -> None:
    out, csv_out, sess = tmp_path / "t.json", tmp_path / "r.csv", tmp_path / "s.colibri-session"
    code = main(["trace", str(model_path), "--prompt", "the cat sat on", "-n", "3",
                 "--routing", "stable", "--epsilon", "1e-4", "--threads", "2", "--out", str(out),
                 "--csv", str(csv_out), "--session", str(sess)])
    assert code == 0
    assert "wrote" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert check_trace_events(doc) == []
    assert doc["otherData"]["settings"]["routing"] == "stable"
    assert doc["otherData"]["settings"]["epsilon"] == 1e-4
    assert len([e for e in doc["traceEvents"] if e.get("cat") == "token"]) == 4 + 2
    assert csv_out.exists() and sess.exists()
    assert main(["trace", str(tmp_path / "missing.colibri"), "--prompt", "x",
                 "--out", str(out)]) == 2
    assert main(["trace", str(model_path), "--tokens", "3,4", "-n", "1000",
                 "--out", str(tmp_path / "x.json")]) == 1
    assert "max_context" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_cli_trace_under_an_intervention_from_embedding_rows(model: Model, model_path: Path,
                                                             tmp_path: Path, capsys) -> None:
    """`colibri trace --embedding X.npy --intervene SPEC`: the router slice and the CSV name the
    kind that acted, the session keeps the interventions and the rows, and its record is the
    debugger's run of those settings."""
    rows = np.ascontiguousarray(model.tensor_f32("token_embd")[[3, 4, 5, 6, 7]])
    np.save(tmp_path / "x.npy", rows)
    out, csv_out, sess = tmp_path / "t.json", tmp_path / "r.csv", tmp_path / "s.colibri-session"
    spec = "force:pos=3,layer=2,experts=5+6"
    code = main(["trace", str(model_path), "--embedding", str(tmp_path / "x.npy"), "-n", "3",
                 "--intervene", spec, "--out", str(out), "--csv", str(csv_out),
                 "--session", str(sess)])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    routers = [e["args"] for e in doc["traceEvents"] if e.get("name") == "router"]
    acted = [a for a in routers if "interventions" in a]
    assert [(a["position"], a["layer"], a["interventions"]) for a in acted] == [(3, 2, ["force"])]
    with csv_out.open() as f:
        table = list(csv.DictReader(f))
    assert {(r["position"], r["layer"]) for r in table if r["interventions"]} == {("3", "2")}
    assert {r["text"] for r in table if r["position"] == "0"} == {"<embedding>"}
    saved = load_session(sess)
    assert saved.settings.interventions == (Intervention.parse(spec),)
    assert saved.settings.prompt_embeddings.tobytes() == rows.tobytes()
    dbg = Debugger(model, saved.settings)
    dbg.run()
    assert dbg.record.equals(saved.record, timings=False)
    dbg.close()
    code = main(["trace", str(model_path), "--tokens", "3,4", "--intervene",
                 "force:pos=1,layer=1,experts=5", "--out", str(tmp_path / "y.json")])
    assert code == 1 and "layer: layer 1 is dense" in capsys.readouterr().err
    assert not (tmp_path / "y.json").exists()
