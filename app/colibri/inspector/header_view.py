"""The header view: every fixed-header field of one file, as a hex editor's structure template.

`QtHeaderView` shows a `ModelDocument`'s header in a tree: one branch per field group (the
engine's `HeaderField.group`), one row per field with its offset, size, raw bytes and decoded
value, then the decoded hyper-parameters and the user metadata (a JSON tree). It decodes
nothing itself: values come from the engine (`colibri.header_fields`, `Model.hparams`,
`Model.metadata`); this file only formats them. The fields come from the file's first bytes, so
a corrupt file still shows its header. A file that opens also gets a "Routing" branch: the
family, then each layer's routing entry (its offset and size in the routing section) with the
rule in the engine's words (`RoutingInfo.describe`, col_routing_describe). Selecting a field or a
routing entry emits `sig_field_selected(offset, size)`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QHeaderView, QTreeWidget, QTreeWidgetItem,
                               QVBoxLayout, QWidget)

from colibri.engine import HeaderField, Model
from colibri.fileformat import routing_entry_size
from colibri.inspection.document import ModelDocument
from colibri.inspection.values import format_scalar
from colibri.values import ARCH_NAMES

# The decoded value before the raw bytes: the value is what a reader wants, the bytes are also
# in the hexdump beside this view.
COLUMNS = ("Field", "Offset", "Size", "Value", "Raw bytes")
VALUE_COLUMN, RAW_COLUMN = COLUMNS.index("Value"), COLUMNS.index("Raw bytes")
FIELD_ROLE = Qt.ItemDataRole.UserRole          # the HeaderField of a field row
RANGE_ROLE = Qt.ItemDataRole.UserRole + 1      # (offset, size) of a routing entry row
_RAW_SHOWN = 16                                # raw bytes shown before eliding
_BYTE_COUNTS = frozenset({"tokenizer_size", "metadata_size", "file_size"})

FLAG_NAMES = ("NORM_TOPK", "TIED_EMBEDDINGS", "SHARED_EXPERT", "SHARED_EXPERT_GATE", "QKV_BIAS",
              "O_BIAS", "QK_NORM_HEAD", "QK_NORM_FULL", "OUTPUT_BIAS")
GROUP_TITLES = {"identity": "Identity", "hyper-parameters": "Hyper-parameters (header)",
                "sections": "Sections", "rope": "RoPE", "tokens": "Special tokens",
                "integrity": "Integrity", "reserved": "Reserved"}


def format_value(f: HeaderField) -> str:
    """A field's decoded value as shown: names for enums and flags, hex next to offsets."""
    v = f.value
    if not f.present or v is None:
        return "(beyond the end of the file)"
    if isinstance(v, bytes):
        if f.name == "magic":
            text = "".join(chr(b) if 32 <= b < 127 else "." for b in v)
            return f"'{text}'" + ("" if v == b"COLI" else "  (expected 'COLI')")
        if not any(v):
            return f"{len(v)} zero bytes"
        return v[:_RAW_SHOWN].hex(" ") + (" …" if len(v) > _RAW_SHOWN else "")
    if isinstance(v, float):
        return format_scalar(np.float32(v))   # a float32 field, as the CLI prints it: 1e-05
    if f.name == "arch":
        return f"{v} ({ARCH_NAMES.get(v, 'unknown')})"
    if f.name == "flags":
        names = [n for bit, n in enumerate(FLAG_NAMES) if v & (1 << bit)]
        unknown = v & ~((1 << len(FLAG_NAMES)) - 1)
        if unknown:
            names.append(f"unknown 0x{unknown:X}")
        return f"0x{v:X} ({' | '.join(names) or 'none'})"
    if f.name.endswith("_crc32"):
        return f"0x{v:08X}"
    if f.name.endswith("_offset") or f.name in _BYTE_COUNTS:
        return f"{v:,} (0x{v:X})"
    return str(v)


class QtHeaderView(QWidget):
    """The header structure tree of one `ModelDocument` (see the module docstring)."""

    sig_field_selected = Signal("qlonglong", "qlonglong")   # offset, size

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.tree = QTreeWidget()
        self.tree.setObjectName("headerTree")
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(list(COLUMNS))
        self.tree.setAlternatingRowColors(True)
        self.tree.setUniformRowHeights(True)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        header = self.tree.header()
        # field, offset, size and value as wide as their text (in whatever font the style
        # sheet gives), the raw bytes the rest
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.tree)
        self.tree.currentItemChanged.connect(self._current_changed)
        self._field_items: dict[str, QTreeWidgetItem] = {}
        self._routing_items: list[QTreeWidgetItem] = []

    # -- input ----------------------------------------------------------------------------------

    def set_document(self, doc: ModelDocument | None) -> None:
        self.tree.clear()
        self._field_items = {}
        self._routing_items = []
        if doc is None:
            return
        self._add_fields(doc)
        model = doc.model
        if model is not None:
            self._add_routing(model)
            self._add_hparams(model.metadata)
            self._add_json(self._branch("User metadata", "json"), model.metadata.get("user"))
        self.tree.expandToDepth(0)

    # -- queries (tests, main window) -----------------------------------------------------------

    def field_item(self, name: str) -> QTreeWidgetItem:
        """The row of header field `name` (KeyError if absent)."""
        return self._field_items[name]

    def field(self, name: str) -> HeaderField:
        """The engine's decoded field behind row `name` (a u64 does not fit a QVariant, so
        the value is kept as the Python object)."""
        field = self._field_items[name].data(0, FIELD_ROLE)
        assert isinstance(field, HeaderField)
        return field

    def field_names(self) -> list[str]:
        return list(self._field_items)

    def routing_rows(self) -> list[tuple[str, str]]:
        """(first column, value) of each row of the Routing branch, in order ([] before a file
        opens)."""
        for i in range(self.tree.topLevelItemCount()):
            branch = self.tree.topLevelItem(i)
            if branch.data(0, Qt.ItemDataRole.UserRole + 2) == "routing":
                return [(branch.child(j).text(0), branch.child(j).text(VALUE_COLUMN))
                        for j in range(branch.childCount())]
        return []

    def select_routing_entry(self, layer: int) -> None:
        """Make layer `layer`'s routing entry current, as a click would."""
        self.tree.setCurrentItem(self._routing_items[layer])

    def select_field(self, name: str) -> None:
        """Make field `name` current, as a click would (emits sig_field_selected)."""
        self.tree.setCurrentItem(self._field_items[name])

    # -- internals ------------------------------------------------------------------------------

    def _branch(self, title: str, key: str) -> QTreeWidgetItem:
        item = QTreeWidgetItem(self.tree, [title])
        item.setFirstColumnSpanned(True)
        item.setData(0, Qt.ItemDataRole.UserRole + 2, key)
        font = item.font(0)
        font.setBold(True)
        item.setFont(0, font)
        return item

    def _add_fields(self, doc: ModelDocument) -> None:
        groups: dict[str, QTreeWidgetItem] = {}
        head = doc.head
        for f in doc.header_fields:
            if f.group not in groups:
                groups[f.group] = self._branch(GROUP_TITLES.get(f.group, f.group), f.group)
            raw = head[f.offset:f.offset + min(f.size, _RAW_SHOWN)] if f.present else b""
            raw_text = raw.hex(" ").upper() + (" …" if f.present and f.size > _RAW_SHOWN else "")
            item = QTreeWidgetItem(groups[f.group], [
                f.name, f"0x{f.offset:03X}", str(f.size), format_value(f), raw_text])
            item.setData(0, FIELD_ROLE, f)
            item.setToolTip(0, f"{f.kind} at 0x{f.offset:X}, {f.size} bytes")
            if not f.present:
                item.setDisabled(True)
            self._field_items[f.name] = item

    def _add_routing(self, model: Model) -> None:
        branch = self._branch("Routing", "routing")
        hp = model.hparams
        QTreeWidgetItem(branch, ["family", "", "", hp.arch_name, ""])
        start = model.sections["routing"].offset
        size = routing_entry_size(hp.version)
        for layer in range(hp.n_layers):
            offset = start + layer * size
            item = QTreeWidgetItem(branch, [f"layer {layer}", f"0x{offset:03X}", str(size),
                                            model.routing(layer).describe(), ""])
            item.setData(0, RANGE_ROLE, (offset, size))
            item.setToolTip(VALUE_COLUMN, item.text(VALUE_COLUMN))
            self._routing_items.append(item)

    def _add_hparams(self, metadata: dict[str, Any]) -> None:
        branch = self._branch("Hyper-parameters (decoded)", "hparams")
        for key, value in metadata.items():
            if key != "user":
                shown = format_scalar(np.float32(value)) if isinstance(value, float) else value
                QTreeWidgetItem(branch, [key, "", "", str(shown), ""])

    def _add_json(self, parent: QTreeWidgetItem, value: Any) -> None:
        if value is None:
            QTreeWidgetItem(parent, ["(none)", "", "", "no user metadata, or not valid JSON", ""])
            return
        if isinstance(value, dict):
            for key, child in value.items():
                self._add_json_item(parent, str(key), child)
        elif isinstance(value, list):
            for i, child in enumerate(value):
                self._add_json_item(parent, f"[{i}]", child)
        else:
            QTreeWidgetItem(parent, ["", "", "", json.dumps(value), ""])

    def _add_json_item(self, parent: QTreeWidgetItem, key: str, value: Any) -> None:
        if isinstance(value, (dict, list)):
            kind = f"{{{len(value)}}}" if isinstance(value, dict) else f"[{len(value)}]"
            item = QTreeWidgetItem(parent, [key, "", "", kind, ""])
            self._add_json(item, value)
        else:
            QTreeWidgetItem(parent, [key, "", "", json.dumps(value, ensure_ascii=False), ""])

    def _current_changed(self, current: QTreeWidgetItem | None, _previous: Any) -> None:
        if current is None:
            return
        f = current.data(0, FIELD_ROLE)
        if isinstance(f, HeaderField) and f.present:
            self.sig_field_selected.emit(f.offset, f.size)
        entry = current.data(0, RANGE_ROLE)
        if isinstance(entry, tuple):
            self.sig_field_selected.emit(*entry)
