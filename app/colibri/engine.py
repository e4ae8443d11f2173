"""Typed wrappers over the C engine: `Model`, `Session`, `validate` and their value types.

The second of the binding's three layers. Each wrapper owns one C handle through `ffi.gc`, checks
its arguments in Python before the call (so a bad token id is a clear ValueError, not a C-side
surprise) and turns every non-zero status into an exception through `errors.raise_for_status`.
cffi releases the GIL around every C call, so a worker thread may prefill while the UI runs.

Lifetimes (the one rule that keeps numpy views safe):
  * A view returned by `Model.tensor()`, `Model.bytes()` or `Session.trace` points straight into
    C memory (the read-only file mapping, or session memory). Its buffer holds a reference to the
    C handle, so the mapping or the session outlives every view of it.
  * A session holds its model the same way, so a model is unmapped only after its last session.
  * `close()` therefore drops this object's reference: the wrapper refuses further calls at once,
    and the C resource is released as soon as no view or session still uses it (immediately when
    there is none). Views stay valid after `close()`; nothing ever dangles.
Model views are read-only (the mapping is PROT_READ). Trace views are read-only *live* views:
the next step appends rows beyond the slice and `reset()` rewrites them; `Trace.copy()` snapshots.
A session serves one thread at a time; concurrent calls raise RuntimeError instead of corrupting it.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from types import TracebackType
from typing import Any, ClassVar, Literal

import numpy as np

from colibri import errors
from colibri.generation import Generation, OnPosition, StopFn, SwapFn
from colibri.interventions import KINDS as INTERVENTION_KINDS
from colibri.interventions import OPS as INTERVENTION_OPS
from colibri.interventions import Intervention
from colibri.numerics import Numerics, NumericsError, as_numerics
from colibri.values import KERNEL_PATHS, ROUTING_MODES, DecodingName, HParams, RoutingName
from colibri.errors import (COL_ERR_BAD_TOKEN, COL_ERR_INVALID_ARG, ColibriError,
                            ColibriFormatError, ColibriValueError)

try:
    from colibri._colibri_cffi import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        "colibri: the compiled engine (colibri._colibri_cffi) is missing; build it with "
        "`pip install -e .` or `python app/colibri/_build_ffi.py`") from exc

ABI_VERSION = 21
# The first ABI whose q8_0/q4_0 products are in block order (one fused multiply-add per block and
# output, the same bits on every kernel path): runs recorded by an older engine on weights of those
# dtypes cannot be reproduced bit for bit.
BLOCK_ORDER_ABI = 13
if lib.col_abi_version() != ABI_VERSION:  # pragma: no cover - only on a stale build
    raise ImportError(
        f"colibri: compiled engine has ABI version {lib.col_abi_version()}, this Python package "
        f"expects {ABI_VERSION}; rebuild the extension (`pip install -e .`)")

DTYPE_NAMES: dict[int, str] = {lib.COL_DTYPE_F32: "f32", lib.COL_DTYPE_F16: "f16",
                               lib.COL_DTYPE_BF16: "bf16", lib.COL_DTYPE_Q8_0: "q8_0",
                               lib.COL_DTYPE_Q4_0: "q4_0", lib.COL_DTYPE_Q8_0X8: "q8_0x8",
                               lib.COL_DTYPE_Q4_0X8: "q4_0x8", lib.COL_DTYPE_BF16X16: "bf16x16"}
# Block-quantised dtypes (blocks of 32 per row, docs/format.md; the x8 ones in 8-row panels): raw
# views are uint8 [..., row bytes] (a panel's bytes span its 8 rows).
BLOCK_DTYPES = (lib.COL_DTYPE_Q8_0, lib.COL_DTYPE_Q4_0, lib.COL_DTYPE_Q8_0X8, lib.COL_DTYPE_Q4_0X8)
BLOCK_DTYPE_NAMES = tuple(DTYPE_NAMES[d] for d in BLOCK_DTYPES)
# bf16 has no numpy dtype: its views are uint16 bit patterns (see Model.tensor_f32).
NUMPY_DTYPES: dict[int, type[np.generic]] = {lib.COL_DTYPE_F32: np.float32,
                                             lib.COL_DTYPE_F16: np.float16,
                                             lib.COL_DTYPE_BF16: np.uint16,
                                             lib.COL_DTYPE_BF16X16: np.uint16}
_ROUTING_CODES: dict[str, int] = {name: getattr(lib, f"COL_ROUTING_{name.upper()}")
                                  for name in ROUTING_MODES}
FIELD_KINDS: dict[int, str] = {lib.COL_FIELD_BYTES: "bytes", lib.COL_FIELD_U32: "u32",
                               lib.COL_FIELD_I32: "i32", lib.COL_FIELD_U64: "u64",
                               lib.COL_FIELD_F32: "f32", lib.COL_FIELD_F64: "f64"}
LAYER_KINDS: dict[int, str] = {lib.COL_LAYER_DENSE: "dense", lib.COL_LAYER_MOE: "moe"}

_ERRLEN = 512
_FIRST_PROBLEMS = 64
_DATA_CHECK_ROOM = 1 << 15  # tensors whose data findings the one data-checks pass has room for
_HEADER_READ = 4096         # bytes read for the header's tensor_count (the fixed header is smaller)
# statuses of a validation that could not read the file (or its caller's arguments): raised
_UNREADABLE = frozenset({errors.COL_ERR_IO, errors.COL_ERR_NOMEM, errors.COL_ERR_INVALID_ARG,
                         errors.COL_ERR_FILE_CHANGED})
_OPEN_PROBLEMS = 256   # findings room of Model.open's one pass (more: a second pass, with room)
# col_problem as numpy sees it, laid out from the compiled struct itself
_PROBLEM_FIELDS = dict(ffi.typeof("col_problem").fields)
_PROBLEM_DTYPE = np.dtype({
    "names": ["code", "severity", "offset", "tensor", "message"],
    "formats": ["<i4", "<i4", "<u8", f"S{_PROBLEM_FIELDS['tensor'].type.length}",
                f"S{_PROBLEM_FIELDS['message'].type.length}"],
    "offsets": [_PROBLEM_FIELDS[name].offset
                for name in ("code", "severity", "offset", "tensor", "message")],
    "itemsize": ffi.sizeof("col_problem")})


# ---------------------------------------------------------------------------------------------
# Small helpers: C strings, status, zero-copy views


def _text(chars: Any) -> str:
    """A NUL-terminated C char array as text; bytes from a corrupt file never raise."""
    return ffi.string(chars).decode("utf-8", errors="replace")


def _check_path(path: str | os.PathLike[str]) -> bytes:
    raw = os.fsencode(path)
    if b"\0" in raw:
        raise ColibriValueError(f"path contains a NUL byte: {path!r}", COL_ERR_INVALID_ARG)
    return raw


def _readonly_view(owner: Any, address: Any, nbytes: int, dtype: Any,
                   shape: tuple[int, ...]) -> np.ndarray:
    """A read-only numpy array over `nbytes` of C memory at `address`, keeping `owner` (a gc'd C
    handle) alive for as long as the array or any view derived from it exists."""
    if nbytes == 0 or address == ffi.NULL:
        return np.zeros(shape, dtype=dtype)
    # ffi.gc with a do-nothing destructor that closes over `owner`: the pointer cdata now pins the
    # handle, ffi.buffer pins the pointer, the memoryview pins the buffer, numpy pins the view.
    pinned = ffi.gc(ffi.cast("uint8_t *", address), lambda _p, _owner=owner: None)
    view = memoryview(ffi.buffer(pinned, nbytes)).toreadonly()
    return np.frombuffer(view, dtype=dtype).reshape(shape)


# ---------------------------------------------------------------------------------------------
# Value types


@dataclass(frozen=True)
class Problem:
    """One validation finding: what (code), how bad, where (byte offset, tensor), why."""

    code: int
    code_name: str
    severity: Literal["error", "warning"]
    offset: int
    tensor: str
    message: str

    @classmethod
    def list_from_c(cls, problems: Any, count: int) -> list[Problem]:
        """The first `count` findings of a C col_problem array, read in bulk (a corrupt file can
        have tens of thousands)."""
        if count == 0:
            return []
        rows = np.frombuffer(ffi.buffer(problems, count * _PROBLEM_DTYPE.itemsize),
                             dtype=_PROBLEM_DTYPE)
        warning, name_of = lib.COL_SEVERITY_WARNING, errors.status_name
        result = []
        for code, severity, offset, raw_tensor, raw_message in zip(
                rows["code"].tolist(), rows["severity"].tolist(), rows["offset"].tolist(),
                rows["tensor"].tolist(), rows["message"].tolist()):
            tensor = raw_tensor.partition(b"\0")[0].decode("utf-8", errors="replace")
            message = raw_message.partition(b"\0")[0].decode("utf-8", errors="replace")
            # the engine's message names its tensor for callers that get only the text; here the
            # tensor is a field of its own, shown beside the message
            if tensor:
                message = message.removeprefix(f"tensor '{tensor}': ")
            result.append(cls(code, name_of(code), "warning" if severity == warning else "error",
                              offset, tensor, message))
        return result

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __str__(self) -> str:
        where = f" tensor '{self.tensor}'" if self.tensor else ""
        return f"{self.severity} {self.code_name} at 0x{self.offset:X}{where}: {self.message}"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor table entry. `offset` is the file offset of the data, `table_offset` that of
    the 128-byte table entry; `dtype` is 'f32', 'f16' or 'bf16'."""

    name: str
    index: int
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    crc32: int
    table_offset: int


@dataclass(frozen=True)
class RoutingInfo:
    """One routing section entry: how layer `layer` routes (kind 'dense' or 'moe'), its whole
    rule (docs/format.md, "The routing rule"; col_routing_info). Version-1 entries read as the
    rule version 1 means. The int codes are colibri.fileformat's SCORING_*, SELECT_*, GROUP_*,
    NORM_*, SHARED_* and LAYER_FULL / LAYER_SLIDING."""

    layer: int
    kind: str
    gate_tensor: int | None
    gate_bias_tensor: int | None
    top_k: int
    n_experts: int
    scoring: int
    select_on: int
    correction_bias_tensor: int | None
    n_groups: int
    n_groups_kept: int
    group_score: int
    normalize: int
    norm_eps: float
    norm_p: float
    scale: float
    sparsemixer_eps: float
    shared: int
    attention: int
    sinks: int
    expert_bias: int
    activation: int
    act_alpha: float
    act_limit: float
    weight_inputs: int
    no_rope: int
    qk_l2_norm: int
    temperature_floor: int
    temperature_scale: float

    @property
    def has_groups(self) -> bool:
        return self.kind == "moe" and self.n_groups > 1

    def _c_info(self) -> Any:
        info = ffi.new("col_routing_info *")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "kind":
                value = {v: k for k, v in LAYER_KINDS.items()}.get(value, 0)
            elif value is None:
                value = lib.COL_NO_TENSOR
            setattr(info, f.name, value)
        return info

    def describe(self) -> str:
        """The rule in words, as the engine words it (col_routing_describe)."""
        out = ffi.new("char[]", 512)
        errors.raise_for_status(lib.col_routing_describe(self._c_info(), out, 512))
        return _text(out)

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """Every expert's score for router logits [..., n_experts] (a trace's router_logits), as
        the engine's router computes it: each logit's sigmoid, or a softmax over all of them
        (col_routing_scores). float32, the shape of `logits`."""
        if self.kind != "moe":
            raise ColibriValueError(f"layer {self.layer} is dense: no routing scores",
                                    COL_ERR_INVALID_ARG)
        rows = np.ascontiguousarray(logits, dtype=np.float32)
        if rows.ndim == 0 or rows.shape[-1] != self.n_experts:
            raise ColibriValueError(f"router logits of shape {rows.shape}, expected [..., "
                                    f"{self.n_experts}]", COL_ERR_INVALID_ARG)
        flat = rows.reshape(-1, self.n_experts)
        out = np.empty_like(flat)
        info = self._c_info()
        for i in range(flat.shape[0]):
            errors.raise_for_status(lib.col_routing_scores(
                info, ffi.from_buffer("float[]", flat[i]),
                ffi.from_buffer("float[]", out[i], require_writable=True)))
        return out.reshape(rows.shape)


@dataclass(frozen=True)
class CacheStats:
    """Expert-caching counts of a session (col_cache_stats): the LRU's capacity per MoE layer
    (0 = no expert cache), experts resident now, hits and misses of its lookups, routing
    decisions, and the decisions cached routing kept."""

    expert_cache: int
    resident: int
    hits: int
    misses: int
    decisions: int
    kept: int

    @property
    def hit_rate(self) -> float:
        """hits / lookups; NaN before any lookup."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else float("nan")


@dataclass(frozen=True)
class ThreadStats:
    """What one thread of a session did since creation or the last reset (col_thread_stats):
    the multiply-adds of the weight products' rows it ran, and the batches handed to every thread
    that it entered (the calling thread enters each; a worker the machine runs late misses some)."""

    multiply_adds: int
    batches: int


@dataclass(frozen=True)
class Section:
    """One region of a file (col_section): `name` ('header', 'routing', 'tensor_table',
    'tokenizer', 'metadata', 'data'), absolute `offset`, `size` in bytes."""

    name: str
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class HeaderField:
    """One fixed-header field decoded for a structure view. `value` is an int, a float, or the
    raw bytes (kind 'bytes'); None when the data ends before the field (`present` False)."""

    name: str
    group: str
    offset: int
    size: int
    kind: str
    present: bool
    value: int | float | bytes | None
    in_version: bool = True    # part of the header of the format version the bytes declare


@dataclass(frozen=True, eq=False)
class Trace:
    """The routing trace of a session, first axis = position. Live read-only views of session
    memory (see the module docstring); `copy()` returns an independent snapshot."""

    tokens: np.ndarray          # [pos] int32
    moe_layers: np.ndarray      # [moe_layers] int32, layer index of each MoE layer
    expert_ids: np.ndarray      # [pos, moe_layers, k] int32, in selection order
    expert_weights: np.ndarray  # [pos, moe_layers, k] float32
    router_logits: np.ndarray   # [pos, moe_layers, n_experts] float32 (router bias included)
    selection_scores: np.ndarray  # [pos, moe_layers, n_experts] float32: what the choice ranks
    chosen_groups: np.ndarray   # [pos, moe_layers, g] int32 kept groups best first, -1 none (g 0: no groups)
    bias_changed: np.ndarray    # [pos, moe_layers] bool: the correction bias changed the choice
    shared_gate: np.ndarray     # [pos, moe_layers] float32, NaN without a shared expert gate
    hidden_norm: np.ndarray     # [pos, moe_layers] float32
    phase_ns: np.ndarray        # [pos, n_layers, 5] uint64, see col_phase
    token_ns: np.ndarray        # [pos] uint64
    # expert caching (docs/interface-spec.md, "Routing modes"); all False / NaN / width 0 when
    # the session has no cached routing, width 0 without an expert cache
    cache_kept: np.ndarray      # [pos, moe_layers] bool: cached routing kept the previous set
    cache_margin: np.ndarray    # [pos, moe_layers] float32: the fresh top-k's margin over it
    fresh_ids: np.ndarray       # [pos, moe_layers, k or 0] int32: the rule's own top-k
    cache_hits: np.ndarray      # [pos, moe_layers, k or 0] bool: slot's expert was resident
    intervened: np.ndarray      # [pos, moe_layers] uint8: bit 1 << k for each intervention kind k
                                # (colibri.interventions.KINDS) that acted on the decision

    # The fields without a position axis; every other field's first axis is the position, so a
    # reader can take rows generically (the server's traces do) and new arrays come along.
    PER_MODEL: ClassVar[frozenset[str]] = frozenset({"moe_layers"})

    @property
    def n_positions(self) -> int:
        return int(self.tokens.shape[0])

    def cache_counts(self) -> tuple[int, int]:
        """(hits, lookups) of the expert cache over these positions; (0, 0) without one."""
        if not self.cache_hits.shape[2]:
            return 0, 0
        looked = self.expert_ids >= 0
        return int(self.cache_hits[looked].sum()), int(looked.sum())

    @classmethod
    def position_fields(cls) -> tuple[str, ...]:
        """Names of the per-position arrays, in declaration order."""
        return tuple(f.name for f in fields(cls) if f.name not in cls.PER_MODEL)

    def copy(self) -> Trace:
        return Trace(**{f.name: np.array(getattr(self, f.name), copy=True) for f in fields(self)})


# ---------------------------------------------------------------------------------------------
# Validation


def _collect(call: Any, capacity: int = _FIRST_PROBLEMS) -> tuple[int, list[Problem]]:
    """Run `call(problems, max_problems, n_problems_ptr)` with room for `capacity` findings; call
    again with a buffer big enough for every finding when the first one overflowed."""
    count = ffi.new("uint32_t *")
    while True:
        buf = ffi.new("col_problem[]", capacity)
        status = int(call(buf, capacity, count))
        n = int(count[0])
        if n <= capacity:
            return status, Problem.list_from_c(buf, n)
        capacity = n


def _collect_checked(call: Any, flags: int, head: Any) -> tuple[int, list[Problem]]:
    """Run `call(check_flags, problems, max_problems, n_problems_ptr)`, a whole-file validation,
    so that its data checks (`flags`: they read every tensor) run once however many findings there
    are: the structural checks alone (which read no tensor data) run first, and their count plus
    the data checks' most (two a tensor of the header's `head` bytes' tensor_count) size the room
    of the one pass with data checks."""
    if not flags:
        return _collect(lambda buf, cap, n: call(0, buf, cap, n))
    status, structural = _collect(lambda buf, cap, n: call(0, buf, cap, n))
    if status in _UNREADABLE:
        return status, structural
    declared = next((f.value for f in header_fields(head) if f.name == "tensor_count" and f.present), 0)
    room = len(structural) + 2 * min(int(declared), _DATA_CHECK_ROOM)
    return _collect(lambda buf, cap, n: call(flags, buf, cap, n), max(room, _FIRST_PROBLEMS))


def _check_flags(checksums: bool, nan_check: bool) -> int:
    return (lib.COL_CHECK_CHECKSUMS if checksums else 0) | (
        lib.COL_CHECK_NONFINITE if nan_check else 0)


def _validation_result(status: int, problems: list[Problem]) -> list[Problem]:
    if status in _UNREADABLE:
        first = problems[0].message if problems else ""
        errors.raise_for_status(status, first)
    return problems


def validate(path: str | os.PathLike[str], checksums: bool = False,
             nan_check: bool = False) -> list[Problem]:
    """Every problem of the file at `path` (errors and warnings; [] for a clean file). The
    optional data checks read every tensor. Raises ColibriIOError when the file cannot be read."""
    raw = _check_path(path)
    head = b""
    if checksums or nan_check:
        try:
            with open(path, "rb") as f:
                head = f.read(_HEADER_READ)
        except OSError:
            pass  # the engine's own open says why
    status, problems = _collect_checked(
        lambda flags, buf, cap, n: lib.col_validate_file(raw, flags, buf, cap, n),
        _check_flags(checksums, nan_check), head)
    return _validation_result(status, problems)


def validate_bytes(data: bytes | bytearray | memoryview | np.ndarray, checksums: bool = False,
                   nan_check: bool = False) -> list[Problem]:
    """Like `validate`, for a file image held in memory (any contiguous buffer)."""
    buf = ffi.from_buffer("uint8_t[]", data)
    size = len(ffi.buffer(buf))
    status, problems = _collect_checked(
        lambda flags, p, cap, n: lib.col_validate_buffer(buf, size, flags, p, cap, n),
        _check_flags(checksums, nan_check), data)
    return _validation_result(status, problems)


def _field_from_c(f: Any, data: bytes | memoryview | np.ndarray) -> HeaderField:
    kind = FIELD_KINDS.get(int(f.kind), f"kind-{int(f.kind)}")
    offset, size, present = int(f.offset), int(f.size), bool(f.present)
    value: int | float | bytes | None
    if not present:
        value = None
    elif kind in ("u32", "u64"):
        value = int(f.u)
    elif kind == "i32":
        value = int(f.i)
    elif kind in ("f32", "f64"):
        value = float(f.f)
    else:
        value = bytes(data[offset:offset + size])
    return HeaderField(_text(f.name), _text(f.group), offset, size, kind, present, value,
                       bool(f.in_version))


def header_fields(data: bytes | bytearray | memoryview | np.ndarray) -> list[HeaderField]:
    """Every field of the fixed header of the format version `data` declares (version 1's when
    it declares none it knows), decoded from `data` (any bytes, even a broken or short file)."""
    buf = ffi.from_buffer("uint8_t[]", data)
    size = len(ffi.buffer(buf))
    out = ffi.new("col_field *")
    view = memoryview(data).cast("B") if not isinstance(data, np.ndarray) else data.view(np.uint8)
    result = []
    for index in range(lib.col_header_field_count()):
        errors.raise_for_status(lib.col_header_field(buf, size, index, out))
        if out.in_version:
            result.append(_field_from_c(out, view))
    return result


# ---------------------------------------------------------------------------------------------
# Model


def _no_tensor(index: int) -> int | None:
    return None if index == lib.COL_NO_TENSOR else index


class Model:
    """A read-only, validated .colibri file mapped in memory. Open with `Model.open(path)`."""

    def __init__(self, handle: Any, path: str, problems: list[Problem] | None = None) -> None:
        # Use Model.open; `handle` is a gc'd col_model pointer.
        self._handle: Any = handle
        self._path = path
        self._problems = list(problems or [])
        hp = ffi.new("col_hparams *")
        errors.raise_for_status(lib.col_model_hparams(handle, hp))
        self._hparams = HParams(**{f.name: getattr(hp, f.name) for f in fields(HParams)})
        self._tensors = [self._tensor_from_c(i) for i in range(lib.col_model_tensor_count(handle))]
        self._by_name = {t.name: t for t in self._tensors}
        self._sections = self._sections_from_c(handle)
        self._tokenizer: Any = None
        self._tokenizer_loaded = False

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Model:
        """Map `path` and run every structural check in one pass (col_model_open_report), keeping
        every finding: a file that opens has its warnings in `problems`; a broken one raises
        ColibriFormatError with the code, offset and tensor of the first error and every finding
        in `problems`; an unreadable one raises ColibriIOError."""
        raw = _check_path(path)
        out = ffi.new("col_model **")
        count = ffi.new("uint32_t *")
        capacity = _OPEN_PROBLEMS
        while True:
            buf = ffi.new("col_problem[]", capacity)
            status = int(lib.col_model_open_report(raw, ffi.NULL, out, buf, capacity, count))
            if int(count[0]) <= capacity:
                break
            lib.col_model_close(out[0])  # more findings than room (rare): again, room for all
            capacity = int(count[0])
        problems = Problem.list_from_c(buf, int(count[0]))
        if status != errors.COL_OK:
            first = next((p for p in problems if p.severity == "error"), None)
            errors.raise_for_status(status, first.message if first else "",
                                    offset=first.offset if first else 0,
                                    tensor=first.tensor if first else "", problems=problems)
        return cls(ffi.gc(out[0], lib.col_model_close), os.fspath(path), problems)

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Refuse further calls; the mapping goes once no view or session still uses it."""
        self._handle = None

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> Model:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._tensors)} tensors"
        return f"<colibri.Model {self._path!r} {self._hparams.arch_name} {state}>"

    @property
    def handle(self) -> Any:
        """The gc'd `col_model *` (for Session); raises once closed."""
        if self._handle is None:
            raise ColibriValueError(f"model {self._path!r} is closed", COL_ERR_INVALID_ARG)
        return self._handle

    # -- description ----------------------------------------------------------------------------

    @property
    def path(self) -> str:
        return self._path

    @property
    def hparams(self) -> HParams:
        return self._hparams

    @property
    def arch(self) -> str:
        return self._hparams.arch_name

    @property
    def metadata(self) -> dict[str, Any]:
        """Hyper-parameters, `arch` (its name) and `user`: the embedded user-metadata JSON, parsed
        (None when the file has none or it is not valid UTF-8 JSON)."""
        result: dict[str, Any] = self._hparams.to_dict()
        result["arch_name"] = self._hparams.arch_name
        result["user"] = self._user_metadata()
        return result

    def _user_metadata(self) -> Any:
        raw = self._section(lib.col_model_metadata)
        if not raw:
            return None
        try:
            return json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):  # not UTF-8 JSON, an int of >4300 digits, too deep
            return None

    def _section(self, getter: Any) -> bytes:
        size = ffi.new("uint64_t *")
        ptr = getter(self.handle, size)
        return bytes(ffi.buffer(ptr, size[0])) if size[0] and ptr != ffi.NULL else b""

    @property
    def problems(self) -> list[Problem]:
        """The findings of the structural validation `open` ran: warnings only, since a file
        with an error does not open ([] for a clean file)."""
        return list(self._problems)

    @staticmethod
    def _sections_from_c(handle: Any) -> dict[str, Section]:
        out = ffi.new("col_section *")
        sections = {}
        for index in range(lib.col_model_section_count()):
            errors.raise_for_status(lib.col_model_section(handle, index, out))
            section = Section(_text(out.name), int(out.offset), int(out.size))
            sections[section.name] = section
        return sections

    @property
    def sections(self) -> dict[str, Section]:
        """The file's regions by name, in file order: 'header', 'routing', 'tensor_table',
        'tokenizer', 'metadata' (size 0 when absent) and 'data' (col_model_section)."""
        return dict(self._sections)

    @property
    def tokenizer_json(self) -> bytes:
        """The embedded tokenizer.json bytes (b"" when absent)."""
        return self._section(lib.col_model_tokenizer)

    @property
    def tokenizer(self) -> Any:
        """A `tokenizers.Tokenizer` built from the embedded tokenizer.json, or None if absent.
        Raises ColibriFormatError when the embedded bytes are not a loadable tokenizer."""
        if not self._tokenizer_loaded:
            raw = self.tokenizer_json
            if raw:
                from tokenizers import Tokenizer
                try:
                    self._tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
                except Exception as exc:  # tokenizers raises a bare Exception
                    raise ColibriFormatError(f"embedded tokenizer.json cannot be loaded: {exc}",
                                             lib.COL_ERR_UNSUPPORTED,
                                             offset=self._sections["tokenizer"].offset) from exc
            self._tokenizer_loaded = True
        return self._tokenizer

    # -- tensors --------------------------------------------------------------------------------

    def _tensor_from_c(self, index: int) -> TensorInfo:
        info = ffi.new("col_tensor_info *")
        errors.raise_for_status(lib.col_model_tensor(self.handle, index, info))
        shape = tuple(int(info.shape[d]) for d in range(int(info.ndim)))
        return TensorInfo(_text(info.name), int(info.index),
                          DTYPE_NAMES.get(int(info.dtype), f"dtype-{int(info.dtype)}"), shape,
                          int(info.offset), int(info.nbytes), int(info.crc32),
                          int(info.table_offset))

    @property
    def tensors(self) -> list[TensorInfo]:
        """Every tensor, in table (= file offset) order."""
        return list(self._tensors)

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self._tensors)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def tensor_info(self, name: str) -> TensorInfo:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in {self._path}") from None

    def tensor(self, name: str) -> np.ndarray:
        """Zero-copy, read-only view of a tensor's data in the mapping, in its storage dtype:
        float32, float16, or uint16 bit patterns for bf16 (bf16x16: in its panels' order, shaped
        as the tensor; use `tensor_f32` for values)."""
        info = self.tensor_info(name)
        c_info = ffi.new("col_tensor_info *")
        errors.raise_for_status(lib.col_model_tensor(self.handle, info.index, c_info))
        if int(c_info.dtype) in BLOCK_DTYPES:
            shape = (*info.shape[:-1], int(lib.col_dtype_row_bytes(c_info.dtype, info.shape[-1])))
            return _readonly_view(self.handle, c_info.data, info.nbytes, np.uint8, shape)
        dtype = NUMPY_DTYPES[int(c_info.dtype)]
        return _readonly_view(self.handle, c_info.data, info.nbytes, dtype, info.shape)

    def tensor_f32(self, name: str) -> np.ndarray:
        """A float32 copy of a tensor's values, whatever its storage dtype (bf16 widened exactly)."""
        data = self.tensor(name)
        info = self.tensor_info(name)
        if info.dtype in BLOCK_DTYPE_NAMES:
            from colibri.fileformat import QUANT_BY_NAME, dequantize
            return dequantize(data, QUANT_BY_NAME[info.dtype], info.shape)
        if info.dtype == "bf16x16":
            from colibri.fileformat import bf16_from_panels
            data = bf16_from_panels(data, info.shape[-1]).reshape(info.shape)
        if info.dtype in ("bf16", "bf16x16"):
            return (data.astype(np.uint32) << 16).view(np.float32)
        return data.astype(np.float32)

    def bytes(self) -> np.ndarray:
        """The whole file as a zero-copy, read-only uint8 array over the mapping."""
        size = ffi.new("uint64_t *")
        ptr = lib.col_model_bytes(self.handle, size)
        return _readonly_view(self.handle, ptr, int(size[0]), np.uint8, (int(size[0]),))

    @property
    def size(self) -> int:
        """File size in bytes (the hex view's `size()`)."""
        size = ffi.new("uint64_t *")
        lib.col_model_bytes(self.handle, size)
        return int(size[0])

    def header_fields(self) -> list[HeaderField]:
        return header_fields(self.bytes())

    def routing(self, layer: int) -> RoutingInfo:
        """The routing entry of `layer` (0..n_layers-1)."""
        if not 0 <= layer < self._hparams.n_layers:
            raise ColibriValueError(f"layer {layer} outside [0, {self._hparams.n_layers})",
                                    COL_ERR_INVALID_ARG)
        out = ffi.new("col_routing_info *")
        errors.raise_for_status(lib.col_model_routing(self.handle, layer, out))
        return RoutingInfo(int(out.layer), LAYER_KINDS.get(int(out.kind), f"kind-{int(out.kind)}"),
                           _no_tensor(int(out.gate_tensor)), _no_tensor(int(out.gate_bias_tensor)),
                           int(out.top_k), int(out.n_experts), int(out.scoring),
                           int(out.select_on), _no_tensor(int(out.correction_bias_tensor)),
                           int(out.n_groups), int(out.n_groups_kept), int(out.group_score),
                           int(out.normalize), float(out.norm_eps), float(out.norm_p),
                           float(out.scale), float(out.sparsemixer_eps), int(out.shared),
                           int(out.attention), int(out.sinks), int(out.expert_bias),
                           int(out.activation), float(out.act_alpha), float(out.act_limit),
                           int(out.weight_inputs), int(out.no_rope), int(out.qk_l2_norm),
                           int(out.temperature_floor), float(out.temperature_scale))

    def check_file(self) -> bool:
        """Is the mapping still the file it was? Raises ColibriFileChangedError when the file was
        truncated or rewritten in place (close this model and reopen the path). Returns True when
        the path now names a different file (an atomic replace: this mapping is intact, reopen to
        see the new file), False when nothing changed. Two system calls; call it freely."""
        replaced = ffi.new("uint32_t *")
        err = ffi.new("char[]", _ERRLEN)
        errors.raise_for_status(int(lib.col_model_check_file(self.handle, replaced, err, _ERRLEN)),
                                _text(err))
        return bool(replaced[0])

    def check_tensor(self, index: int, checksums: bool = True,
                     nan_check: bool = True) -> list[Problem]:
        """Data checks of tensor `index`: CRC-32 against the table and/or a NaN/Inf scan."""
        if not 0 <= index < len(self._tensors):
            raise ColibriValueError(f"tensor index {index} outside [0, {len(self._tensors)})",
                                    COL_ERR_INVALID_ARG)
        handle, flags = self.handle, _check_flags(checksums, nan_check)
        status, problems = _collect(
            lambda buf, cap, n: lib.col_model_check_tensor(handle, index, flags, buf, cap, n))
        return _validation_result(status, problems)


# ---------------------------------------------------------------------------------------------
# Session


def check_embeddings(embeddings: Any, d_model: int) -> np.ndarray:
    """Embedding rows as the engine takes them: float32 [positions, d_model], C-contiguous.
    Raises ColibriValueError naming the dtype or shape given (whether every element is finite is
    the engine's check)."""
    x = np.asarray(embeddings)
    if x.dtype != np.float32:
        raise ColibriValueError(f"embeddings must be float32, got {x.dtype}", COL_ERR_INVALID_ARG)
    if x.ndim != 2 or x.shape[1] != d_model:
        hint = "; a batch of one is x[0]" if x.ndim == 3 and x.shape[0] == 1 else ""
        raise ColibriValueError(f"embeddings of shape {list(x.shape)}, expected [positions, "
                                f"{d_model}] (the model's hidden size){hint}",
                                COL_ERR_INVALID_ARG)
    return np.ascontiguousarray(x)


def load_embeddings(path: str | os.PathLike[str], d_model: int) -> np.ndarray:
    """An embedding prompt from a .npy file: float32 [positions, d_model], at least one row (what
    `colibri run --embedding` and the debugger's run form read). Raises ColibriValueError naming
    the file and what it holds: not a .npy array (or unreadable), an .npz archive, the dtype or
    shape (check_embeddings), no rows."""
    name = os.fspath(path)
    try:
        x = np.load(name, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ColibriValueError(f"{name}: not a .npy array file ({exc})", COL_ERR_INVALID_ARG) from None
    if not isinstance(x, np.ndarray):
        raise ColibriValueError(f"{name}: an .npz archive; an embedding prompt is one .npy array",
                                COL_ERR_INVALID_ARG)
    try:
        x = check_embeddings(x, d_model)
    except ColibriValueError as exc:
        raise ColibriValueError(f"{name}: {exc.message}", COL_ERR_INVALID_ARG) from None
    if not x.shape[0]:
        raise ColibriValueError(f"{name}: no rows (shape {list(x.shape)})", COL_ERR_INVALID_ARG)
    return x


def best_kernels() -> str:
    """The kernel path a session with kernels=None runs on this machine now (CPUID, the OS
    granting AMX state, the environment variable COLIBRI_KERNELS)."""
    return KERNEL_PATHS[int(lib.col_best_kernels()) - 1]


def _set_int(config: Any, field: str, value: Any, what: str) -> None:
    """Store an int argument in a config field; its range is the engine's to judge, but it must
    be an int that the field's C type can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ColibriValueError(f"{what} must be an int, got {value!r}", COL_ERR_INVALID_ARG)
    try:
        setattr(config, field, int(value))
    except OverflowError:
        ctype = dict(ffi.typeof(config[0]).fields)[field].type.cname
        raise ColibriValueError(f"{what} {int(value)} does not fit the engine's {ctype} {field}",
                                COL_ERR_INVALID_ARG) from None


def _session_config(model: Model, routing: str, epsilon: float | None, seed: int, threads: int,
                    max_context: int, trace: bool, numerics: Any = None,
                    kernels: str | None = None, capture_hidden: bool = False,
                    cache_threshold: float = 0.0, expert_cache: int = 0) -> Any:
    """A col_session_config from the arguments. Python checks their types and names; the engine
    judges every range (col_session_config_check, the same checks as col_session_create) and
    its message becomes the ColibriValueError."""
    if kernels is not None and kernels not in KERNEL_PATHS:
        raise ColibriValueError(f"unknown kernel path {kernels!r}; expected one of "
                                f"{', '.join(KERNEL_PATHS)} or None", COL_ERR_INVALID_ARG)
    if routing not in _ROUTING_CODES:
        raise ColibriValueError(f"unknown routing {routing!r}; expected one of "
                                f"{', '.join(ROUTING_MODES)}", COL_ERR_INVALID_ARG)
    if epsilon is not None and (isinstance(epsilon, bool)
                                or not isinstance(epsilon, (int, float, np.floating))):
        raise ColibriValueError(f"epsilon must be a number, got {epsilon!r}", COL_ERR_INVALID_ARG)
    if isinstance(cache_threshold, bool) or not isinstance(cache_threshold,
                                                           (int, float, np.floating)):
        raise ColibriValueError(f"cache_threshold must be a number, got {cache_threshold!r}",
                                COL_ERR_INVALID_ARG)
    config = ffi.new("col_session_config *")
    config.routing = _ROUTING_CODES[routing]
    _set_int(config, "n_threads", threads, "threads")
    _set_int(config, "max_context", max_context, "max_context")
    _set_int(config, "seed", seed, "seed")
    config.trace = 1 if trace else 0
    config.capture_hidden = 1 if capture_hidden else 0
    config.epsilon = float(model.hparams.default_epsilon if epsilon is None else epsilon)
    config.kernels = 0 if kernels is None else KERNEL_PATHS.index(kernels) + 1
    config.cache_threshold = float(cache_threshold)
    _set_int(config, "expert_cache", expert_cache, "expert_cache")
    try:  # numerics variant (colibri.numerics): Numerics, spec string, dict or None
        as_numerics(numerics).apply(config)
    except (NumericsError, OverflowError, TypeError) as exc:
        raise ColibriValueError(f"numerics: {exc}", COL_ERR_INVALID_ARG) from None
    err = ffi.new("char[]", _ERRLEN)
    errors.raise_for_status(int(lib.col_session_config_check(model.handle, config, err, _ERRLEN)),
                            _text(err))
    return config


class Session:
    """One inference stream on a model: KV cache, scratch and routing trace, all allocated at
    creation. One thread at a time (cffi releases the GIL during each call).

    routing: 'topk' (the family's own math), 'stable' (ties broken by index with `epsilon`,
    default the model's default_epsilon), 'soft' (every expert, softmax weights), 'gumbel'
    (top-k on logits + Gumbel noise drawn from `seed`), 'cached' (top-k, but each MoE layer keeps
    the previous position's set while the fresh top-k's margin over it is below
    `cache_threshold`; docs/interface-spec.md). expert_cache: an LRU of that many resident
    experts per MoE layer, hits and misses in the trace and `cache_stats()` (0 = none).
    max_context 0 = min(model's, 4096).
    numerics: a numerics variant (colibri.numerics.Numerics or spec such as 'blocked8+fma');
    None = the default computation. kernels: the most capable kernel path to use (one of
    KERNEL_PATHS; the session runs the best of those the machine has at or below it; `kernels`
    names the one chosen); None = the best the machine has. Paths differ in the last bits.
    capture_hidden: keep every processed position's hidden state after each layer in session
    memory (`hidden_states`; max_context * n_layers * d_model floats); `capture_into` captures
    into a buffer of the caller's instead."""

    def __init__(self, model: Model, routing: RoutingName = "topk", epsilon: float | None = None,
                 seed: int = 0, threads: int = 1, max_context: int = 0, trace: bool = True,
                 numerics: Numerics | str | None = None, kernels: str | None = None,
                 capture_hidden: bool = False, *, cache_threshold: float = 0.0,
                 expert_cache: int = 0) -> None:
        config = _session_config(model, routing, epsilon, seed, threads, max_context, trace,
                                 numerics, kernels, capture_hidden, cache_threshold, expert_cache)
        model_handle = model.handle
        out = ffi.new("col_session **")
        err = ffi.new("char[]", _ERRLEN)
        status = int(lib.col_session_create(model_handle, config, out, err, _ERRLEN))
        errors.raise_for_status(status, _text(err))
        # The destructor closes over the model handle: the model is unmapped only after this
        # session is freed, whatever order the garbage collector finds them in.
        self._handle: Any = ffi.gc(out[0], lambda s, _m=model_handle: lib.col_session_free(s))
        self._model = model
        self._routing = routing
        self._numerics = as_numerics(numerics)
        self._vocab = model.hparams.vocab_size
        self._err = err
        self._busy = threading.Lock()
        self._interventions: tuple[Intervention, ...] = ()
        self._c_interventions: Any = None   # the C array the engine borrows, and its operands
        self._capture: np.ndarray | None = None   # the caller's capture buffer, kept alive

    @staticmethod
    def memory_estimate(model: Model, routing: RoutingName = "topk", epsilon: float | None = None,
                        seed: int = 0, threads: int = 1, max_context: int = 0,
                        trace: bool = True, numerics: Numerics | str | None = None,
                        kernels: str | None = None, capture_hidden: bool = False, *,
                        cache_threshold: float = 0.0, expert_cache: int = 0) -> int:
        """Bytes a Session with these arguments would allocate (KV cache, scratch, trace,
        hidden-state capture, expert caching's state)."""
        config = _session_config(model, routing, epsilon, seed, threads, max_context, trace,
                                 numerics, kernels, capture_hidden, cache_threshold,
                                 expert_cache)
        return int(lib.col_session_memory_estimate(model.handle, config))

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Refuse further calls; session memory goes once no trace view still uses it."""
        self._handle = None

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @property
    def model(self) -> Model:
        return self._model

    @property
    def routing(self) -> str:
        return self._routing

    @property
    def numerics(self) -> Numerics:
        """The numerics variant this session computes with (colibri.numerics)."""
        return self._numerics

    def _live(self) -> Any:
        if self._handle is None:
            raise ColibriValueError("session is closed", COL_ERR_INVALID_ARG)
        return self._handle

    def _acquire(self) -> None:
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("colibri.Session used from two threads at once")

    # -- inference ------------------------------------------------------------------------------

    @staticmethod
    def _int32(tokens: np.ndarray) -> np.ndarray:
        """Token ids as the engine's int32; whether each is in the vocabulary is the engine's
        check (COL_ERR_BAD_TOKEN, nothing processed)."""
        ids = np.ascontiguousarray(tokens, dtype=np.int32)
        if tokens.size and not np.array_equal(ids, tokens):
            first = int(tokens[np.argmax(ids != tokens)])
            raise ColibriValueError(f"token id {first} does not fit int32", COL_ERR_BAD_TOKEN)
        return ids

    def prefill(self, token_ids: Iterable[int] | np.ndarray, *, all_logits: bool = True,
                out: np.ndarray | None = None) -> np.ndarray:
        """Process `token_ids` at the next positions; returns float32 logits [n, vocab], one row
        per processed position. With `all_logits=False` only the last position's logits are
        computed, returned as [1, vocab] (the LM head then runs once instead of n times: on the
        0.64 B bench model a 128-token prefill is 1.07-1.2x faster; the bits of that row are the
        same). `out`: a writable C-contiguous float32 array of that shape the engine writes the
        logits into and which is returned (e.g. a view of a file's pages); None = a new array.
        Nothing is processed when it raises."""
        tokens = np.asarray(list(token_ids) if not isinstance(token_ids, np.ndarray) else token_ids)
        if tokens.ndim != 1 or (tokens.size and not np.issubdtype(tokens.dtype, np.integer)):
            raise ColibriValueError("token_ids must be a 1-D sequence of ints", COL_ERR_INVALID_ARG)
        ids = self._int32(tokens)
        return self._prefill_rows(lib.col_session_prefill, ffi.from_buffer("int32_t[]", ids),
                                  int(tokens.size), all_logits, out)

    def prefill_embeddings(self, embeddings: np.ndarray, *, all_logits: bool = True,
                           out: np.ndarray | None = None) -> np.ndarray:
        """Process embedding rows at the next positions instead of looked-up tokens: float32
        [n, d_model], what the lookup would give (times the file's embedding_scale, as
        looked-up rows are: Granite's; col_session_prefill_embeddings).
        Returns logits as `prefill` does (into `out` likewise); the trace records token -1
        there. The shape and dtype are checked here (ColibriValueError naming what was given),
        finiteness by the engine. Nothing is processed when it raises."""
        x = check_embeddings(embeddings, self._model.hparams.d_model)
        return self._prefill_rows(lib.col_session_prefill_embeddings,
                                  ffi.from_buffer("float[]", x), int(x.shape[0]), all_logits, out)

    def _logits_out(self, shape: tuple[int, ...], out: np.ndarray | None) -> np.ndarray:
        """`out` checked to be a writable C-contiguous float32 array of `shape`, or a new one."""
        if out is None:
            return np.empty(shape, dtype=np.float32)
        if not (isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == shape
                and out.flags.c_contiguous and out.flags.writeable):
            got = (f"{out.dtype} {list(out.shape)}" if isinstance(out, np.ndarray)
                   else type(out).__name__)
            raise ColibriValueError(f"out must be a writable C-contiguous float32 array of shape "
                                    f"{list(shape)}, got {got}", COL_ERR_INVALID_ARG)
        return out

    def _prefill_rows(self, prefill: Callable[..., int], rows: Any, n: int,
                      all_logits: bool, out: np.ndarray | None = None) -> np.ndarray:
        """The engine's `prefill(session, rows, n, logits or NULL, err, errlen)` on n checked
        input rows (token ids or embedding rows), returning the logits as `prefill` says."""
        logits = self._logits_out((n if all_logits else min(n, 1), self._vocab), out)
        if n == 0:
            return logits
        handle = self._live()
        self._acquire()
        try:
            status = int(prefill(
                handle, rows, n,
                ffi.from_buffer("float[]", logits, require_writable=True) if all_logits else ffi.NULL,
                self._err, _ERRLEN))
            errors.raise_for_status(status, _text(self._err))
            if not all_logits:
                ffi.memmove(ffi.from_buffer("float[]", logits, require_writable=True),
                            lib.col_session_logits(handle), logits.nbytes)
        finally:
            self._busy.release()
        return logits

    def step(self, token_id: int, *, out: np.ndarray | None = None) -> np.ndarray:
        """Process one token at the next position; returns its float32 logits [vocab] (in
        `out` when given, as `prefill` takes it)."""
        if isinstance(token_id, bool) or not isinstance(token_id, (int, np.integer)):
            raise ColibriValueError(f"token id must be an int, got {token_id!r}",
                                    COL_ERR_INVALID_ARG)
        if not -2**31 <= int(token_id) < 2**31:
            raise ColibriValueError(f"token id {int(token_id)} does not fit int32",
                                    COL_ERR_BAD_TOKEN)
        logits = self._logits_out((self._vocab,), out)
        handle = self._live()
        self._acquire()
        try:
            status = int(lib.col_session_step(
                handle, int(token_id), ffi.from_buffer("float[]", logits, require_writable=True),
                self._err, _ERRLEN))
            errors.raise_for_status(status, _text(self._err))
        finally:
            self._busy.release()
        return logits

    def greedy_steps(self, token: int, out: np.ndarray, eos: int | None = None) -> int:
        """Greedy decoding in the engine (col_session_generate): process `token`, then each
        chosen token, one step per element of `out` (a writable int32 array) at most, writing
        each step's arg-max into it, and stop after the step that chose `eos` (None: never).
        Returns the steps run. When it raises, the steps before the failing one stay processed
        (`position` counts them) and their choices are in `out`."""
        if not (out.dtype == np.int32 and out.ndim == 1 and out.flags.c_contiguous):
            raise ColibriValueError("out must be a 1-D contiguous int32 array", COL_ERR_INVALID_ARG)
        if not -2**31 <= int(token) < 2**31:
            raise ColibriValueError(f"token id {int(token)} does not fit int32", COL_ERR_BAD_TOKEN)
        steps = ffi.new("uint32_t *")
        handle = self._live()
        self._acquire()
        try:
            status = int(lib.col_session_generate(
                handle, int(token), out.size, -1 if eos is None or not 0 <= eos < 2**31 else int(eos),
                ffi.from_buffer("int32_t[]", out, require_writable=True), steps, self._err, _ERRLEN))
            errors.raise_for_status(status, _text(self._err))
        finally:
            self._busy.release()
        return int(steps[0])

    @property
    def logits(self) -> np.ndarray:
        """A copy of the logits of the most recently processed position [vocab]
        (col_session_logits)."""
        out = np.empty(self._vocab, dtype=np.float32)
        ffi.memmove(ffi.from_buffer("float[]", out, require_writable=True),
                    lib.col_session_logits(self._live()), out.nbytes)
        return out

    def generate(self, prompt: Sequence[int] | np.ndarray, max_new_tokens: int = 16, *,
                 decoding: DecodingName = "greedy", temperature: float = 1.0, seed: int = 0,
                 eos: int | None | Literal["model"] = "model", stop: StopFn | None = None,
                 on_position: OnPosition | None = None, step_prompt: bool = False,
                 keep_logits: bool = False, swap: SwapFn | None = None) -> Generation:
        """Generate up to `max_new_tokens` tokens after `prompt` (token ids, or float32 embedding
        rows [positions, d_model]), from the current position, and return the `Generation`
        (colibri.generation: positions processed, greedy or sampled decoding, stop conditions,
        the per-position callback that can pause or stop, hot-reload hand-over). `eos` defaults to the model's eos_token_id; None never stops there. A
        generation paused by `on_position` continues with its `run()`."""
        generation = Generation(
            self, prompt, max_new_tokens, decoding=decoding, temperature=temperature, seed=seed,
            eos=self._model.hparams.eos_token_id if eos == "model" else eos, stop=stop,
            step_prompt=step_prompt, keep_logits=keep_logits, swap=swap)
        generation.run(on_position)
        return generation

    def reset(self) -> None:
        """Forget every position (KV cache and trace); keep configuration and buffers."""
        handle = self._live()
        self._acquire()
        try:
            errors.raise_for_status(int(lib.col_session_reset(handle)))
        finally:
            self._busy.release()

    def _call(self, fn: Any, *args: Any) -> None:
        """One engine call taking (..., err, errlen) on the live session, under the busy lock."""
        handle = self._live()
        self._acquire()
        try:
            errors.raise_for_status(int(fn(handle, *args, self._err, _ERRLEN)), _text(self._err))
        finally:
            self._busy.release()

    # -- interventions and rewinding ----------------------------------------------------------

    @property
    def interventions(self) -> tuple[Intervention, ...]:
        """The interventions the session applies (colibri.interventions)."""
        return self._interventions

    def set_interventions(self, interventions: Sequence[Intervention]) -> None:
        """Apply `interventions` to every position processed from now on (replacing those set
        before; [] clears them). The engine judges them against the model
        (col_session_set_interventions): a refused one raises ColibriValueError naming its spec
        and field, and nothing changes. Positions already processed keep their results:
        `truncate` first to recompute them."""
        items = tuple(interventions)
        for item in items:
            if not isinstance(item, Intervention):
                raise ColibriValueError(f"not an Intervention: {item!r}", COL_ERR_INVALID_ARG)
        array = ffi.new("col_intervention[]", max(len(items), 1))
        keep: list[Any] = [array]
        for c, item in zip(array, items):
            c.kind = INTERVENTION_KINDS.index(item.kind)
            c.op = INTERVENTION_OPS.index(item.op) if item.op else 0
            c.first_position = min(item.first, 0xFFFFFFFF)
            c.last_position = lib.COL_LAST_POSITION if item.last is None else min(item.last, 0xFFFFFFFF)
            c.layer = -1 if item.layer is None else min(item.layer, 2**31 - 1)
            if item.experts:
                ids = ffi.new("int32_t[]", [min(e, 2**31 - 1) for e in item.experts])
                keep.append(ids)
                c.experts, c.n_experts = ids, len(item.experts)
            if item.values:
                values = ffi.new("float[]", list(item.values))
                keep.append(values)
                c.values, c.n_values = values, len(item.values)
        bad = ffi.new("uint32_t *")
        handle = self._live()
        self._acquire()
        try:
            status = int(lib.col_session_set_interventions(handle, array, len(items), bad,
                                                           self._err, _ERRLEN))
            if status != errors.COL_OK:
                spec = items[int(bad[0])].typed if int(bad[0]) < len(items) else ""
                errors.raise_for_status(status, f"intervention {spec!r}: {_text(self._err)}")
            self._c_interventions = keep  # the engine reads these until the next call
            self._interventions = items
        finally:
            self._busy.release()

    def truncate(self, position: int) -> None:
        """Forget the positions from `position` on (the KV cache and trace before it stay): the
        next token is processed at `position`. Abandons a position stepped layer by layer."""
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)) \
                or not 0 <= int(position) < 2**32:
            raise ColibriValueError(f"position must be an int in 0..2^32-1, got {position!r}",
                                    COL_ERR_INVALID_ARG)
        self._call(lib.col_session_truncate, int(position))

    def set_routing(self, routing: RoutingName, epsilon: float | None = None,
                    seed: int = 0) -> int:
        """Route the positions processed from now on by `routing` ('topk', 'stable' or
        'gumbel', from one of them; epsilon None = the model's default_epsilon) and return the
        first processed position the new routing decides differently (col_session_set_routing:
        the trace's router logits routed again; `position` when none, 0 without a trace).
        `truncate` there and process the rest again for a new session's bits."""
        if routing not in _ROUTING_CODES:
            raise ColibriValueError(f"unknown routing {routing!r}; expected one of "
                                    f"{', '.join(ROUTING_MODES)}", COL_ERR_INVALID_ARG)
        if epsilon is not None and (isinstance(epsilon, bool)
                                    or not isinstance(epsilon, (int, float, np.floating))):
            raise ColibriValueError(f"epsilon must be a number, got {epsilon!r}",
                                    COL_ERR_INVALID_ARG)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
                or not 0 <= int(seed) < 2**64:
            raise ColibriValueError(f"seed must be an int in 0..2^64-1, got {seed!r}",
                                    COL_ERR_INVALID_ARG)
        eps = float(self._model.hparams.default_epsilon if epsilon is None else epsilon)
        first = ffi.new("uint32_t *")
        self._call(lib.col_session_set_routing, _ROUTING_CODES[routing], eps, int(seed), first)
        self._routing = routing
        return int(first[0])

    # -- one layer at a time --------------------------------------------------------------------

    def begin_token(self, token_id: int) -> None:
        """Start `token_id` at the next position without running a layer (`step_layer` runs
        them one by one; the same bits as `step`)."""
        if isinstance(token_id, bool) or not isinstance(token_id, (int, np.integer)) \
                or not -2**31 <= int(token_id) < 2**31:
            raise ColibriValueError(f"token id must be an int32, got {token_id!r}",
                                    COL_ERR_BAD_TOKEN)
        self._call(lib.col_session_begin_token, int(token_id))

    def begin_embedding(self, row: np.ndarray) -> None:
        """`begin_token` with an embedding row instead of a token: float32 [d_model] (or
        [1, d_model]), what the lookup would produce, as `prefill_embeddings` takes it; the
        trace records token -1."""
        x = check_embeddings(np.asarray(row).reshape(1, -1) if np.ndim(row) == 1 else row,
                             self._model.hparams.d_model)
        if x.shape[0] != 1:
            raise ColibriValueError(f"one embedding row begins a position, got {x.shape[0]}",
                                    COL_ERR_INVALID_ARG)
        self._call(lib.col_session_begin_embedding, ffi.from_buffer("float[]", x))

    def step_layer(self) -> np.ndarray | None:
        """Run the next layer of the position begun with `begin_token` or `begin_embedding`. Returns None while layers
        remain, and the position's float32 logits [vocab] once its last layer has run."""
        logits = np.empty(self._vocab, dtype=np.float32)
        done = ffi.new("uint32_t *")
        self._call(lib.col_session_step_layer,
                   ffi.from_buffer("float[]", logits, require_writable=True), done)
        return logits if int(done[0]) == self._model.hparams.n_layers else None

    def rewind_layer(self) -> None:
        """Undo the last layer run of the position in progress, so the next `step_layer` runs it
        again (under the interventions set since)."""
        self._call(lib.col_session_rewind_layer)

    @property
    def layers_done(self) -> int | None:
        """Layers run of the position in progress, or None when none is in progress."""
        done = int(lib.col_session_layers_done(self._live()))
        return None if done == lib.COL_NO_LAYER else done

    @property
    def kernels(self) -> str:
        """The kernel path this session runs: 'portable', 'avx2', 'avx512f', 'avx512' or 'amx' (from CPUID and,
        for 'amx', the OS granting the tile state; the environment variable COLIBRI_KERNELS can
        lower it)."""
        return ffi.string(lib.col_session_kernels(self._live())).decode()

    @property
    def position(self) -> int:
        """Positions processed since creation or the last reset."""
        return int(lib.col_session_position(self._live()))

    def cache_stats(self, moe_index: int | None = None) -> CacheStats:
        """Expert-caching counts since creation or the last reset, of one MoE layer or of all
        of them summed (col_session_cache_stats); counted with the trace off too."""
        out = ffi.new("col_cache_stats *")
        index = -1 if moe_index is None else moe_index
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise ColibriValueError(f"moe_index must be an int, got {moe_index!r}",
                                    COL_ERR_INVALID_ARG)
        status = int(lib.col_session_cache_stats(self._live(), int(index), out)) \
            if -1 <= index < 2**31 else COL_ERR_INVALID_ARG
        errors.raise_for_status(status, f"no MoE layer {moe_index}")
        return CacheStats(int(out.expert_cache), int(out.resident), int(out.hits),
                          int(out.misses), int(out.decisions), int(out.kept))

    def thread_stats(self) -> list[ThreadStats]:
        """Each thread's counts since creation or the last reset, the calling thread's first
        (col_session_thread_stats): their multiply-adds sum to the session's weight products'
        (not the attention heads'), and their split is how much of the work each thread got."""
        handle = self._live()
        self._acquire()
        try:
            n = int(lib.col_session_thread_stats(handle, ffi.NULL, 0))
            out = ffi.new("col_thread_stats[]", n)
            lib.col_session_thread_stats(handle, out, n)
        finally:
            self._busy.release()
        return [ThreadStats(int(t.multiply_adds), int(t.batches)) for t in out]

    def capture_into(self, buffer: np.ndarray | None, first_position: int = 0) -> None:
        """Capture the hidden state after each layer into `buffer` (float32, C-contiguous,
        writable, [rows, n_layers, d_model]) from now on: row r receives position
        first_position + r when it is processed (col_session_capture). The session keeps a
        reference to the buffer until it is replaced or detached. None detaches it (capture
        goes back to the session's own buffer with capture_hidden, else stops)."""
        handle = self._live()
        hp = self._model.hparams
        if buffer is not None:
            if not isinstance(buffer, np.ndarray) or buffer.dtype != np.float32 or \
                    buffer.ndim != 3 or buffer.shape[1:] != (hp.n_layers, hp.d_model) or \
                    not buffer.flags.c_contiguous or not buffer.flags.writeable:
                raise ColibriValueError(
                    f"the capture buffer must be a writable C-contiguous float32 array of shape "
                    f"[rows, {hp.n_layers}, {hp.d_model}], got "
                    f"{getattr(buffer, 'dtype', type(buffer).__name__)} "
                    f"{getattr(buffer, 'shape', '')}", COL_ERR_INVALID_ARG)
        if isinstance(first_position, bool) or not isinstance(first_position, (int, np.integer)) \
                or not 0 <= int(first_position) < 2**32:
            raise ColibriValueError(f"first_position {first_position!r} must be an int in "
                                    f"[0, 2**32)", COL_ERR_INVALID_ARG)
        rows = 0 if buffer is None else int(buffer.shape[0])
        if buffer is not None and not 0 < rows < 2**32:
            raise ColibriValueError(f"a capture buffer of {rows} rows", COL_ERR_INVALID_ARG)
        self._acquire()
        try:
            pointer = ffi.NULL if buffer is None else ffi.from_buffer("float[]", buffer,
                                                                      require_writable=True)
            errors.raise_for_status(int(lib.col_session_capture(
                handle, pointer, int(first_position), rows, self._err, _ERRLEN)),
                _text(self._err))
            self._capture = buffer
        finally:
            self._busy.release()

    @property
    def hidden_states(self) -> np.ndarray | None:
        """The hidden state after each layer of every position processed so far, float32
        [positions, n_layers, d_model]: a live read-only view of session memory (as `trace`)
        when the session was created with capture_hidden; None without it, or while
        `capture_into` directs capture to a buffer of the caller's (read that buffer)."""
        handle = self._live()
        if self._capture is not None:
            return None
        h = ffi.new("col_hidden_view *")
        errors.raise_for_status(int(lib.col_session_hidden(handle, h)))
        if h.data == ffi.NULL:
            return None
        rows, per_row = int(h.n_rows), int(h.n_layers) * int(h.d_model)
        full = _readonly_view(handle, h.data, rows * per_row * 4, np.float32,
                              (rows, int(h.n_layers), int(h.d_model)))
        return full[:min(self.position, rows)]

    @property
    def trace(self) -> Trace | None:
        """The routing trace sliced to the positions processed so far (live read-only views), or
        None when the session was created with trace=False."""
        return self._trace(pending=False)

    def pending_trace(self) -> Trace | None:
        """Like `trace`, with one more row: the position in progress (see `begin_token`), whose
        MoE layers before `layers_done` are filled in. None without a trace or a position in
        progress."""
        return self._trace(pending=True) if self.layers_done is not None else None

    def _trace(self, pending: bool) -> Trace | None:
        handle = self._live()
        t = ffi.new("col_trace_view *")
        errors.raise_for_status(int(lib.col_session_trace(handle, t)))
        if t.capacity == 0:
            return None
        cap, n = int(t.capacity), int(t.n_positions) + (1 if pending else 0)
        n_moe, k, n_exp, n_layers = int(t.n_moe_layers), int(t.k), int(t.n_experts), int(t.n_layers)

        def view(ptr: Any, dtype: Any, *inner: int) -> np.ndarray:
            per_row = math.prod(inner) * np.dtype(dtype).itemsize
            full = _readonly_view(handle, ptr, cap * per_row, dtype, (cap, *inner))
            return full[:n]

        return Trace(
            tokens=view(t.tokens, np.int32),
            moe_layers=_readonly_view(handle, t.moe_layers, n_moe * 4, np.int32, (n_moe,)),
            expert_ids=view(t.expert_ids, np.int32, n_moe, k),
            expert_weights=view(t.expert_weights, np.float32, n_moe, k),
            router_logits=view(t.router_logits, np.float32, n_moe, n_exp),
            selection_scores=view(t.selection_scores, np.float32, n_moe, n_exp),
            chosen_groups=(view(t.chosen_groups, np.int32, n_moe, int(t.n_chosen_groups))
                           if t.n_chosen_groups else np.zeros((n, n_moe, 0), np.int32)),
            bias_changed=view(t.bias_changed, np.bool_, n_moe),
            shared_gate=view(t.shared_gate, np.float32, n_moe),
            hidden_norm=view(t.hidden_norm, np.float32, n_moe),
            phase_ns=view(t.phase_ns, np.uint64, n_layers, int(lib.COL_PHASE_COUNT)),
            token_ns=view(t.token_ns, np.uint64),
            cache_kept=(view(t.cache_kept, np.bool_, n_moe) if t.cache_kept != ffi.NULL
                        else np.zeros((n, n_moe), np.bool_)),
            cache_margin=(view(t.cache_margin, np.float32, n_moe) if t.cache_margin != ffi.NULL
                          else np.full((n, n_moe), np.nan, np.float32)),
            fresh_ids=(view(t.fresh_ids, np.int32, n_moe, k) if t.fresh_ids != ffi.NULL
                       else np.zeros((n, n_moe, 0), np.int32)),
            cache_hits=(view(t.cache_hits, np.bool_, n_moe, k) if t.cache_hits != ffi.NULL
                        else np.zeros((n, n_moe, 0), np.bool_)),
            intervened=view(t.intervened, np.uint8, n_moe),
        )


__all__ = ["KERNEL_PATHS", "CacheStats", "ColibriError", "HParams", "HeaderField", "Model",
           "Problem", "RoutingInfo", "Section", "Session", "TensorInfo", "ThreadStats", "Trace",
           "best_kernels", "check_embeddings", "header_fields", "validate", "validate_bytes"]


def measure_read_bandwidth(nbytes: int = 1 << 30, threads: int = 1, repeats: int = 5) -> float:
    """This machine's read bandwidth in bytes/s: `threads` threads sum a `nbytes` buffer, best of
    `repeats` (col_measure_read_bandwidth). Releases the GIL while it runs."""
    bw = lib.col_measure_read_bandwidth(nbytes, threads, repeats)
    if bw <= 0:
        raise ColibriError(f"bandwidth probe failed ({nbytes} bytes, {threads} threads)")
    return float(bw)


def measure_read_latency(nbytes: int = 1 << 30, repeats: int = 3) -> float:
    """This machine's memory latency in nanoseconds: one thread follows dependent loads over
    lines spread across a `nbytes` buffer in random order, in 2 MiB pages where the OS grants
    them; best of `repeats` (col_measure_read_latency). The default buffer, as the bandwidth
    probe's, is far beyond the last-level cache. Releases the GIL while it runs."""
    ns = lib.col_measure_read_latency(nbytes, repeats)
    if ns <= 0:
        raise ColibriError(f"latency probe failed ({nbytes} bytes, {repeats} repeats)")
    return float(ns)


# the arithmetic a product multiplies with (col_arith), by the name bench reports give it
ARITHMETIC = {"f32 FMA": 0, "bf16 dot": 1, "int8 dot": 2}


def measure_compute(arithmetic: str, threads: int = 1, kernels: str | None = None,
                    repeats: int = 3) -> float | None:
    """This machine's multiply-adds per second for `arithmetic` (a key of ARITHMETIC) on the
    kernel path `kernels` (None: the best this machine has), `threads` threads, best of `repeats`
    passes (col_measure_compute). None when that path has no instruction for it (the portable
    path, bf16 dot without AVX512-BF16). Releases the GIL while it runs."""
    if arithmetic not in ARITHMETIC:
        raise ValueError(f"unknown arithmetic {arithmetic!r}; one of {', '.join(ARITHMETIC)}")
    cap = 0 if kernels is None else KERNEL_PATHS.index(kernels) + 1
    rate = lib.col_measure_compute(ARITHMETIC[arithmetic], cap, threads, repeats)
    return float(rate) if rate > 0 else None
