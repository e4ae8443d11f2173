"""Running and stepping the engine under the debugger.

`Debugger` owns one traced `colibri.Session` and the `colibri.generation.Generation` running on
it: the same positions and tokens as `colibri run` (len(prompt) + max_new_tokens - 1). After
every engine call the new trace rows are copied into the `RoutingRecord`, an append-only store
that is the single source of truth for every view and export; nothing recomputes routing.
Stepping computes one position at a time; `run()` and recomputations take the prompt in pieces,
one prefill each (the bits of stepping, so the record is the same), each sized to take about
`PROMPT_PIECE_S` so a pause or stop is seen soon; a piece's positions share its time evenly
(`token_ns`, `wall_ns`). When a breakpoint hits inside a piece the positions after the hit are
forgotten, so the run stands exactly where stepping to the hit would have left it. The prompt
may be embedding rows (RunSettings.prompt_embeddings, fed instead of the token lookup): their
positions record token -1 (shown as "<embedding>") and step layer by layer as token positions
do.

Granularity. "Step layer" over decisions already made moves the cursor; past the last one it is
a true step: the engine runs one layer at a time (col_session_step_layer; style point 7: a step
function, no per-layer callbacks into Python) up to and including the next MoE layer, and the
position stays in progress between steps, so the next layer's routing can be edited before it
runs (`set_interventions`; the decision just made can be made again, only that layer rerun).
The events of a position in progress come from its trace row (`pending_events`); the position
joins the record once its last layer has run. Run and Continue compute whole positions (the
rest of one in progress first); run-to-breakpoint computes the position containing the hit,
then places the cursor on exactly the hit (position, layer); Continue first checks the events
already computed after the cursor, so two hits in one position stop twice.

Interventions (colibri.interventions) are part of the run's settings. `set_interventions`
changes them mid-run: the positions computed that they can change are computed again from the
first of them (the KV cache before it reused), and the run as it was becomes the original of a
`Counterfactual` (colibri.debugging.counterfactual). A breakpoint with the 'forbid' action adds
its intervention at the hit and goes on. `set_routing` does the same for the routing mode and
epsilon (top-k, stable, Gumbel): the engine routes the computed positions again from their
recorded router logits and the run is computed again from the first one decided differently.

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
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from colibri.debugging.breakpoints import Breakpoint, BreakpointList, first_hit
from colibri.debugging.counterfactual import Counterfactual, RunImage, logit_rows
from colibri.debugging.events import Event, EventList
from colibri.interventions import Intervention, changed_from
from colibri.margins import group_limits
from colibri import tokens
from colibri.generation import Generation
from colibri.kept_logits import LogitFile
from colibri.values import RunSettings

PHASES = ("attention", "router", "experts", "combine", "layer")
PROMPT_PIECE_S = 0.1     # a prompt piece's target time: how late a pause or stop is seen
PROMPT_PIECE_MAX = 256   # positions: the engine's block
PROMPT_PIECE_FIRST = 8   # before a piece has been timed


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
    wall_ns: int                # wall time of the engine call as seen from Python (engine +
                                # binding), shared evenly by the positions of a prompt piece
    logits_finite: bool         # the position's output logits are all finite
    selection_scores: np.ndarray  # [moe_layers, n_experts] float32, what the choice ranked
    chosen_groups: np.ndarray   # [moe_layers, n_groups] int32 kept groups, -1 none
    bias_changed: np.ndarray    # [moe_layers] bool: the correction bias changed the choice
    intervened: np.ndarray      # [moe_layers] uint8: bits of the intervention kinds that acted
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
    "intervened": (np.uint8, ("n_moe_layers",)),
}
RECORD_ARRAYS = tuple(_ARRAYS)
# Arrays older session files do not have, and what they hold there: files from before format
# version 2 come from version-1 models, which select on the router logits with no groups; files
# from before interventions had none; files from before expert caching ran without it (nothing
# kept, no fresh choice, no LRU).
LATER_ARRAYS = ("selection_scores", "chosen_groups", "bias_changed", "intervened", "cache_kept",
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
    intervened = property(lambda self: self.array("intervened"))

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
                              self.array("intervened")[p],
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

    def truncate(self, n: int) -> None:
        """Keep the first `n` rows only (a counterfactual recomputes the rest). Rows are copied to
        new buffers, so snapshots and views taken before keep the rows they saw."""
        if self._frozen:
            raise RuntimeError("a RoutingRecord snapshot is immutable")
        if not 0 <= n <= self._n:
            raise IndexError(f"cannot keep {n} of {self._n} rows")
        rows = self._buf["tokens"].shape[0]
        self._buf = {name: np.concatenate([old[:n], self._alloc(name, rows - n)])
                     for name, old in self._buf.items()}
        self._texts = self._texts[:n]
        self._views = {}
        self._n = n

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
               intervened: np.ndarray | None = None,
               cache_kept: np.ndarray | None = None, cache_margin: np.ndarray | None = None,
               fresh_ids: np.ndarray | None = None, cache_hits: np.ndarray | None = None) -> int:
        """Copy one position's rows in; returns its position. The intervention and
        expert-caching rows default to a run without them (none acted, nothing kept, NaN
        margins)."""
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
        b["intervened"][p] = 0 if intervened is None else intervened
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
        arrays.setdefault("intervened", np.zeros(ids.shape[:2], np.uint8))
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
    eos), 'paused', 'stopped', or 'limit' (max_positions reached). `actions` are the
    interventions breakpoint actions added on the way (the run went on after each)."""

    reason: str
    positions: int                          # positions computed by this call
    event: Event | None = None
    breakpoint: Breakpoint | None = field(default=None)
    actions: tuple[Intervention, ...] = ()


def token_piece(tokenizer: Any, token: int) -> str:
    """The text of `token` (see colibri.tokens.token_text)."""
    return tokens.token_text(tokenizer, token)


class Debugger:
    """A run under the debugger: one Session, its Generation, RoutingRecord and EventList, a
    cursor, the interventions and the last counterfactual.

    Not thread-safe except `request_pause`/`request_stop` (see the module docstring)."""

    def __init__(self, model: Any, settings: RunSettings, tokenizer: Any = "model") -> None:
        from colibri.engine import Session, check_embeddings  # the debugger's engine dependencies

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
                               expert_cache=settings.expert_cache, numerics=settings.numerics)
        # the path that runs: the last bits of every product (and so near-tie routing) depend on it
        self.kernels = self.session.kernels
        if settings.kernels is not None and self.kernels != settings.kernels:
            self.session.close()
            raise ValueError(f"this machine runs no {settings.kernels} kernels (its best path is "
                             f"{self.kernels})")
        prompt: Any = settings.prompt_tokens
        try:
            self.session.set_interventions(settings.interventions)
            if settings.prompt_embeddings is not None:  # dtype and width named before a run
                prompt = check_embeddings(settings.prompt_embeddings, hp.d_model)
        except Exception:
            self.session.close()
            raise
        # every position's logits are kept, since a counterfactual compares them: positions x
        # vocab float32 (600 KB a position at a 150k vocabulary), so in a file's pages
        self.logit_file = LogitFile(hp.vocab_size)
        self.generation = Generation(self.session, prompt,
                                     settings.max_new_tokens, decoding=settings.decoding,
                                     temperature=settings.temperature, seed=settings.seed,
                                     eos=hp.eos_token_id, step_prompt=True,
                                     keep_logits=self.logit_file)
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
        self.counterfactual: Counterfactual | None = None
        self._pause = threading.Event()
        self._stop = threading.Event()
        self._piece = PROMPT_PIECE_FIRST  # prompt positions in run()'s next engine call

    # -- state ----------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Positions computed so far (a position in progress not counted)."""
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
    def interventions(self) -> tuple[Intervention, ...]:
        return self.settings.interventions

    @property
    def layers_done(self) -> int | None:
        """Model layers run of the position in progress (None when none is in progress)."""
        return self.session.layers_done

    @property
    def current(self) -> Event | None:
        if self.cursor is None:
            return None
        if self.cursor < len(self.events):
            return self.events[self.cursor]
        return next((e for e in self.pending_events() if e.index == self.cursor), None)

    def logits(self) -> np.ndarray:
        """[positions, vocab] float32 logits of every computed position (a copy)."""
        return logit_rows(self.generation, 0, self.position)

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
        self.logit_file.close()

    # -- control from other threads ---------------------------------------------------------------

    def request_pause(self) -> None:
        """Pause the current (or, if none is running, the next) run between positions."""
        self._pause.set()

    def clear_pause(self) -> None:
        """Forget a pause request that no run has honoured yet."""
        self._pause.clear()

    def request_stop(self) -> None:
        self._stop.set()

    def clear_requests(self) -> None:
        """Forget pause and stop requests (after a recomputation they ended early)."""
        self._pause.clear()
        self._stop.clear()

    # -- stepping -------------------------------------------------------------------------------

    def step_token(self) -> list[Event]:
        """Compute one position (the rest of the one in progress, if any); the cursor moves to
        its first MoE layer. Returns its events ([] when the run is finished)."""
        return [self.events[i] for i in self._advance()]

    def _advance(self, limit: int = 1) -> range:
        """Compute one position, the layers left of the one in progress, or (inside the prompt)
        up to `limit` prompt positions in one engine call; returns the indices of their events
        (empty when finished). The cursor moves to the first of them."""
        p = self.record.n_positions
        if self.session.layers_done is None:
            in_prompt = p < len(self.generation.prompt)
            done = self.generation.advance(limit)
            if in_prompt and done:  # size the next piece from this call's time per position
                each = max(self.generation.call_ns // len(done), 1)
                self._piece = max(1, min(PROMPT_PIECE_MAX, int(PROMPT_PIECE_S * 1e9) // each))
        else:
            done = range(0)
            while not done:
                done = self.generation.advance_layer()
        if not done:
            return range(0)
        new = self._record(p, len(done))
        if len(new):
            self.cursor = new[0]
        return new

    def _record(self, p: int, n: int = 1) -> range:
        """Copy the trace rows of the n positions from p (the last engine call's) into the
        record; returns their events' indices."""
        tr = self.session.trace
        kept = self.generation.logits
        assert tr is not None and kept
        rows = kept[-1][-n:]  # the call's logits, a row a position
        wall_ns = self.generation.call_ns // n
        for q, logits in zip(range(p, p + n), rows):
            token = int(tr.tokens[q])
            self.record.append(token, self.token_text(token), tr.expert_ids[q],
                               tr.expert_weights[q], tr.router_logits[q], tr.shared_gate[q],
                               tr.hidden_norm[q], tr.phase_ns[q], int(tr.token_ns[q]), wall_ns,
                               bool(np.isfinite(logits).all()),
                               selection_scores=tr.selection_scores[q],
                               chosen_groups=tr.chosen_groups[q],
                               bias_changed=tr.bias_changed[q], intervened=tr.intervened[q],
                               cache_kept=tr.cache_kept[q], cache_margin=tr.cache_margin[q],
                               fresh_ids=tr.fresh_ids[q], cache_hits=tr.cache_hits[q])
        return self.events.sync()

    def _forget_from(self, position: int) -> None:
        """Take the run back to `position` computed positions (generation, record, events)."""
        self.generation.rewind(position)
        self.record.truncate(position)
        self.events.truncate(position)

    def pending_events(self) -> list[Event]:
        """The events of the position in progress whose MoE layers have run (their indices
        continue the event list's), read from the session's trace row of that position."""
        done = self.session.layers_done
        tr = self.session.pending_trace()
        if done is None or tr is None:
            return []
        rec, p, M = self.record, self.position, self.record.n_moe_layers
        moe_done = int((rec.moe_layers < done).sum())
        if moe_done == 0:
            return []
        token = self.generation.next_token
        one = RoutingRecord(rec.moe_layers, rec.n_layers, rec.k, rec.n_experts, 1, rec.n_groups,
                            cached=rec.k_fresh > 0, lru=rec.k_hits > 0)
        one.append(token, self.token_text(token), tr.expert_ids[p], tr.expert_weights[p],
                   tr.router_logits[p], tr.shared_gate[p], tr.hidden_norm[p], tr.phase_ns[p], 0,
                   0, True, selection_scores=tr.selection_scores[p],
                   chosen_groups=tr.chosen_groups[p], bias_changed=tr.bias_changed[p],
                   intervened=tr.intervened[p], cache_kept=tr.cache_kept[p],
                   cache_margin=tr.cache_margin[p], fresh_ids=tr.fresh_ids[p],
                   cache_hits=tr.cache_hits[p])
        events = EventList(one, self.model.hparams.n_experts_active, group_limits(self.model))
        out = []
        for m in range(moe_done):
            e = events[m]
            changed = p > 0 and set(e.expert_ids) != {int(i) for i in rec.expert_ids[p - 1, m]
                                                      if i >= 0}
            out.append(replace(e, index=p * M + m, position=p, routing_changed=changed))
        return out

    def step_layer(self) -> Event | None:
        """The next routing decision. Over decisions already made it moves the cursor; past the
        last one it runs the engine up to and including the next MoE layer (the dense layers
        before it, a position's last layers and its LM head run on the way), and the run pauses
        there, between layers, so the next layer's routing can be edited (`set_interventions`)
        before it runs. Returns the event the cursor is on (None once finished)."""
        pending = self.pending_events()
        nxt = 0 if self.cursor is None else self.cursor + 1
        if nxt < len(self.events):
            self.cursor = nxt
            return self.events[nxt]
        if nxt < len(self.events) + len(pending):
            self.cursor = nxt
            return pending[nxt - len(self.events)]
        if self.record.n_moe_layers == 0:
            new = self.step_token()
            return new[0] if new else None
        while not self.finished:
            p = self.position
            done = self.generation.advance_layer()
            if done:  # the position's last layer ran
                new = self._record(p)
                if self.model.hparams.n_layers - 1 == int(self.record.moe_layers[-1]):
                    self.cursor = new[-1]
                    return self.events[new[-1]]
                continue
            layers = self.session.layers_done
            assert layers is not None
            if layers - 1 in self.record.moe_layers:
                event = self.pending_events()[-1]
                self.cursor = event.index
                return event
        return None

    def go_to(self, index: int) -> Event:
        """Put the cursor on an already computed event."""
        pending = {e.index: e for e in self.pending_events()}
        if index in pending:
            self.cursor = index
            return pending[index]
        event = self.events[index]
        self.cursor = event.index
        return event

    # -- interventions --------------------------------------------------------------------------

    def set_interventions(self, interventions: Sequence[Intervention],
                          compare: bool = True) -> Counterfactual | None:
        """Run under `interventions` from now on. The computed positions they can change are
        computed again, from the first of them (the KV cache before it is reused), as far as
        the run had got (a position in progress to the same layer); a pause or stop request
        ends that early. With `compare`, the run as it was is the original of the returned
        `Counterfactual` (also kept in `counterfactual`); None when nothing computed changes.
        The engine judges the interventions first: a refused one raises and nothing changes."""
        new = tuple(interventions)
        old = self.settings.interventions
        start = changed_from(old, new)
        self.session.set_interventions(new)
        self.settings = replace(self.settings, interventions=new)
        extent, layers = self.position, self.session.layers_done
        if start is None or start > extent or (start == extent and layers is None):
            return None
        original = self._image(old, start) if compare else None
        if start == extent and self._only_layer_run_last(old, new, extent, layers):
            self.session.rewind_layer()   # the decision just made, made again
            self.generation.advance_layer()
        else:
            self._recompute(start, extent)
            if layers is not None and self.position == extent and not self.finished:
                while (self.session.layers_done or 0) < layers:
                    self.generation.advance_layer()
        return self._compared(original, start)

    def set_routing(self, routing: str, epsilon: float | None = None,
                    compare: bool = True) -> Counterfactual | None:
        """Route by `routing` from now on: 'topk', 'stable' (epsilon None = the model's
        default_epsilon) or 'gumbel' (the run's seed), from one of them. The engine routes the
        computed positions again from their recorded router logits (Session.set_routing); from
        the first one it decides differently the run is computed again, as far as it had got
        (a pause or stop request ends that early), and compared as `set_interventions` does:
        the returned `Counterfactual`, None when no computed position changes. Raises
        ValueError while a position is in progress, and the engine's error for soft or cached
        routing (nothing changes either way)."""
        if self.session.layers_done is not None:
            raise ValueError("a position is in progress: complete it before changing the routing")
        seed = self.settings.seed
        first = self.session.set_routing(routing, epsilon, seed)  # type: ignore[arg-type]
        self.settings = replace(self.settings, routing=routing, epsilon=epsilon)
        extent = self.position
        if first >= extent:
            return None
        original = self._image(self.settings.interventions, first) if compare else None
        self._recompute(first, extent)
        return self._compared(original, first)

    def _recompute(self, start: int, extent: int) -> None:
        """Forget the positions from `start` and compute them again as far as `extent`; a pause
        or stop request ends that early (and stays for a run that called this; see
        clear_requests)."""
        self._forget_from(start)
        while self.position < extent and not self.finished:
            if self._pause.is_set() or self._stop.is_set():
                break
            self._advance(min(self._piece, extent - self.position))

    def _compared(self, original: RunImage | None, start: int) -> Counterfactual | None:
        """After a recomputation from `start`: the cursor kept among the events, and the
        counterfactual of `original` (None when not asked, or when no position computed to its
        end changed; a position in progress may have)."""
        n_events = len(self.events) + len(self.pending_events())
        if self.cursor is not None and self.cursor >= n_events:
            self.cursor = n_events - 1 if n_events else None
        if original is None or start >= self.position:
            return None
        self.counterfactual = Counterfactual.between(
            original, self._image(self.settings.interventions, start), start, self.n_prompt)
        return self.counterfactual

    def _only_layer_run_last(self, old: Sequence[Intervention], new: Sequence[Intervention],
                             position: int, layers: int | None) -> bool:
        """Whether, at the position in progress, the change acts on the last layer run and on
        none before it (so running that one layer again is enough)."""
        if layers is None or layers == 0:
            return False
        last = layers - 1
        changed = set(old) ^ set(new)
        if [i for i in old if i in new] != [i for i in new if i in old]:
            changed = set(old) | set(new)
        moe = [int(layer) for layer in self.record.moe_layers if layer <= last]
        return all(not i.acts_at(position, layer) for i in changed for layer in moe
                   if layer < last)

    def _image(self, interventions: tuple[Intervention, ...], logits_from: int) -> RunImage:
        """The run as it stands, its logits from position `logits_from` on."""
        rec = self.record
        logits_from = min(logits_from, self.position)
        return RunImage(tuple(self.generation.tokens),
                        logit_rows(self.generation, logits_from, self.position),
                        np.array(rec.expert_ids), np.array(rec.intervened),
                        tuple(int(x) for x in rec.moe_layers), interventions, logits_from)

    # -- running --------------------------------------------------------------------------------

    def run(self, until: BreakpointList | Sequence[Breakpoint] | None = None,
            max_positions: int | None = None,
            on_position: Callable[[int], None] | None = None) -> RunResult:
        """Compute positions until a breakpoint in `until` hits (checking events already
        computed after the cursor first), the run finishes, a pause or stop is requested, or
        `max_positions` positions were computed. `on_position(position)` is called after each
        computed position (the worker's hook for signals and autosave). A breakpoint whose
        action is 'forbid' does not stop: it adds its intervention at the hit and the run goes
        on from there (the hit's position computed again)."""
        bps = list(until) if until is not None else []
        done = 0
        actions: list[Intervention] = []
        start = self.cursor
        while True:
            if bps:
                found = first_hit(bps, self.events, start)
                if found is not None:
                    event, bp = found
                    if bp.action == "stop":
                        self.cursor = event.index
                        return RunResult("breakpoint", done, event, bp, tuple(actions))
                    action = bp.intervention(event)
                    actions.append(action)
                    self.set_interventions((*self.interventions, action), compare=False)
                    start = event.index
                    continue
            if self.finished:
                self._stop.clear()
                return RunResult("finished", done, actions=tuple(actions))
            if self._stop.is_set():
                self._stop.clear()
                self.generation.stop()
                return RunResult("stopped", done, actions=tuple(actions))
            if self._pause.is_set():
                self._pause.clear()
                return RunResult("paused", done, actions=tuple(actions))
            if max_positions is not None and done >= max_positions:
                return RunResult("limit", done, actions=tuple(actions))
            before = len(self.events)
            position = self.position
            # the events of a position in progress before the cursor were seen already
            seen = self.cursor if self.cursor is not None and self.cursor >= before else before - 1
            limit = self._piece if max_positions is None else min(self._piece,
                                                                   max_positions - done)
            self._advance(limit)
            if bps and self.position > position + 1:  # a piece: stand where stepping would
                found = first_hit(bps, self.events, seen)
                if found is not None and found[0].position + 1 < self.position:
                    self._forget_from(found[0].position + 1)
            done += self.position - position
            if on_position is not None:
                for p in range(position, self.position):
                    on_position(p)
            start = seen

    def continue_(self) -> RunResult:
        """Run to the next hit of the debugger's own breakpoints (or the end)."""
        return self.run(until=self.breakpoints)


__all__ = ["Debugger", "PHASES", "PositionRecord", "RECORD_ARRAYS", "RoutingRecord", "RunResult",
           "token_piece"]
