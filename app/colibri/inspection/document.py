"""One open file in the Inspector: its identity on disk, its model (when it opens), its problems.

`ModelDocument` owns everything the views show about one path, computed without Qt so tests and
the CLI can use it directly. Opening never raises for a bad file and reads the file once:
`Model.open` maps it and validates it in one pass that keeps every finding (a file that opens
brings its warnings, a broken one every error and warning), and the header view, the hexdump's
regions and the head bytes are read from that mapping. Only a file the engine refuses is read
again, for its first bytes, so even a broken file shows its header. `plain_explanation()` turns
the first problem into one sentence a user understands.

File-wide work (checksums, NaN scans) is a plain task function, `data_check(doc, ...)`, written
for `colibri.inspector.tasks` (progress, cancel) but free of Qt. Reloading is two steps so the
expensive one can run on a worker: `load_state(path)` builds a complete new `DocumentState`
(opened and validated), then `adopt(state)` swaps it in at once; until then the old model and
its mapping stay valid. `reload_if_changed()` does both for callers without a worker.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from colibri.engine import HeaderField, Model, Problem, header_fields
from colibri.errors import ColibriError, ColibriFormatError
from colibri.values import CancelFlag, Progress, check_cancelled

HEAD_BYTES = 4096          # bytes read for header decoding when the model does not open
_PROGRESS_UNITS = 10_000   # progress is reported in these units (Qt signals carry 32-bit ints)

# First bytes of formats people mistake for model files, for the plain explanation.
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"PK\x03\x04", "a ZIP archive, e.g. a PyTorch .pt/.bin checkpoint"),
    (b"GGUF", "a GGUF model file (llama.cpp)"),
    (b"\x80\x02", "a Python pickle, e.g. an old PyTorch checkpoint"),
    (b"\x89HDF", "an HDF5 file (Keras .h5)"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"\x89PNG", "a PNG image"),
    (b"%PDF", "a PDF document"),
    (b"\x7fELF", "an executable program"),
    (b"7z\xbc\xaf", "a 7-Zip archive"),
    (b"{", "a JSON text file, e.g. config.json or tokenizer.json"),
)


# ---------------------------------------------------------------------------------------------
# File identity


@dataclass(frozen=True)
class FileIdentity:
    """What tells us a file changed on disk: size, modification time and inode."""

    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> FileIdentity | None:
        """The identity of `path` now, or None when it cannot be stat'ed (deleted, no access)."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(int(st.st_size), int(st.st_mtime_ns), int(st.st_ino))


# ---------------------------------------------------------------------------------------------
# Document state: one complete, consistent snapshot of a file


@dataclass
class DocumentState:
    """Everything known about a file at one moment. Built whole by `load_state`, never edited."""

    identity: FileIdentity | None
    model: Model | None
    problems: list[Problem]
    header_fields: list[HeaderField]
    head: bytes                       # the first min(size, HEAD_BYTES) bytes of the file
    open_error: ColibriError | OSError | None = None


def _read_head(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(HEAD_BYTES)


def load_state(path: str | os.PathLike[str]) -> DocumentState:
    """Open, validate and decode `path` in one pass. Never raises for a bad or unreadable file:
    the failure is recorded in `open_error` and `problems`. Bounded work (header and tables, not
    tensor data)."""
    path = os.fspath(path)
    identity = FileIdentity.of(path)
    model: Model | None = None
    open_error: ColibriError | OSError | None = None
    problems: list[Problem] = []
    try:
        model = Model.open(path)
        problems = model.problems
    except ColibriFormatError as exc:
        open_error, problems = exc, exc.problems
    except (ColibriError, OSError) as exc:
        open_error = exc
    if model is not None:
        head = model.bytes()[:HEAD_BYTES].tobytes()
        fields = model.header_fields()
        # The identity that matters is the mapped file's: re-stat after mapping.
        identity = FileIdentity.of(path) or identity
    else:
        try:
            head = _read_head(path)
        except OSError as exc:
            head = b""
            open_error = open_error or exc
        fields = header_fields(head)
    return DocumentState(identity, model, problems, fields, head, open_error)


# ---------------------------------------------------------------------------------------------
# The document


class ModelDocument:
    """One path open in the Inspector. Attributes mirror the current `DocumentState`."""

    def __init__(self, path: str | os.PathLike[str], state: DocumentState | None = None) -> None:
        self.path: str = os.path.abspath(os.fspath(path))
        self._state = state if state is not None else load_state(self.path)
        self.generation = 0   # incremented by every adopt(); views use it to drop stale results

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> ModelDocument:
        return cls(path)

    # -- current state --------------------------------------------------------------------------

    @property
    def state(self) -> DocumentState:
        return self._state

    @property
    def identity(self) -> FileIdentity | None:
        return self._state.identity

    @property
    def model(self) -> Model | None:
        return self._state.model

    @property
    def problems(self) -> list[Problem]:
        return list(self._state.problems)

    @property
    def header_fields(self) -> list[HeaderField]:
        return list(self._state.header_fields)

    @property
    def head(self) -> bytes:
        return self._state.head

    @property
    def open_error(self) -> ColibriError | OSError | None:
        return self._state.open_error

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    kind = "Colibri model"      # what the file is, for sentences
    stores_checksums = True     # the data checks compare every tensor with its stored CRC-32

    @property
    def opened(self) -> bool:
        """Whether the file opened (passed validation) and its tensors can be read."""
        return self._state.model is not None

    @property
    def size(self) -> int:
        if self._state.model is not None:
            return self._state.model.size
        return self._state.identity.size if self._state.identity is not None else 0

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self._state.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self._state.problems if p.severity == "warning"]

    @property
    def status(self) -> str:
        """'unreadable', 'invalid' (errors), 'warnings' or 'valid' (structural checks only)."""
        if self._state.identity is None or (
                self._state.open_error is not None and not self._state.problems
                and self._state.model is None):
            return "unreadable"
        if self.errors or self._state.model is None:
            return "invalid"
        return "warnings" if self.warnings else "valid"

    # -- reload ---------------------------------------------------------------------------------

    def changed_on_disk(self) -> bool:
        return FileIdentity.of(self.path) != self._state.identity

    def adopt(self, state: DocumentState) -> None:
        """Swap in a state built by `load_state` (the old model is released once unused)."""
        self._state = state
        self.generation += 1

    def reload_if_changed(self) -> bool:
        """Reload when the file's identity changed: the replacement is opened and validated in
        full first, and only then swapped in. Returns True when a new state was adopted."""
        if not self.changed_on_disk():
            return False
        self.adopt(load_state(self.path))
        return True

    # -- explanation ----------------------------------------------------------------------------

    def plain_explanation(self) -> str:
        """One or two plain-language sentences on what is wrong with the file ("" when it opens
        and has no problems)."""
        return explain(self._state)

    # -- hexdump --------------------------------------------------------------------------------

    def source(self) -> Any:
        """A `HexSource` over the whole file: the model's zero-copy mapping when it opened, else
        positioned reads of the file (a file the engine refused is never mapped by it)."""
        from colibri.inspection.hexsource import BytesSource, FileSource, MappedSource
        if self._state.model is not None:
            return MappedSource(self._state.model)
        if self._state.identity is None or not os.path.isfile(self.path):
            return BytesSource(self._state.head)
        try:
            return FileSource(self.path)
        except OSError:
            return BytesSource(self._state.head)

    def regions(self) -> list[Any]:
        """Labelled byte ranges for the hexdump (`hexsource.Region`): every region of the model
        when it opened, else the fixed-header fields present in the file."""
        from colibri.inspection.hexsource import Region, regions_for
        if self._state.model is not None:
            return regions_for(self._state.model, self._state.header_fields)
        size = self.size
        return [Region(f.offset, min(f.size, size - f.offset), "header", f"header.{f.name}")
                for f in self._state.header_fields if f.present and f.offset < size]


# ---------------------------------------------------------------------------------------------
# Plain-language explanations


def _hex(data: bytes) -> str:
    return " ".join(f"{b:02X}" for b in data)


def _guess_format(head: bytes) -> str:
    for magic, what in _SIGNATURES:
        if head.startswith(magic):
            return what
    if len(head) >= 9:
        (n,) = struct.unpack_from("<Q", head, 0)
        if 2 <= n < 100_000_000 and head[8:9] == b"{":
            return "a safetensors file (convert it with `colibri convert`)"
    if head[:5].lower() in (b"<!doc", b"<html"):
        return "an HTML page (a failed download?)"
    return ""


def size_text(n: int) -> str:
    """A byte count for people: "812 bytes", "12.80 MiB"."""
    value = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n:,} bytes" if unit == "bytes" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} bytes"


def explain(state: DocumentState) -> str:
    """The plain-language sentence for a state (see ModelDocument.plain_explanation)."""
    if state.identity is None:
        reason = f": {state.open_error}" if state.open_error is not None else ""
        return f"This file cannot be read (it was moved, deleted or is not accessible){reason}."
    size = state.identity.size
    errors = [p for p in state.problems if p.severity == "error"]
    if not errors and state.model is not None:
        warnings = [p for p in state.problems if p.severity == "warning"]
        if warnings:
            return (f"This is a valid Colibri model with {len(warnings)} warning(s): the engine "
                    "loads it and ignores what the warnings describe.")
        return ""
    if size == 0:
        return "This file is empty (0 bytes); a Colibri model starts with a 256-byte header."
    first = errors[0] if errors else None
    code = first.code_name if first is not None else ""
    head = state.head
    if code == "COL_ERR_BAD_MAGIC":
        what = _guess_format(head)
        guess = f" ({what}?)" if what else ""
        return (f"This is not a Colibri model file: it starts with bytes {_hex(head[:4])}{guess} "
                "instead of 'COLI'.")
    if code == "COL_ERR_TRUNCATED":
        declared = next((int(f.value) for f in state.header_fields
                         if f.name == "file_size" and f.present and isinstance(f.value, int)), 0)
        if size < 256:
            return (f"This file is truncated: it has only {size} bytes, less than the 256-byte "
                    "Colibri header. The download or copy probably stopped early.")
        if declared > size:
            pct = 100.0 * size / declared
            return (f"This Colibri file is truncated: it has {size_text(size)} but its header "
                    f"says {size_text(declared)} ({pct:.1f}% present). The download or copy "
                    "probably stopped early; fetch the file again.")
        return ("This Colibri file is truncated: it ends before the data its header describes. "
                "The download or copy probably stopped early.")
    if code == "COL_ERR_BAD_VERSION":
        version = next((f.value for f in state.header_fields if f.name == "version"), "?")
        return (f"This Colibri file uses format version {version}; this Inspector reads version "
                "1. Update Colibri, or convert the model again with this version.")
    n = len(errors)
    if first is not None and first.code_name == "COL_ERR_CHECKSUM" and first.offset in (0xC0, 0xC4):
        which = "header" if first.offset == 0xC0 else "routing section and tensor table"
        return (f"This Colibri file is corrupt: the checksum of its {which} does not match, so "
                "some bytes changed after it was written (a bad copy or disk). The engine refuses "
                "to load it; the report below lists every problem.")
    if first is not None:
        where = f" in tensor '{first.tensor}'" if first.tensor else ""
        more = f" and {n - 1} more" if n > 1 else ""
        loaded = ("The engine refuses to load it" if state.model is None
                  else "The file's data fails a check")
        return (f"This Colibri file is damaged: {first.message}{where} (at byte 0x{first.offset:X})"
                f"{more}. {loaded}; the report below lists every problem.")
    if state.open_error is not None:
        return f"This file could not be opened as a Colibri model: {state.open_error}."
    return "This file could not be opened as a Colibri model."


# ---------------------------------------------------------------------------------------------
# Data checks (file-wide, run on a worker)


@dataclass
class DataCheckResult:
    """Per-tensor outcome of a data check: status 'ok' or 'bad' for every tensor checked."""

    generation: int
    checksums: bool
    nan_check: bool
    status: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    bytes_checked: int = 0
    complete: bool = True


def data_check(doc: ModelDocument, checksums: bool = True, nan_check: bool = True,
               ) -> Callable[[Progress, CancelFlag], DataCheckResult]:
    """A task function `fn(progress, cancelled) -> DataCheckResult` that checks every tensor's
    data (CRC-32 and/or NaN/Inf) one tensor at a time, reporting byte-weighted progress in units
    of 1/10000 and stopping between tensors when cancelled (raising colibri.values.Cancelled).
    Works on the model current when called: a later reload does not affect a running check (it
    holds its own reference)."""
    model = doc.model
    generation = doc.generation

    def run(progress: Progress, cancelled: CancelFlag) -> DataCheckResult:
        result = DataCheckResult(generation, checksums, nan_check)
        if model is None:
            result.complete = False
            return result
        tensors = model.tensors
        total = sum(t.nbytes for t in tensors) or 1
        done = 0
        progress(0, _PROGRESS_UNITS, "")
        for t in tensors:
            check_cancelled(cancelled)
            found = model.check_tensor(t.index, checksums=checksums, nan_check=nan_check)
            result.status[t.name] = "bad" if any(p.severity == "error" for p in found) else "ok"
            result.problems.extend(found)
            done += t.nbytes
            result.bytes_checked = done
            progress(done * _PROGRESS_UNITS // total, _PROGRESS_UNITS,
                     f"{t.name} ({size_text(done)} of {size_text(total)})")
        return result

    return run


def validation_phrase(problems: Sequence[Problem], opened: bool, data: DataCheckResult | None,
                      checking: bool) -> str:
    """The status bar's phrase for a file: its structural problems, whether it opened, and the
    data checks' result (None: not run) or that they are running."""
    if checking:
        return "checking data…"
    errors = sum(1 for p in problems if p.severity == "error")
    if data is not None:
        errors += sum(1 for p in data.problems if p.severity == "error")
    if not opened or errors:
        return f"invalid: {errors} error(s)" if errors else "invalid"
    n_warnings = sum(1 for p in problems if p.severity == "warning")
    warnings = f", {n_warnings} warning(s)" if n_warnings else ""
    if data is None:
        return f"structure valid, data not checked{warnings}"
    return f"valid (structure and data){warnings}"


def merge_problems(structural: Sequence[Problem], data: Sequence[Problem]) -> list[Problem]:
    """Structural problems followed by data problems not already among them."""
    seen = {(p.code, p.offset, p.tensor) for p in structural}
    return list(structural) + [p for p in data if (p.code, p.offset, p.tensor) not in seen]


__all__ = ["DataCheckResult", "DocumentState", "FileIdentity", "ModelDocument",
           "data_check", "explain", "load_state", "merge_problems", "validation_phrase"]
