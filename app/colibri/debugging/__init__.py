"""The routing debugger's Qt-free core: run, step, break on, inspect and export MoE routing.

Layers (each importable without Qt; the Qt panels in `colibri.inspector.debugger` only read them):
  * `run`           - `Debugger` (owns one engine Session and its Generation), `RoutingRecord`,
                      the append-only store of per-position trace copies that every view reads.
                      `RunSettings` (colibri.values) says what a run is.
  * `events`        - the (position, MoE layer) event list with derived fields, find, bookmarks.
  * `anatomy`       - one decision expert by expert through its rule (logit, score, bias,
                      selection score, group, rank, weight) and whether the bias changed it.
  * `breakpoints`   - breakpoint kinds, their actions and `BreakpointList.first_hit`.
  * `counterfactual` - a run under interventions beside the same run without them.
  * `stats`         - routing matrices, expert load and balance, co-selection, expert-cache hit
                      rate, latency percentiles.
  * `trace_export`  - Chrome Trace Event JSON (ui.perfetto.dev, chrome://tracing) and CSV.
  * `session_file`  - the saved debugging session format (docs/session-format.md) and autosave.

Nothing here recomputes routing: every number comes from the engine's trace.
"""

from __future__ import annotations

from colibri.debugging.anatomy import Anatomy, RuleBook, anatomy
from colibri.debugging.breakpoints import (AtPosition, BiasChanged, Breakpoint, BreakpointList,
                                           CacheKept, CacheMiss, ExpertChosen, MarginBelow,
                                           NonFinite, first_hit)
from colibri.debugging.counterfactual import Counterfactual, RunImage, rerun
from colibri.debugging.events import Event, EventList, float32_ulp_distance
from colibri.debugging.run import Debugger, PositionRecord, RoutingRecord, RunResult
from colibri.values import RunSettings

__all__ = ["Anatomy", "AtPosition", "BiasChanged", "Breakpoint", "BreakpointList", "CacheKept",
           "CacheMiss", "Counterfactual", "Debugger", "Event", "EventList", "ExpertChosen",
           "MarginBelow", "NonFinite", "PositionRecord", "RoutingRecord", "RuleBook", "RunImage",
           "RunResult", "RunSettings", "anatomy", "first_hit", "float32_ulp_distance", "rerun"]
