"""Running and stepping the engine under the debugger.

`Debugger` owns one traced `colibri.Session` and the `colibri.generation.Generation` running on
it, advanced one position at a time (the prompt's tokens too): the same positions and tokens as
`colibri run` (len(prompt) + max_new_tokens - 1). After every position the new trace rows are
copied into the `RoutingRecord`, an append-only store that is the single source of truth for
every view and export; nothing recomputes routing.

Granularity. The engine computes whole positions (style point 7: pulled trace, no per-layer
callbacks into Python). "Step layer" is therefore navigation through events already computed:
the first layer step of a new position computes that whole position and puts the cursor on its
first MoE layer; each further layer step moves the cursor to the next MoE layer of the same
position, whose "hidden state arriving at the router" is reported as the trace's `hidden_norm`
(the L2 norm of the router's input). Stepping past the last MoE layer computes the next position.
Run-to-breakpoint likewise computes the position containing the hit, then places the cursor on
exactly the hit (position, layer); Continue first checks the events already computed after the
cursor, so two hits in one position stop twice.

Threads. `run()` is meant for one worker thread; `request_pause()` and `request_stop()` may be
called from any thread and are checked between positions. Pausing loses nothing and resuming
gives bit-identical results (the sampler's state lives in the generation). Stopping ends the
run; everything produced so far stays in the record.

Decoding is the generation's (greedy or sampled, colibri.generation); the same `seed` seeds the
sampler and Gumbel routing. Decoding stops after max_new_tokens or the model's eos token.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from colibri.debugging.breakpoints import Breakpoint, BreakpointList, first_hit
from colibri.debugging.events import Event, EventList
from colibri.margins import group_limits
from colibri import tokens
from colibri.generation import Generation
from colibri.values import RunSettings

PHASES = ("attention", "router", "experts", "combine", "layer")


# ---------------------------------------------------------------------------------------------
# The record


@dataclass(frozen=True, eq=False)
class PositionRecord:
    """One position's trace rows, copied out of session memory (read-only arrays)."""

    position: int
    token: int
    token_text: str
    expert_ids: np.ndarray      # [moe_layers, k] int32, -1 for an empty slot
    expert_weights: np.ndarray  # [moe_layers, k] float32
    router_logits: np.ndarray   # [moe_layers, n_experts] float32
    shared_gate: np.ndarray     # [moe_layers] float32, NaN without a shared-expert gate
    hidden_norm: np.ndarray     # [moe_layers] float32
    phase_ns: np.ndarray        # [n_layers, 5] uint64 durations, see PHASES
    token_ns: int               # engine time of the whole position
    wall_ns: int                # wall time of the step as seen from Python (engine + binding)
    logits_finite: bool         # the position's output logits are all finite
    selection_scores: np.ndarray  # [moe_layers, n_experts] float32, what the choice ranked
    chosen_groups: np.ndarray   # [moe_layers, n_groups] int32 kept groups, -1 none
    bias_changed: np.ndarray    # [moe_layers] bool: the correction bias changed the choice
    cache_kept: np.ndarray      # [moe_layers] bool: cached routing kept the previous experts
    cache_margin: np.ndarray    # [moe_layers] float32: the fresh top-k's margin over them
    fresh_ids: np.ndarray       # [moe_layers, k or 0] int32: the fresh top-k (cached routing)
    cache_hits: np.ndarray      # [moe_layers, k or 0] bool: the slot's expert was resident


# name -> (dtype, trailing shape attribute names); the first axis is always the position
_ARRAYS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "tokens": (np.int32, ()),
    "expert_ids": (np.int32, ("n_moe_layers", "k")),
    "expert_weights": (np.float32, ("n_moe_layers", "k")),
    "router_logits": (np.float32, ("n_moe_layers", "n_experts")),
    "selection_scores": (np.float32, ("n_moe_layers", "n_experts")),
    "chosen_groups": (np.int32, ("n_moe_layers", "n_groups")),
    "bias_changed": (np.bool_, ("n_moe_layers",)),
    "cache_kept": (np.bool_, ("n_moe_layers",)),
    "cache_margin": (np.float32, ("n_moe_layers",)),
    "fresh_ids": (np.int32, ("n_moe_layers", "k_fresh")),
    "cache_hits": (np.bool_, ("n_moe_layers", "k_hits")),
    "shared_gate": (np.float32, ("n_moe_layers",)),
    "hidden_norm": (np.float32, ("n_moe_layers",)),
    "phase_ns": (np.uint64, ("n_layers", "n_phases")),
    "token_ns": (np.uint64, ()),
    "wall_ns": (np.uint64, ()),
    "logits_finite": (np.bool_, ()),
}
RECORD_ARRAYS = tuple(_ARRAYS)
# Arrays older session files do not have, and what they hold there: files from before format
# version 2 come from version-1 models, which select on the router logits with no groups; files
# from before expert caching ran without it (nothing kept, no fresh choice, no LRU).
LATER_ARRAYS = ("selection_scores", "chosen_groups", "bias_changed", "cache_kept",
                "cache_margin", "fresh_ids", "cache_hits")


class RoutingRecord:
    """Append-only per-position copies of the routing trace. Array properties are read-only
    views of the first `n_positions` rows; rows once written never change, so a view (or a
    `snapshot()`) taken on one thread stays valid while another thread appends."""

    n_phases = len(PHASES)

    def __init__(self, moe_layers: Sequence[int], n_layers: int, k: int, n_experts: int,
                 capacity: int = 64, n_groups: int = 0, cached: bool = False,
                 lru: bool = False) -> None:
        self.moe_layers = np.array(moe_layers, dtype=np.int32)
        self.moe_layers.flags.writeable = False
        self.n_moe_layers = int(self.moe_layers.size)
        self.n_layers, self.k, self.n_experts = int(n_layers), int(k), int(n_experts)
        self.n_groups = int(n_groups)  # kept groups per decision (trace n_chosen_groups)
        self.k_fresh = self.k if cached else 0   # fresh_ids' slots: cached routing only
        self.k_hits = self.k if lru else 0       # cache_hits' slots: with an expert cache only
        self._n = 0
        self._texts: list[str] = []
        self._frozen = False
        self._buf = {name: self._alloc(name, max(capacity, 1)) for name in _ARRAYS}
        self._views: dict[str, Any] = {}

    def _alloc(self, name: str, rows: int) -> np.ndarray:
        dtype, inner = _ARRAYS[name]
        return np.zeros((rows, *(getattr(self, a) for a in inner)), dtype=dtype)

    # -- reading --------------------------------------------------------------------------------

    @property
    def n_positions(self) -> int:
        return self._n

    def __len__(self) -> int:
        return self._n

    def array(self, name: str) -> np.ndarray:
        views = self._views
        if views.get("@n") != self._n:  # one read-only view per array per length
            views.clear()
            views["@n"] = self._n
        view = views.get(name)
        if view is None:
            view = self._buf[name][:self._n]
            view.flags.writeable = False
            views[name] = view
        return view

    tokens = property(lambda self: self.array("tokens"))
    expert_ids = property(lambda self: self.array("expert_ids"))
    expert_weights = property(lambda self: self.array("expert_weights"))
    router_logits = property(lambda self: self.array("router_logits"))
    selection_scores = property(lambda self: self.array("selection_scores"))
    chosen_groups = property(lambda self: self.array("chosen_groups"))
    bias_changed = property(lambda self: self.array("bias_changed"))
    cache_kept = property(lambda self: self.array("cache_kept"))
    cache_margin = property(lambda self: self.array("cache_margin"))
    fresh_ids = property(lambda self: self.array("fresh_ids"))
    cache_hits = property(lambda self: self.array("cache_hits"))
    shared_gate = property(lambda self: self.array("shared_gate"))
    hidden_norm = property(lambda self: self.array("hidden_norm"))
    phase_ns = property(lambda self: self.array("phase_ns"))
    token_ns = property(lambda self: self.array("token_ns"))
    wall_ns = property(lambda self: self.array("wall_ns"))
    logits_finite = property(lambda self: self.array("logits_finite"))

    @property
    def token_texts(self) -> list[str]:
        return list(self._texts[:self._n])

    def token_text(self, position: int) -> str:
        return self._texts[position]

    def row(self, p: int) -> PositionRecord:
        if not 0 <= p < self._n:
            raise IndexError(f"position {p} outside [0, {self._n})")
        b = self._buf
        return PositionRecord(p, int(b["tokens"][p]), self._texts[p],
                              *(self.array(n)[p] for n in ("expert_ids", "expert_weights",
                                                           "router_logits", "shared_gate",
                                                           "hidden_norm", "phase_ns")),
                              int(b["token_ns"][p]), int(b["wall_ns"][p]),
                              bool(b["logits_finite"][p]), self.array("selection_scores")[p],
                              self.array("chosen_groups")[p], self.array("bias_changed")[p],
                              *(self.array(n)[p] for n in ("cache_kept", "cache_margin",
                                                           "fresh_ids", "cache_hits")))

    def arrays(self) -> dict[str, np.ndarray]:
        """Every per-position array (read-only views), plus moe_layers."""
        out = {name: self.array(name) for name in _ARRAYS}
        out["moe_layers"] = self.moe_layers
        return out

    def snapshot(self) -> RoutingRecord:
        """An immutable record of the rows so far, sharing memory with this one (O(1) arrays)."""
        snap = RoutingRecord.__new__(RoutingRecord)
        snap.__dict__.update(self.__dict__)
        snap._texts = self._texts[:self._n]
        snap._views = {}
        snap._frozen = True
        return snap

    def equals(self, other: RoutingRecord, timings: bool = True) -> bool:
        """Bit-identical rows (NaNs compared by bits); timings optional."""
        if (self.n_positions, self.n_layers, self.k, self.n_experts, self.n_groups,
                self.k_fresh, self.k_hits) != (
                other.n_positions, other.n_layers, other.k, other.n_experts, other.n_groups,
                other.k_fresh, other.k_hits):
            return False
        if not np.array_equal(self.moe_layers, other.moe_layers) or \
                self.token_texts != other.token_texts:
            return False
        skip = set() if timings else {"phase_ns", "token_ns", "wall_ns"}
        return all(self.array(n).tobytes() == other.array(n).tobytes()
                   for n in _ARRAYS if n not in skip)

    # -- writing --------------------------------------------------------------------------------

    def _grow(self) -> None:
        rows = self._buf["tokens"].shape[0]
        if self._n < rows:
            return
        new = {}
        for name, old in self._buf.items():
            buf = self._alloc(name, rows * 2)
            buf[:rows] = old
            new[name] = buf
        self._buf = new  # old views keep the old buffers alive; rows are identical

    def append(self, token: int, token_text: str, expert_ids: np.ndarray,
               expert_weights: np.ndarray, router_logits: np.ndarray, shared_gate: np.ndarray,
               hidden_norm: np.ndarray, phase_ns: np.ndarray, token_ns: int, wall_ns: int = 0,
               logits_finite: bool = True, *, selection_scores: np.ndarray,
               chosen_groups: np.ndarray, bias_changed: np.ndarray,
               cache_kept: np.ndarray | None = None, cache_margin: np.ndarray | None = None,
               fresh_ids: np.ndarray | None = None, cache_hits: np.ndarray | None = None) -> int:
        """Copy one position's rows in; returns its position. The expert-caching rows default to
        a run without it (nothing kept, NaN margins)."""
        if self._frozen:
            raise RuntimeError("a RoutingRecord snapshot is immutable")
        self._grow()
        p, b = self._n, self._buf
        b["tokens"][p] = token
        b["expert_ids"][p] = expert_ids
        b["expert_weights"][p] = expert_weights
        b["router_logits"][p] = router_logits
        b["selection_scores"][p] = selection_scores
        b["chosen_groups"][p] = chosen_groups
        b["bias_changed"][p] = bias_changed
        b["cache_kept"][p] = False if cache_kept is None else cache_kept
        b["cache_margin"][p] = np.nan if cache_margin is None else cache_margin
        if self.k_fresh:
            b["fresh_ids"][p] = fresh_ids
        if self.k_hits:
            b["cache_hits"][p] = cache_hits
        b["shared_gate"][p] = shared_gate
        b["hidden_norm"][p] = hidden_norm
        b["phase_ns"][p] = phase_ns
        b["token_ns"][p] = token_ns
        b["wall_ns"][p] = wall_ns
        b["logits_finite"][p] = logits_finite
        self._texts.append(token_text)
        self._n = p + 1  # publish the row last
        return p

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], token_texts: Sequence[str],
                    n_layers: int) -> RoutingRecord:
        """Rebuild a record (e.g. from a saved session). Without the LATER_ARRAYS (an older file)
        the selection scores are the router logits and no group is kept, which is what
        version-1 models rank, and the run had no expert caching."""
        ids = arrays["expert_ids"]
        arrays = dict(arrays)
        arrays.setdefault("selection_scores", arrays["router_logits"])
        arrays.setdefault("chosen_groups", np.zeros((*ids.shape[:2], 0), np.int32))
        arrays.setdefault("bias_changed", np.zeros(ids.shape[:2], np.bool_))
        arrays.setdefault("cache_kept", np.zeros(ids.shape[:2], np.bool_))
        arrays.setdefault("cache_margin", np.full(ids.shape[:2], np.nan, np.float32))
        arrays.setdefault("fresh_ids", np.zeros((*ids.shape[:2], 0), np.int32))
        arrays.setdefault("cache_hits", np.zeros((*ids.shape[:2], 0), np.bool_))
        rec = cls(arrays["moe_layers"], n_layers, ids.shape[2], arrays["router_logits"].shape[2],
                  capacity=max(ids.shape[0], 1), n_groups=arrays["chosen_groups"].shape[2],
                  cached=arrays["fresh_ids"].shape[2] > 0, lru=arrays["cache_hits"].shape[2] > 0)
        n = int(ids.shape[0])
        if len(token_texts) != n:
            raise ValueError(f"{len(token_texts)} token texts for {n} positions")
        for name in _ARRAYS:
            rec._buf[name][:n] = arrays[name]
        rec._texts = list(token_texts)
        rec._n = n
        return rec


# ---------------------------------------------------------------------------------------------
# The debugger


@dataclass(frozen=True)
class RunResult:
    """Why `run()` returned: 'breakpoint' (event, breakpoint set), 'finished' (max tokens or
    eos), 'paused', 'stopped', or 'limit' (max_positions reached)."""

    reason: str
    positions: int                          # positions computed by this call
    event: Event | None = None
    breakpoint: Breakpoint | None = field(default=None)


def token_piece(tokenizer: Any, token: int) -> str:
    """The text of `token` (see colibri.tokens.token_text)."""
    return tokens.token_text(tokenizer, token)


class Debugger:
    """A run under the debugger: one Session, its Generation, RoutingRecord and EventList, a
    cursor.

    Not thread-safe except `request_pause`/`request_stop` (see the module docstring)."""

    def __init__(self, model: Any, settings: RunSettings, tokenizer: Any = "model") -> None:
        from colibri.engine import Session  # the only engine dependency of the debugger

        hp = model.hparams
        self.model = model
        self.settings = settings
        self.tokenizer = model.tokenizer if tokenizer == "model" else tokenizer
        # max_context is the run's positions: the engine refuses more than the model's
        self.session = Session(model, routing=settings.routing,  # type: ignore[arg-type]
                               epsilon=settings.epsilon, seed=settings.seed,
                               threads=settings.threads, max_context=settings.n_positions,
                               trace=True, kernels=settings.kernels,
                               cache_threshold=settings.cache_threshold,
                               expert_cache=settings.expert_cache)
        # the path that runs: the last bits of every product (and so near-tie routing) depend on it
        self.kernels = self.session.kernels
        if settings.kernels is not None and self.kernels != settings.kernels:
            self.session.close()
            raise ValueError(f"this machine runs no {settings.kernels} kernels (its best path is "
                             f"{self.kernels})")
        self.generation = Generation(self.session, settings.prompt_tokens,
                                     settings.max_new_tokens, decoding=settings.decoding,
                                     temperature=settings.temperature, seed=settings.seed,
                                     eos=hp.eos_token_id, step_prompt=True)
        trace = self.session.trace
        assert trace is not None
        k = int(trace.expert_ids.shape[2])
        self.record = RoutingRecord(trace.moe_layers, hp.n_layers, k, hp.n_experts,
                                    capacity=settings.n_positions,
                                    n_groups=int(trace.chosen_groups.shape[2]),
                                    cached=trace.fresh_ids.shape[2] > 0,
                                    lru=trace.cache_hits.shape[2] > 0)
        self.events = EventList(self.record, hp.n_experts_active, group_limits(model))
        self.breakpoints = BreakpointList()
        self.cursor: int | None = None
        self._pause = threading.Event()
        self._stop = threading.Event()

    # -- state ----------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Positions computed so far."""
        return self.record.n_positions

    @property
    def n_prompt(self) -> int:
        return len(self.settings.prompt_tokens)

    @property
    def generated(self) -> list[int]:
        return self.generation.generated

    @property
    def finished(self) -> bool:
        return self.generation.finished

    @property
    def stop_reason(self) -> str:
        """'' while running; 'finished', 'eos' or 'stopped' once finished."""
        return self.generation.reason

    @property
    def last_logits(self) -> np.ndarray | None:
        return self.generation.last_logits

    @property
    def current(self) -> Event | None:
        return None if self.cursor is None else self.events[self.cursor]

    def token_text(self, token: int) -> str:
        return token_piece(self.tokenizer, token)

    def prompt_pieces(self) -> list[tuple[int, str]]:
        """The prompt's tokenisation: (id, piece) per token."""
        return [(t, self.token_text(t)) for t in self.settings.prompt_tokens]

    def generated_text(self) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, self.generated))
        return str(self.tokenizer.decode(self.generated))

    def close(self) -> None:
        self.session.close()

    # -- control from other threads ---------------------------------------------------------------

    def request_pause(self) -> None:
        """Pause the current (or, if none is running, the next) run between positions."""
        self._pause.set()

    def clear_pause(self) -> None:
        """Forget a pause request that no run has honoured yet."""
        self._pause.clear()

    def request_stop(self) -> None:
        self._stop.set()

    # -- stepping -------------------------------------------------------------------------------

    def step_token(self) -> list[Event]:
        """Compute one position; the cursor moves to its first MoE layer. Returns its events
        ([] when the run is finished)."""
        return [self.events[i] for i in self._advance()]

    def _advance(self) -> range:
        """Compute one position; returns the indices of its events (empty when finished)."""
        p = self.record.n_positions
        if not self.generation.advance():
            return range(0)
        tr = self.session.trace
        logits = self.generation.last_logits
        assert tr is not None and logits is not None
        token = int(tr.tokens[p])
        self.record.append(token, self.token_text(token), tr.expert_ids[p], tr.expert_weights[p],
                           tr.router_logits[p], tr.shared_gate[p], tr.hidden_norm[p],
                           tr.phase_ns[p], int(tr.token_ns[p]), self.generation.call_ns,
                           bool(np.isfinite(logits).all()),
                           selection_scores=tr.selection_scores[p],
                           chosen_groups=tr.chosen_groups[p], bias_changed=tr.bias_changed[p],
                           cache_kept=tr.cache_kept[p], cache_margin=tr.cache_margin[p],
                           fresh_ids=tr.fresh_ids[p], cache_hits=tr.cache_hits[p])
        new = self.events.sync()
        if len(new):
            self.cursor = new[0]
        return new

    def step_layer(self) -> Event | None:
        """Move the cursor to the next MoE layer; computes the next position only when the
        cursor is on the last MoE layer of the last computed position. Returns the new current
        event (None when nothing is left)."""
        nxt = 0 if self.cursor is None else self.cursor + 1
        if nxt < len(self.events):
            self.cursor = nxt
            return self.events[nxt]
        new = self._advance()
        return self.events[new[0]] if len(new) else None

    def go_to(self, index: int) -> Event:
        """Put the cursor on an already computed event."""
        event = self.events[index]
        self.cursor = event.index
        return event

    def run(self, until: BreakpointList | Sequence[Breakpoint] | None = None,
            max_positions: int | None = None,
            on_position: Callable[[int], None] | None = None) -> RunResult:
        """Compute positions until a breakpoint in `until` hits (checking events already
        computed after the cursor first), the run finishes, a pause or stop is requested, or
        `max_positions` positions were computed. `on_position(position)` is called after each
        computed position (the worker's hook for signals and autosave)."""
        bps = list(until) if until is not None else []
        done = 0
        if bps:
            found = first_hit(bps, self.events, self.cursor)
            if found is not None:
                self.cursor = found[0].index
                return RunResult("breakpoint", 0, found[0], found[1])
        while True:
            if self.finished:
                self._stop.clear()
                return RunResult("finished", done)
            if self._stop.is_set():
                self._stop.clear()
                self.generation.stop()
                return RunResult("stopped", done)
            if self._pause.is_set():
                self._pause.clear()
                return RunResult("paused", done)
            if max_positions is not None and done >= max_positions:
                return RunResult("limit", done)
            before = len(self.events)
            position = self.position
            new = self._advance()
            done += 1
            if on_position is not None:
                on_position(position)
            if bps and len(new):
                found = first_hit(bps, self.events, before - 1)
                if found is not None:
                    self.cursor = found[0].index
                    return RunResult("breakpoint", done, found[0], found[1])

    def continue_(self) -> RunResult:
        """Run to the next hit of the debugger's own breakpoints (or the end)."""
        return self.run(until=self.breakpoints)


__all__ = ["Debugger", "PHASES", "PositionRecord", "RECORD_ARRAYS", "RoutingRecord", "RunResult",
           "token_piece"]
