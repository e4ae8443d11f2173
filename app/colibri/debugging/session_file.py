"""Saved debugging sessions (`*.colibri-session`, specified in docs/session-format.md) and autosave.

A session file is a ZIP archive (members stored, not compressed, so saving is a plain copy):
`manifest.json` (format name and version, model path, size and SHA-256, run settings, tokens and
their texts, generated tokens, cursor, bookmarks, breakpoints, sampler RNG state, and the dtype and
shape of every array) and one `.npy` file per record array under `arrays/`. It is written through
a temporary file and renamed, so a crash during a save leaves the previous file intact; `Autosaver`
rewrites it every N positions or S seconds while a run goes on.

The model checksum is SHA-256 of the whole file, read in 1 MiB chunks and cached per
(path, size, mtime): exact, independent of the .colibri format's own CRCs, and paid once per
model per process (about a second per GB).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import os
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from colibri.debugging.breakpoints import BreakpointList
from colibri.debugging.counterfactual import Counterfactual
from colibri.debugging.events import EventList
from colibri.debugging.run import LATER_ARRAYS, PHASES, RECORD_ARRAYS, Debugger, RoutingRecord
from colibri.fileformat import QUANT_NAMES
from colibri.files import atomic_write
from colibri.margins import GroupLimit, group_limits
from colibri.values import RunSettings

FORMAT_NAME = "colibri-debug-session"
FORMAT_VERSION = 1
EMBEDDINGS_FILE = "prompt_embeddings.npy"   # an embedding prompt's rows (settings.prompt_embeddings)
SUFFIX = ".colibri-session"
_CHUNK = 1 << 20
UNREADABLE = "unreadable"   # the checksum of a file that could not be read
_checksums: dict[tuple[str, int, int], str] = {}
_hashing: set[tuple[str, int, int]] = set()   # files whose checksum a thread has been started for
_hashing_lock = threading.Lock()


class SessionFormatError(ValueError):
    """A session file that is not one, or not one this version reads."""


def _checksum_key(path: str | os.PathLike[str]) -> tuple[str, int, int]:
    real = os.path.realpath(path)
    st = os.stat(real)
    return real, st.st_size, st.st_mtime_ns


def model_checksum(path: str | os.PathLike[str]) -> str:
    """SHA-256 (hex) of the whole file, cached per (path, size, mtime_ns)."""
    key = _checksum_key(path)
    if key not in _checksums:
        h = hashlib.sha256()
        with open(key[0], "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        _checksums[key] = h.hexdigest()
    return _checksums[key]


def checksum_when_ready(path: str | os.PathLike[str]) -> str | None:
    """The file's SHA-256 if already computed, else None, having started its computation on a
    background thread (once per file version): reading a large model takes seconds that a run's
    autosave or the UI thread must not wait for. A file the thread cannot read gets
    UNREADABLE, which matches no recorded checksum. Thread-safe."""
    key = _checksum_key(path)
    if key in _checksums:
        return _checksums[key]
    with _hashing_lock:
        if key not in _hashing:
            _hashing.add(key)
            threading.Thread(target=_checksum_in_background, args=(key,), daemon=True,
                             name="colibri-model-checksum").start()
    return None


def _checksum_in_background(key: tuple[str, int, int]) -> None:
    try:
        model_checksum(key[0])
    except OSError:
        _checksums[key] = UNREADABLE


@dataclass(eq=False)
class SavedSession:
    """Everything a session file holds; `load_session(save_session(x))` equals x."""

    model: dict[str, Any]              # path, size, sha256, arch, n_layers, n_experts, ...
    settings: RunSettings
    record: RoutingRecord
    generated: list[int] = field(default_factory=list)
    finished: bool = False
    stop_reason: str = ""
    cursor: int | None = None
    bookmarks: list[int] = field(default_factory=list)
    breakpoints: BreakpointList = field(default_factory=BreakpointList)
    rng_state: dict[str, Any] | None = None
    saved_at: str = ""
    # Results of analyses run on the same model (e.g. "jitter_lab": the jitter lab's reports),
    # stored as JSON so a session carries everything the user made.
    analyses: dict[str, Any] = field(default_factory=dict)
    kernels: str = ""              # the kernel path the run ran on ("" in older files)
    engine_abi: int = 0            # the engine's ABI version (engine.ABI_VERSION; 0: before 13)
    # the last comparison of the run under its interventions with the run before them
    counterfactual: Counterfactual | None = None

    @classmethod
    def from_debugger(cls, dbg: Debugger, checksum: bool = True) -> SavedSession:
        """The debugger's run as a session; the model's SHA-256 computed (`checksum`), or only
        if already known (else None, its computation started: `checksum_when_ready`)."""
        from colibri.engine import ABI_VERSION
        m, hp = dbg.model, dbg.model.hparams
        info = {"path": os.path.abspath(m.path), "size": int(m.size), "arch": m.arch,
                "n_layers": hp.n_layers, "n_experts": hp.n_experts,
                "n_experts_active": hp.n_experts_active, "vocab_size": hp.vocab_size,
                "group_limits": [[g.n_groups, g.n_groups_kept, g.group_score]
                                 for g in group_limits(m)],
                "sha256": model_checksum(m.path) if checksum else checksum_when_ready(m.path),
                "quantised": any(t.dtype in QUANT_NAMES.values() for t in m.tensors)}
        return cls(info, dbg.settings, dbg.record.snapshot(), list(dbg.generated), dbg.finished,
                   dbg.stop_reason, dbg.cursor, sorted(dbg.events.bookmarks),
                   BreakpointList(list(dbg.breakpoints)),
                   _jsonable(dbg.generation.rng_state), kernels=dbg.kernels,
                   engine_abi=ABI_VERSION, counterfactual=dbg.counterfactual)

    def events(self) -> EventList:
        """The event list of the saved record, with its bookmarks."""
        limits = [GroupLimit(*g) for g in self.model["group_limits"]] \
            if "group_limits" in self.model else None  # files from before groups had none
        ev = EventList(self.record, int(self.model.get("n_experts_active", self.record.k)), limits)
        ev.bookmarks = set(self.bookmarks)
        return ev

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SavedSession):
            return NotImplemented
        return (self.model == other.model and self.settings == other.settings
                and self.record.equals(other.record) and self.generated == other.generated
                and self.finished == other.finished and self.stop_reason == other.stop_reason
                and self.cursor == other.cursor and self.bookmarks == other.bookmarks
                and self.breakpoints == other.breakpoints and self.rng_state == other.rng_state
                and self.analyses == other.analyses and self.kernels == other.kernels
                and self.engine_abi == other.engine_abi
                and _counterfactual_dict(self.counterfactual)
                == _counterfactual_dict(other.counterfactual))

    def kernels_note(self) -> str:
        """'' when a new run of these settings here would use the kernel path the session was
        recorded on (or the file does not say); otherwise a sentence saying what differs."""
        if not self.kernels:
            return ""
        from colibri.engine import KERNEL_PATHS, best_kernels
        here = best_kernels()
        wanted = self.settings.kernels
        if wanted in KERNEL_PATHS and KERNEL_PATHS.index(wanted) < KERNEL_PATHS.index(here):
            here = wanted
        if here == self.kernels:
            return ""
        return (f"recorded on the {self.kernels} kernels; a new run here uses {here}, so "
                f"near-tie routing can differ")

    def engine_note(self) -> str:
        """'' when this engine computes what the session's engine did; otherwise a sentence
        saying what a new run can no longer reproduce: quantised products are in block order
        since ABI 13 (BLOCK_ORDER_ABI), so their last bits differ from an older engine's."""
        from colibri.engine import BLOCK_ORDER_ABI
        if self.engine_abi >= BLOCK_ORDER_ABI or self.model.get("quantised") is False:
            return ""
        which = ("its q8_0/q4_0 products" if self.model.get("quantised")
                 else "any q8_0/q4_0 products of its model")
        return (f"recorded by an engine older than ABI {BLOCK_ORDER_ABI}; a new run computes "
                f"{which} in block order, with other last bits, so near-tie routing can differ")

    def model_matches(self, path: str | os.PathLike[str], wait: bool = True) -> bool | None:
        """The file at `path` is the model this session was recorded on (size and SHA-256; the
        size alone when the session has no checksum). Without `wait`, None while the file's
        checksum is still to be computed (on a background thread: `checksum_when_ready`)."""
        if os.path.getsize(path) != self.model.get("size"):
            return False
        recorded = self.model.get("sha256")
        if recorded is None:
            return True
        actual = model_checksum(path) if wait else checksum_when_ready(path)
        return None if actual is None else recorded == actual


def _counterfactual_dict(cf: Counterfactual | None) -> dict[str, Any] | None:
    return None if cf is None else cf.to_dict()


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=int))


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def session_bytes(saved: SavedSession) -> bytes:
    rec = saved.record
    arrays = rec.arrays()
    manifest = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION,
        "saved_at": saved.saved_at or _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "model": saved.model, "settings": saved.settings.to_dict(),
        "n_positions": rec.n_positions, "n_layers": rec.n_layers, "k": rec.k,
        "n_experts": rec.n_experts, "phases": list(PHASES),
        "tokens": [int(t) for t in rec.tokens], "token_texts": rec.token_texts,
        "generated": [int(t) for t in saved.generated], "finished": saved.finished,
        "stop_reason": saved.stop_reason, "cursor": saved.cursor,
        "bookmarks": [int(b) for b in saved.bookmarks],
        "breakpoints": saved.breakpoints.to_list(), "rng_state": saved.rng_state,
        "analyses": _jsonable(saved.analyses), "kernels": saved.kernels,
        "engine_abi": saved.engine_abi,
        "counterfactual": _counterfactual_dict(saved.counterfactual),
        "arrays": {name: {"file": f"arrays/{name}.npy", "dtype": a.dtype.str,
                          "shape": list(a.shape)} for name, a in arrays.items()},
    }
    rows = saved.settings.prompt_embeddings
    if rows is not None:  # an embedding prompt: its rows, not position-aligned with the record
        manifest["prompt_embeddings"] = {"file": EMBEDDINGS_FILE, "dtype": rows.dtype.str,
                                         "shape": list(rows.shape)}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("manifest.json", json.dumps(manifest, indent=1, allow_nan=False))
        for name, a in arrays.items():
            z.writestr(f"arrays/{name}.npy", _npy(a))
        if rows is not None:
            z.writestr(EMBEDDINGS_FILE, _npy(rows))
    return buf.getvalue()


def save_session(path: str | os.PathLike[str], session: SavedSession | Debugger) -> SavedSession:
    """Write a session file atomically; returns what was saved."""
    saved = session if isinstance(session, SavedSession) else SavedSession.from_debugger(session)
    data = session_bytes(saved)
    atomic_write(path, lambda f: f.write(data))
    return saved


def load_session(path: str | os.PathLike[str]) -> SavedSession:
    """Read a session file; raises SessionFormatError naming what is wrong."""
    try:
        with zipfile.ZipFile(path) as z:
            try:
                manifest = json.loads(z.read("manifest.json"))
            except KeyError:
                raise SessionFormatError(f"{path}: no manifest.json; not a session file") from None
            if manifest.get("format") != FORMAT_NAME:
                raise SessionFormatError(f"{path}: format {manifest.get('format')!r}, expected "
                                         f"{FORMAT_NAME!r}")
            if manifest.get("version") != FORMAT_VERSION:
                raise SessionFormatError(f"{path}: session format version "
                                         f"{manifest.get('version')}, this build reads "
                                         f"{FORMAT_VERSION}")
            arrays = {}
            specs = dict(manifest["arrays"])
            if manifest.get("prompt_embeddings"):
                specs["prompt_embeddings"] = manifest["prompt_embeddings"]
            for name, spec in specs.items():
                try:
                    data = z.read(spec["file"])
                except KeyError:
                    raise SessionFormatError(f"{path}: no member {spec['file']} (array {name})"
                                             ) from None
                a = np.load(io.BytesIO(data), allow_pickle=False)
                if a.dtype.str != spec["dtype"] or list(a.shape) != spec["shape"]:
                    raise SessionFormatError(f"{path}: array {name} is {a.dtype.str} "
                                             f"{list(a.shape)}, manifest says {spec['dtype']} "
                                             f"{spec['shape']}")
                arrays[name] = a
            rows = arrays.pop("prompt_embeddings", None)
    except zipfile.BadZipFile as exc:
        raise SessionFormatError(f"{path}: not a session file ({exc})") from exc
    missing = [n for n in (*RECORD_ARRAYS, "moe_layers") if n not in arrays
               and n not in LATER_ARRAYS]
    if missing:
        raise SessionFormatError(f"{path}: missing arrays {', '.join(missing)}")
    n = int(manifest["n_positions"])
    bad = [name for name in RECORD_ARRAYS if name in arrays and arrays[name].shape[0] != n]
    if bad:
        raise SessionFormatError(f"{path}: arrays {', '.join(bad)} do not have {n} rows")
    record = RoutingRecord.from_arrays(arrays, manifest["token_texts"], int(manifest["n_layers"]))
    try:
        settings = RunSettings.from_dict(manifest["settings"], rows)
    except ValueError as exc:
        raise SessionFormatError(f"{path}: settings: {exc}") from None
    return SavedSession(
        model=manifest["model"], settings=settings,
        record=record, generated=list(manifest["generated"]),
        finished=bool(manifest["finished"]), stop_reason=manifest["stop_reason"],
        cursor=manifest["cursor"], bookmarks=list(manifest["bookmarks"]),
        breakpoints=BreakpointList.from_list(manifest["breakpoints"]),
        rng_state=manifest["rng_state"], saved_at=manifest["saved_at"],
        analyses=dict(manifest.get("analyses") or {}), kernels=str(manifest.get("kernels") or ""),
        engine_abi=int(manifest.get("engine_abi") or 0),
        counterfactual=Counterfactual.from_dict(manifest["counterfactual"])
        if manifest.get("counterfactual") else None)


class Autosaver:
    """Rewrites a session file while a run goes on: after every `every_positions` new positions
    or `every_seconds` seconds, whichever comes first, but only once the run has gone on for
    the last save's time over `max_share` since it (a save writes the whole record, so on a
    long run of a large model saving every 16 positions would take over the run; this keeps
    saving under about `max_share` of the time). Call `notify(debugger)` after each position
    (Debugger.run's on_position hook) and `flush(debugger)` when the run ends. `clock` is the
    time source in seconds."""

    def __init__(self, path: str | os.PathLike[str], every_positions: int = 16,
                 every_seconds: float = 5.0, max_share: float = 0.05,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.fspath(path)
        self.every_positions = max(int(every_positions), 1)
        self.every_seconds = float(every_seconds)
        self.max_share = float(max_share)
        self.saves = 0
        self._clock = clock
        self._saved_positions = -1
        self._last = clock()
        self._save_s = 0.0  # how long the last save took

    def notify(self, dbg: Debugger) -> bool:
        since = self._clock() - self._last
        due = (dbg.position - max(self._saved_positions, 0) >= self.every_positions
               or since >= self.every_seconds) and since * self.max_share >= self._save_s
        if due:
            self.flush(dbg)
        return due

    def flush(self, dbg: Debugger) -> None:
        if dbg.position == self._saved_positions:
            return
        start = self._clock()
        save_session(self.path, SavedSession.from_debugger(dbg, checksum=False))
        self.saves += 1
        self._saved_positions = dbg.position
        self._last = self._clock()
        self._save_s = self._last - start


__all__ = ["Autosaver", "FORMAT_NAME", "FORMAT_VERSION", "SUFFIX", "SavedSession",
           "SessionFormatError", "load_session", "model_checksum", "save_session",
           "session_bytes"]
