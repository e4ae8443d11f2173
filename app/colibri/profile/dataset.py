"""Reading a dataset for a profile and cutting it into windows of tokens.

Three formats, chosen by the file's extension unless `fmt` says otherwise:
  * text (any other extension): the whole file is one document;
  * JSON Lines (`.jsonl`, `.ndjson`): one JSON object per line, its text in `field` (blank lines
    are skipped);
  * Parquet (`.parquet`, `.pq`): one document per row, its text in the string (or UTF-8 binary)
    column `field`.
Records are numbered from 1 in file order. Anything that is not text (bytes that are not UTF-8,
a line that is not a JSON object, a missing or null field, a file with no text at all) raises
`DatasetError` naming the file, the record and, where it helps, the line and byte offset.

Each document is tokenised on its own with the model's tokenizer (its post-processing included,
as `colibri run --prompt` does) and cut into consecutive windows of at most `window` tokens; a
window never spans two documents, and each window is run from an empty context.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

FORMATS = ("text", "jsonl", "parquet")
_EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
_ENCODE_BATCH = 256           # documents per tokenizer call (the tokenizer threads inside one)


class DatasetError(ValueError):
    """A dataset that cannot be profiled; the message names the file and the record."""


def detect_format(path: str, fmt: str | None = None) -> str:
    if fmt is not None and fmt != "auto":
        if fmt not in FORMATS:
            raise DatasetError(f"unknown dataset format {fmt!r}; expected one of "
                               f"{', '.join(FORMATS)}")
        return fmt
    return _EXTENSIONS.get(os.path.splitext(path)[1].lower(), "text")


@dataclass(frozen=True)
class Document:
    record: int        # 1-based record number in the file
    text: str


def _utf8(raw: bytes, where: str, base: int = 0) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{where}: not UTF-8 at byte offset {base + exc.start} "
                           f"({exc.reason})") from None


def _read_text(path: str) -> Iterator[Document]:
    with open(path, "rb") as f:
        raw = f.read()
    if not raw:
        raise DatasetError(f"{path}: empty file, no text to profile")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DatasetError(f"{path}: record 1 (line {line}): not UTF-8 at byte offset "
                           f"{exc.start} ({exc.reason})") from None
    yield Document(1, text)


def _field_text(value: Any, field: str, where: str) -> str:
    if value is None:
        raise DatasetError(f"{where}: field {field!r} is null")
    if isinstance(value, bytes):
        return _utf8(value, f"{where}: field {field!r}")
    if not isinstance(value, str):
        raise DatasetError(f"{where}: field {field!r} is a {type(value).__name__}, not text")
    return value


def _read_jsonl(path: str, field: str) -> Iterator[Document]:
    record = 0
    offset = 0
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            start, offset = offset, offset + len(raw)
            if not raw.strip():
                continue
            record += 1
            where = f"{path}: record {record} (line {line_no})"
            line = _utf8(raw, where, start)
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{where}: not valid JSON: {exc.msg} at column "
                                   f"{exc.colno}") from None
            if not isinstance(obj, dict):
                raise DatasetError(f"{where}: a JSON {type(obj).__name__}, not an object with "
                                   f"a {field!r} field")
            if field not in obj:
                keys = ", ".join(repr(k) for k in list(obj)[:8]) or "none"
                raise DatasetError(f"{where}: no field {field!r} (its fields: {keys})")
            yield Document(record, _field_text(obj[field], field, where))
    if record == 0:
        raise DatasetError(f"{path}: empty, no JSON Lines records")


def _read_parquet(path: str, field: str) -> Iterator[Document]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{path}: not a readable Parquet file: {exc}") from None
    names = pf.schema_arrow.names
    if field not in names:
        raise DatasetError(f"{path}: no field {field!r} in any record (its columns: "
                           f"{', '.join(repr(n) for n in names[:8]) or 'none'})")
    kind = pf.schema_arrow.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        raise DatasetError(f"{path}: field {field!r} holds {kind}, not text")
    record = 0
    try:
        for batch in pf.iter_batches(columns=[field], batch_size=1024):
            for value in batch.column(0).to_pylist():
                record += 1
                yield Document(record, _field_text(value, field, f"{path}: record {record}"))
    except pa.ArrowException as exc:  # e.g. a string column with bytes that are not UTF-8
        raise DatasetError(f"{path}: record {record + 1}: {exc}") from None
    if record == 0:
        raise DatasetError(f"{path}: empty, no records")


def read_documents(path: str, fmt: str | None = None, field: str | None = None
                   ) -> Iterator[Document]:
    """The documents of the dataset at `path`, in file order (see the module docstring)."""
    kind = detect_format(path, fmt)
    if not os.path.isfile(path):
        raise DatasetError(f"{path}: no such file" if not os.path.exists(path)
                           else f"{path}: not a file")
    if kind == "text":
        if field is not None:
            raise DatasetError(f"{path}: --field applies to JSON Lines and Parquet datasets; "
                               "a text file is one document")
        return _read_text(path)
    name = "text" if field is None else field
    return _read_jsonl(path, name) if kind == "jsonl" else _read_parquet(path, name)


# ---------------------------------------------------------------------------------------------
# Windows


@dataclass(frozen=True)
class Corpus:
    """A tokenised dataset cut into windows: window w is tokens[offsets[w]:offsets[w+1]], taken
    from record `records[w]` starting at its token `starts[w]`."""

    tokens: np.ndarray         # [n_tokens] int32
    offsets: np.ndarray        # [n_windows + 1] int64
    records: np.ndarray        # [n_windows] int64, 1-based record number
    starts: np.ndarray         # [n_windows] int64, first token of the window in its document
    n_records: int

    @property
    def n_windows(self) -> int:
        return int(self.records.size)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    def window(self, w: int) -> np.ndarray:
        return self.tokens[self.offsets[w]:self.offsets[w + 1]]


def tokenize(documents: Iterator[Document], tokenizer: Any, window: int, vocab_size: int,
             path: str, max_tokens: int | None = None) -> Corpus:
    """Tokenise every document and cut it into windows of at most `window` tokens, stopping
    after `max_tokens` tokens (None: all). Raises DatasetError when no token results or a token
    id falls outside the model's vocabulary."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    pieces: list[np.ndarray] = []
    records: list[int] = []
    starts: list[int] = []
    lengths: list[int] = []
    total = 0
    n_records = 0
    budget = max_tokens if max_tokens is not None else -1

    def add(batch: list[Document]) -> bool:
        nonlocal total
        for doc, enc in zip(batch, tokenizer.encode_batch([d.text for d in batch])):
            ids = np.asarray(enc.ids, dtype=np.int32)
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                bad = int(ids[(ids < 0) | (ids >= vocab_size)][0])
                raise DatasetError(f"{path}: record {doc.record}: the tokenizer gave token id "
                                   f"{bad}, outside the model's vocabulary of {vocab_size}")
            if budget >= 0:
                ids = ids[:max(budget - total, 0)]
            for start in range(0, ids.size, window):
                piece = ids[start:start + window]
                pieces.append(piece)
                records.append(doc.record)
                starts.append(start)
                lengths.append(piece.size)
            total += int(ids.size)
            if budget >= 0 and total >= budget:
                return False
        return True

    batch: list[Document] = []
    more = True
    for doc in documents:
        n_records += 1
        batch.append(doc)
        if len(batch) == _ENCODE_BATCH:
            more = add(batch)
            batch = []
            if not more:
                break
    if batch and more:
        add(batch)
    if total == 0:
        raise DatasetError(f"{path}: no text to profile ({n_records} record(s), every one "
                           "empty)" if n_records else f"{path}: empty, no records")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Corpus(np.concatenate(pieces).astype(np.int32, copy=False), offsets,
                  np.asarray(records, dtype=np.int64), np.asarray(starts, dtype=np.int64),
                  n_records)
