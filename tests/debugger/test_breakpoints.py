"""Each breakpoint kind stops at exactly the event a plain run's trace says it should."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from colibri.debugging import (AtPosition, BreakpointList, Debugger, ExpertChosen, MarginBelow,
                               NonFinite, RunSettings)
from colibri.engine import Model

from dbg_helpers import PROMPT, reference_run

N_NEW = 10


def _first(mask: np.ndarray) -> tuple[int, int] | None:
    hits = np.argwhere(mask)
    return (int(hits[0][0]), int(hits[0][1])) if len(hits) else None


def _run_to(model: Model, bp, n_new: int = N_NEW):
    dbg = Debugger(model, RunSettings(PROMPT, n_new))
    dbg.breakpoints.add(bp)
    result = dbg.continue_()
    return dbg, result


def test_expert_chosen_stops_at_first_selection_at_that_layer(model: Model) -> None:
    ref, _ = reference_run(model, PROMPT, N_NEW)
    # a target that first appears late: the (expert, layer) whose first selection is latest
    best = None
    for m, layer in enumerate(ref.moe_layers):
        for expert in range(model.hparams.n_experts):
            first = _first((ref.expert_ids[:, m, :] == expert).any(axis=1)[:, None])
            if first and (best is None or first[0] > best[0]):
                best = (first[0], m, int(layer), expert)
    assert best is not None and best[0] > 0
    position, m, layer, expert = best
    dbg, result = _run_to(model, ExpertChosen(expert=expert, layer=layer))
    assert result.reason == "breakpoint"
    assert result.event.key == (position, m) and dbg.current.key == (position, m)
    assert expert in result.event.expert_ids
    # the engine computed the position containing the hit and no further
    assert dbg.position == position + 1


def test_margin_below_stops_at_first_small_margin(model: Model) -> None:
    ref, _ = reference_run(model, PROMPT, N_NEW)
    s = -np.sort(-ref.router_logits, axis=2)
    margin = (s[:, :, 1] - s[:, :, 2]).astype(np.float32)  # top-2: k-th minus (k+1)-th
    threshold = float(np.median(margin))
    expected = _first(margin < np.float32(threshold))
    dbg, result = _run_to(model, MarginBelow(threshold=threshold))
    assert result.event.key == expected
    assert result.event.margin < threshold
    # restricted to one layer
    layer1 = int(ref.moe_layers[1])
    mask = np.zeros_like(margin, bool)
    mask[:, 1] = margin[:, 1] < np.float32(threshold)
    dbg, result = _run_to(model, MarginBelow(threshold=threshold, layer=layer1))
    assert result.event.key == _first(mask)


def test_at_position_stops_at_its_first_moe_layer(model: Model) -> None:
    dbg, result = _run_to(model, AtPosition(7))
    assert result.event.key == (7, 0) and dbg.position == 8


def test_continue_stops_twice_inside_one_position(model: Model) -> None:
    ref, _ = reference_run(model, PROMPT, N_NEW)
    e0, e1 = int(ref.expert_ids[4, 0, 0]), int(ref.expert_ids[4, 1, 0])
    dbg = Debugger(model, RunSettings(PROMPT, N_NEW))
    dbg.breakpoints.add(AtPosition(4))
    dbg.breakpoints.add(ExpertChosen(e1, layer=int(ref.moe_layers[1])))
    hits = []
    while True:
        r = dbg.continue_()
        if r.reason != "breakpoint":
            break
        hits.append(r.event.key)
    expected = sorted({(4, 0)} | {(int(p), 1) for p in
                                  np.flatnonzero((ref.expert_ids[:, 1] == e1).any(axis=1))})
    assert hits == expected
    assert e0 >= 0


def test_disabled_breakpoints_do_not_hit(model: Model) -> None:
    dbg = Debugger(model, RunSettings(PROMPT, 4))
    i = dbg.breakpoints.add(AtPosition(2))
    dbg.breakpoints.toggle(i)
    assert not dbg.breakpoints[i].enabled
    assert dbg.continue_().reason == "finished"
    assert AtPosition(2).first_hit(dbg.events).key == (2, 0)


def test_breakpoint_list_round_trip() -> None:
    bl = BreakpointList([ExpertChosen(3, 2), MarginBelow(0.5), NonFinite(enabled=False),
                         AtPosition(9)])
    assert BreakpointList.from_list(bl.to_list()) == bl
    with pytest.raises(ValueError, match="unknown breakpoint kind"):
        BreakpointList.from_list([{"kind": "bogus"}])


def test_nonfinite_stops_where_nan_first_appears(moe3_path: Path, tmp_path: Path) -> None:
    """Set one expert's down-projection at MoE layer 1 to +Inf: the first position that routes
    there overflows; the breakpoint must stop at the first event whose router logits or hidden
    norm (or, for the last layer, the output logits) are not finite."""
    image = bytearray(moe3_path.read_bytes())
    with Model.open(moe3_path) as clean:
        ref, _ = reference_run(clean, PROMPT, N_NEW)
        info = clean.tensor_info("layers.1.moe_w2")
    # the expert layer 1 chooses first at a later position
    counts = [int((ref.expert_ids[:, 1, :] == e).any(axis=1).argmax()) for e in range(8)]
    expert = int(np.argmax(counts))
    per_expert = info.nbytes // 8
    start = info.offset + expert * per_expert
    image[start:start + per_expert] = np.full(per_expert // 4, np.inf, np.float32).tobytes()
    broken = tmp_path / "overflow.colibri"
    broken.write_bytes(bytes(image))
    with Model.open(broken) as model:
        bad, _ = reference_run(model, PROMPT, N_NEW)
        nonfinite = ~np.isfinite(bad.router_logits).all(axis=2) | ~np.isfinite(bad.hidden_norm)
        expected = _first(nonfinite)
        assert expected is not None and expected[0] > 0, "the crafted model must go non-finite"
        dbg, result = _run_to(model, NonFinite())
        assert result.reason == "breakpoint"
        # NaN first shows in the router input of the MoE layer after the broken expert's layer
        assert result.event.key == expected
        assert expected[1] == 2 and dbg.position == expected[0] + 1
        assert result.event.nonfinite
        earlier = [e for e in dbg.events if e.index < result.event.index]
        assert not any(e.nonfinite for e in earlier)
        assert all(np.isfinite(e.router_logits).all() and np.isfinite(e.hidden_norm)
                   for e in earlier)
