"""Expert caching under the debugger: the record holds the engine's cached-routing and LRU arrays,
events and anatomies show them, breakpoints stop on a kept set or a cache miss, the hit rate is
the session's, sessions save and reopen them (older files read as runs without caching), and the
Qt panel runs it from its form and shows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from colibri.debugging import CacheKept, CacheMiss, Debugger, RunSettings, anatomy
from colibri.debugging.session_file import load_session, save_session
from colibri.debugging.stats import cache_summary
from colibri.debugging.trace_export import CSV_COLUMNS, chrome_trace, routing_rows
from colibri.engine import Model, Session

from dbg_helpers import PROMPT, drop_arrays, rewrite_session

CACHED = dict(routing="cached", cache_threshold=0.5, expert_cache=3)
ARRAYS = ("expert_ids", "expert_weights", "cache_kept", "cache_margin", "fresh_ids", "cache_hits")


def cached_debugger(model: Model, n: int = 8) -> Debugger:
    dbg = Debugger(model, RunSettings(PROMPT, n, **CACHED))  # type: ignore[arg-type]
    dbg.run()
    return dbg


def test_the_record_is_the_sessions_trace(moe3_path: Path) -> None:
    with Model.open(moe3_path) as model:
        dbg = cached_debugger(model)
        with Session(model, **CACHED) as s:  # type: ignore[arg-type]
            s.generate(PROMPT, 8)
            trace = s.trace
            stats = s.cache_stats()
        assert trace is not None
        for name in ARRAYS:
            assert dbg.record.array(name).tobytes() == getattr(trace, name).tobytes(), name
        summary = cache_summary(dbg.record)
        assert (summary.hits, summary.lookups) == (stats.hits, stats.hits + stats.misses)
        assert (summary.kept, summary.decisions) == (stats.kept, stats.decisions)
        assert summary.kept > 0 and 0 < summary.hits < summary.lookups
        assert cache_summary(dbg.record, 0).hits == int(trace.cache_hits[:, 0].sum())
        dbg.close()


def test_events_and_anatomy_show_what_caching_did(moe3_path: Path) -> None:
    with Model.open(moe3_path) as model:
        dbg = cached_debugger(model)
        kept = next(e for e in dbg.events if e.cache_kept)
        assert set(kept.fresh_ids) != set(kept.expert_ids)
        assert kept.cache_margin < 0.5
        a = anatomy(kept)
        assert a.cache_kept and a.fresh_rank is not None and a.resident is not None
        assert [int(a.fresh_rank[e]) for e in kept.fresh_ids] == [1, 2]
        assert [bool(a.resident[e]) for e in kept.expert_ids] == list(kept.cache_hits)
        first = dbg.events[0]
        assert np.isnan(first.cache_margin) and first.cache_hits == (False, False)
        dbg.close()


@pytest.mark.parametrize("breakpoint, column", [(CacheKept(), "cache_kept"),
                                               (CacheMiss(), "cache_miss")])
def test_breakpoints_stop_on_a_kept_set_and_a_miss(moe3_path: Path, breakpoint: object,
                                                   column: str) -> None:
    with Model.open(moe3_path) as model:
        full = cached_debugger(model)
        rec = full.record
        misses = ((rec.expert_ids >= 0) & ~rec.cache_hits).any(axis=2)
        mask = rec.cache_kept if column == "cache_kept" else misses
        want = [int(i) for i in np.flatnonzero(np.asarray(mask).reshape(-1))]
        assert len(want) >= 2
        dbg = Debugger(model, RunSettings(PROMPT, 8, **CACHED))  # type: ignore[arg-type]
        dbg.breakpoints.add(breakpoint)  # type: ignore[arg-type]
        stops = []
        while True:
            result = dbg.continue_()
            if result.reason != "breakpoint":
                break
            stops.append(result.event.index)
        assert stops == want
        dbg.close()
        full.close()


def test_no_cache_breakpoint_hits_a_run_without_caching(moe3_path: Path) -> None:
    with Model.open(moe3_path) as model:
        dbg = Debugger(model, RunSettings(PROMPT, 4))
        dbg.breakpoints.add(CacheKept())
        dbg.breakpoints.add(CacheMiss(layer=0))
        assert dbg.continue_().reason == "finished"
        assert cache_summary(dbg.record).describe() == ""
        dbg.close()


def test_sessions_save_caching_and_old_files_read_without(moe3_path: Path,
                                                         tmp_path: Path) -> None:
    with Model.open(moe3_path) as model:
        dbg = cached_debugger(model, 5)
        path = tmp_path / "cached.colibri-session"
        save_session(path, dbg)
        loaded = load_session(path)
        assert loaded.settings.cache_threshold == 0.5 and loaded.settings.expert_cache == 3
        for name in ARRAYS:
            assert loaded.record.array(name).tobytes() == dbg.record.array(name).tobytes(), name
        ev, want = loaded.events()[7], dbg.events[7]
        assert (ev.expert_ids, ev.cache_kept, ev.fresh_ids, ev.cache_hits) == (
            want.expert_ids, want.cache_kept, want.fresh_ids, want.cache_hits)
        # a file from before expert caching: no such arrays, no such settings
        def before_caching(manifest: dict[str, Any], members: dict[str, bytes]) -> None:
            drop_arrays(manifest, members, "cache_kept", "cache_margin", "fresh_ids",
                        "cache_hits")
            for key in ("cache_threshold", "expert_cache"):
                del manifest["settings"][key]
            manifest["settings"]["routing"] = "topk"

        before = load_session(rewrite_session(path, tmp_path / "old.colibri-session",
                                              before_caching))
        assert before.settings.expert_cache == 0 and before.settings.cache_threshold == 0.0
        assert not before.record.cache_kept.any() and before.record.cache_hits.shape[2] == 0
        assert np.isnan(before.record.cache_margin).all()
        assert before.events()[3].cache_hits == () and not before.events()[3].cache_kept
        dbg.close()


def test_exports_carry_the_caching_fields(moe3_path: Path) -> None:
    with Model.open(moe3_path) as model:
        dbg = cached_debugger(model, 4)
        doc = chrome_trace(dbg.events, dbg.settings)
        routers = [e["args"] for e in doc["traceEvents"]
                   if e.get("name") == "router" and "args" in e]
        assert len(routers) == len(dbg.events)
        for args, event in zip(routers, dbg.events):
            assert args["cache_kept"] == event.cache_kept
            assert args["fresh_experts"] == list(event.fresh_ids)
            assert args["cache_hits"] == list(event.cache_hits)
        kept, hit = CSV_COLUMNS.index("cache_kept"), CSV_COLUMNS.index("cache_hit")
        rows = list(routing_rows(dbg.events))
        assert {r[kept] for r in rows} == {0, 1} and {r[hit] for r in rows} == {0, 1}
        plain = Debugger(model, RunSettings(PROMPT, 2))
        plain.run()
        assert {(r[kept], r[hit]) for r in routing_rows(plain.events)} == {("", "")}
        plain.close()
        dbg.close()
