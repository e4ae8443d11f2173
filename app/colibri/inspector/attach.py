"""`QtServerMonitor`: the Inspector attached to a running `colibri serve --http`.

A new data source for the debugger's views, not new views: `colibri.serving.client.Monitor`
follows the server on a worker thread (`MonitorWorker` on a `QThread`; network only there) and
sends each request's routing as the debugger's own `RoutingRecord` and `EventList`, which the
debugger's event list, token view, routing map and latency view show exactly as they show a
local run. A request table lists what the server ran and runs (status, sizes, queue wait,
prefill time, decode speed, total time, the model generation it ran on); a request is shown
when clicked, and with "Follow" on the newest one is shown as it runs. Repaints are coalesced
on a timer.

Detach stops following (the requests received stay on view); a server that goes away is named
in the status line and retried every few seconds; neither ever blocks the UI thread (a thread
still finishing a network call is left to end by itself).
"""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import QModelIndex, QObject, Qt, QThread, QTimer, Signal, Slot
from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QHBoxLayout, QHeaderView, QLabel,
                               QPushButton, QSplitter, QTableView, QTabWidget,
                               QVBoxLayout, QWidget)

from colibri.inspector.debugger.views import (QtEventList, QtLatencyView, QtRoutingHeatmap,
                                              QtTokenView)
from colibri.inspector.table_model import ColumnTableModel, Index
from colibri.inspector.readout import wrapping
from colibri.serving.client import Monitor, RemoteRequest

REPAINT_MS = 33
# Threads whose monitor was stopped but which may still be finishing a network call: kept
# referenced until they end, so closing a tab never waits on the network.
_RETIRING: set[QThread] = set()


class MonitorWorker(QObject):
    """Runs a `Monitor` on its thread and turns what it reports into signals, each carrying
    the worker's `serial` (a detached worker's late signals are told apart by it)."""

    sig_attached = Signal(int, object)         # GET /health's body
    sig_request = Signal(int, object)          # RemoteRequest
    sig_server_event = Signal(int, str, object)  # 'reload' / 'reload_refused', its data
    sig_lost = Signal(int, str)                # why the server cannot be followed now
    sig_stopped = Signal()

    def __init__(self, monitor: Monitor, serial: int) -> None:
        super().__init__()
        self.monitor = monitor
        self.serial = serial

    @Slot()
    def run(self) -> None:
        try:
            self.monitor.run(self._emit)
        except Exception as exc:  # report, never die silently
            self.sig_lost.emit(self.serial, f"monitor failed: {type(exc).__name__}: {exc}")
        self.sig_stopped.emit()

    def _emit(self, kind: str, data: Any) -> None:
        if kind == "attached":
            self.sig_attached.emit(self.serial, data)
        elif kind == "request":
            self.sig_request.emit(self.serial, data)
        elif kind == "lost":
            self.sig_lost.emit(self.serial, data)
        else:
            self.sig_server_event.emit(self.serial, kind, data)


def _ms(ns: Any) -> str:
    return f"{int(ns) / 1e6:.1f}" if ns else ""


class RequestTableModel(ColumnTableModel):
    """The requests seen, oldest first; rows are updated in place as requests progress."""

    COLUMNS = ("request", "status", "prompt", "tokens", "queue ms", "prefill ms",
               "decode tok/s", "total ms", "model gen", "finish")

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.requests: list[RemoteRequest] = []
        self._rows: dict[str, int] = {}

    def upsert(self, request: RemoteRequest, keep: int) -> int:
        """Add or replace a request's row; returns its row."""
        row = self._rows.get(request.id)
        if row is not None:
            self.requests[row] = request
            self.dataChanged.emit(self.index(row, 0), self.index(row, len(self.COLUMNS) - 1))
            return row
        if len(self.requests) >= keep:
            drop = len(self.requests) - keep + 1
            self.beginRemoveRows(QModelIndex(), 0, drop - 1)
            del self.requests[:drop]
            self._rows = {r.id: i for i, r in enumerate(self.requests)}
            self.endRemoveRows()
        row = len(self.requests)
        self.beginInsertRows(QModelIndex(), row, row)
        self.requests.append(request)
        self._rows[request.id] = row
        self.endInsertRows()
        return row

    def row_of(self, request_id: str) -> int | None:
        return self._rows.get(request_id)

    def rowCount(self, parent: Index = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.requests)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self.requests):
            return None
        request = self.requests[index.row()]
        s = request.summary
        if role == Qt.ItemDataRole.ToolTipRole:
            return request.note or s.get("error") or request.id
        if role != Qt.ItemDataRole.DisplayRole:
            return None
        t = s.get("timings", {})
        tokens = int(s.get("completion_tokens", 0))
        decode_ns = int(t.get("decode_ns", 0))
        rate = f"{(tokens - 1) / (decode_ns / 1e9):.1f}" if tokens > 1 and decode_ns else ""
        values = (request.id.rpartition("-")[2], s.get("status", ""), s.get("prompt_tokens", ""),
                  tokens, _ms(t.get("queue_ns")), _ms(t.get("prefill_ns")), rate,
                  _ms(t.get("total_ns")), s.get("model_generation", ""),
                  s.get("finish_reason") or "")
        return values[index.column()]


class QtServerMonitor(QWidget):
    """A running server's requests in the debugger's views (see the module docstring)."""

    sig_status = Signal(str)

    def __init__(self, host: str, port: int, parent: QWidget | None = None, keep: int = 200,
                 retry_s: float = 2.0) -> None:
        super().__init__(parent)
        self.host, self.port, self.keep, self.retry_s = host, port, keep, retry_s
        self.health: dict[str, Any] | None = None
        self.attached = False
        self.selected: str | None = None         # id of the request on view
        self.cursor: int | None = None           # event picked in it (None: the latest)
        self._shown: RemoteRequest | None = None
        self._worker: MonitorWorker | None = None
        self._serial = 0
        self._note = ""                          # the server's last reload, refused or not
        self._thread: QThread | None = None

        self.status = wrapping(QLabel(self))
        self.status.setObjectName("monitorStatus")
        self.detach_button = QPushButton("Detach", self)
        self.detach_button.clicked.connect(self._toggle)
        self.follow = QCheckBox("Follow the newest request", self)
        self.follow.setChecked(True)
        top = QHBoxLayout()
        top.addWidget(self.status, 1)
        top.addWidget(self.follow)
        top.addWidget(self.detach_button)

        self.requests = RequestTableModel(self)
        self.table = QTableView(self)
        self.table.setModel(self.requests)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(
            QHeaderView.ResizeMode.ResizeToContents)
        self.table.clicked.connect(lambda ix: self.show_request(self.requests.requests[ix.row()].id))
        self.event_list = QtEventList(self)
        self.token_view = QtTokenView(self)
        self.routing_map = QtRoutingHeatmap(self)
        self.latency = QtLatencyView(self)
        self.tabs = QTabWidget(self)
        self.tabs.addTab(self.routing_map, "Routing map")
        self.tabs.addTab(self.latency, "Latency")
        self.request_label = wrapping(QLabel("no request on view", self))

        left = QSplitter(Qt.Orientation.Vertical, self)
        left.addWidget(self.table)
        left.addWidget(self.request_label)
        centre = QSplitter(Qt.Orientation.Vertical, self)
        centre.addWidget(self.event_list)
        centre.addWidget(self.token_view)
        main = QSplitter(Qt.Orientation.Horizontal, self)
        for index, (widget, stretch) in enumerate(((left, 3), (centre, 3), (self.tabs, 4))):
            main.addWidget(widget)
            main.setStretchFactor(index, stretch)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(main, 1)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(REPAINT_MS)
        self._timer.timeout.connect(self._repaint)
        self.event_list.sig_event_selected.connect(self._event_selected)
        self.routing_map.sig_cell_selected.connect(self._cell_selected)
        self.tabs.currentChanged.connect(lambda _i: self._repaint())
        self._set_status(f"attaching to {self.address}…")

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    # -- following ------------------------------------------------------------------------------

    def attach(self) -> None:
        """Start following the server (again)."""
        if self._thread is not None:
            return
        self._serial += 1
        worker = MonitorWorker(Monitor(self.host, self.port, self.keep, self.retry_s),
                               self._serial)
        thread = QThread()
        thread.setObjectName("colibri-monitor")
        worker.moveToThread(thread)
        thread.started.connect(worker.run)
        # quit from the worker's own thread: the thread ends when the monitor does, whether or
        # not this widget still exists
        worker.sig_stopped.connect(thread.quit, Qt.ConnectionType.DirectConnection)
        # queued to this widget's thread (bound methods of a QObject: never run on the worker)
        worker.sig_attached.connect(self._attached)
        worker.sig_request.connect(self._request)
        worker.sig_server_event.connect(self._server_event)
        worker.sig_lost.connect(self._lost)
        self._worker, self._thread = worker, thread
        thread.start()
        self.detach_button.setText("Detach")
        self._set_status(f"attaching to {self.address}…")

    def _current(self, serial: int) -> bool:
        """A detached worker may still deliver a queued signal: only the current one counts."""
        return self._worker is not None and serial == self._worker.serial

    def detach(self, message: str = "") -> None:
        """Stop following; what was received stays on view. Never waits on the network."""
        worker, thread = self._worker, self._thread
        self._worker = self._thread = None
        self.attached = False
        self.detach_button.setText("Attach again")
        if worker is not None and thread is not None:
            worker.monitor.stop()
            _retire(thread, worker)
        n = len(self.requests.requests)
        self._set_status(message or f"detached from {self.address}; {n} requests kept on view")

    def shutdown(self) -> None:
        self.detach()

    @property
    def following(self) -> bool:
        return self._thread is not None

    def _toggle(self) -> None:
        if self.following:
            self.detach()
        else:
            self.attach()

    def _attached(self, serial: int, health: dict[str, Any]) -> None:
        if not self._current(serial):
            return
        self.health = health
        self.attached = True
        self._note = ""
        refused = health.get("reload", {}).get("refused")
        if refused:
            self._note = f"last reload refused: {refused}"
        self._set_status(self._attached_text())

    def _attached_text(self) -> str:
        model = (self.health or {}).get("model", {})
        requests = self.requests.requests
        running = sum(r.status == "running" for r in requests)
        waiting = sum(r.status == "queued" for r in requests)
        text = (f"attached to {self.address}: {model.get('name')} ({model.get('arch')}), model "
                f"generation {model.get('generation')}; {len(requests)} requests on view, "
                f"{running} running, {waiting} waiting")
        return f"{text}; {self._note}" if self._note else text

    def _lost(self, serial: int, message: str) -> None:
        if not self._current(serial):
            return
        self.attached = False
        n = len(self.requests.requests)
        self._set_status(f"{message} ({n} requests kept on view)")

    def _server_event(self, serial: int, kind: str, data: dict[str, Any]) -> None:
        if not self._current(serial) or self.health is None:
            return
        if kind == "reload":
            self.health.setdefault("model", {})["generation"] = data.get("generation")
            self._note = f"reloaded {data.get('path')}"
        elif kind == "reload_refused":
            self._note = f"refused a reload: {data.get('message')}"
        self._set_status(self._attached_text())

    def _request(self, serial: int, request: RemoteRequest) -> None:
        if not self._current(serial):
            return
        row = self.requests.upsert(request, self.keep)
        if self.attached:
            self.status.setText(self._attached_text())
        if self.selected is None or (self.follow.isChecked() and request.id != self.selected
                                     and request.status != "queued"):
            self.show_request(request.id, keep_cursor=False)
            self.table.selectRow(row)
        elif request.id == self.selected:
            self._shown = request
            self._schedule()

    # -- what is on view ------------------------------------------------------------------------

    def show_request(self, request_id: str, keep_cursor: bool = False) -> None:
        row = self.requests.row_of(request_id)
        if row is None:
            return
        if request_id != self.selected:
            self.event_list.set_events(None, None)  # another request: rebuild the table
        self.selected = request_id
        if not keep_cursor:
            self.cursor = None
        self._shown = self.requests.requests[row]
        self._repaint()

    @property
    def shown(self) -> RemoteRequest | None:
        return self._shown

    def _event_selected(self, index: int) -> None:
        self.cursor = index
        self.follow.setChecked(False)  # the user is reading an event: stop jumping away
        self._repaint()

    def _cell_selected(self, position: int, moe_index: int) -> None:
        shown = self._shown
        if shown is not None and shown.events is not None:
            self._event_selected(shown.events.index_of(position, moe_index))

    def _schedule(self) -> None:
        if not self._timer.isActive():
            self._timer.start()

    def _repaint(self) -> None:
        request = self._shown
        events = request.events if request is not None else None
        cursor = self.cursor
        if events is not None and len(events):
            cursor = len(events) - 1 if cursor is None else min(cursor, len(events) - 1)
        else:
            cursor = None
        self.event_list.set_events(events, cursor)
        if cursor is not None:  # after a reset the table lays its rows out later: scroll then
            QTimer.singleShot(0, self, lambda c=cursor: self._scroll_to(c))
        self.token_view.set_event(events[cursor] if events is not None and cursor is not None
                                  else None)
        current = self.tabs.currentWidget()
        if current is self.routing_map:
            self.routing_map.set_events(events, cursor)
        elif current is self.latency:
            self.latency.set_events(events, cursor)
        self.request_label.setText(self._describe(request))

    def _scroll_to(self, cursor: int) -> None:
        model = self.event_list.model
        if cursor < model.rowCount():
            self.event_list.table.scrollTo(model.index(cursor, 0))

    @staticmethod
    def _describe(request: RemoteRequest | None) -> str:
        if request is None:
            return "no request on view"
        s = request.summary
        t = s.get("timings", {})
        parts = [f"{request.id}: {s.get('status')}", f"{s.get('prompt_tokens')} prompt tokens",
                 f"{s.get('completion_tokens')} generated of {s.get('max_tokens')}"]
        if t.get("total_ns"):
            parts.append(f"{_ms(t['total_ns'])} ms (queue {_ms(t.get('queue_ns'))}, prefill "
                         f"{_ms(t.get('prefill_ns'))}, decode {_ms(t.get('decode_ns'))})")
        if s.get("reloads"):
            parts.append(f"{s['reloads']} reload(s) during it")
        if s.get("error"):
            parts.append(f"error: {s['error']}")
        if request.note:
            parts.append(request.note)
        return "; ".join(parts)

    def _set_status(self, text: str) -> None:
        self.status.setText(text)
        self.sig_status.emit(text)


def _retire(thread: QThread, worker: MonitorWorker) -> None:
    """Keep a stopped monitor's thread (and worker) referenced until the thread ends."""
    _RETIRING.add(thread)

    def ended() -> None:
        _RETIRING.discard(thread)
        worker.deleteLater()

    thread.finished.connect(ended)
    if thread.isFinished():
        ended()


def wait_for_retired(timeout_s: float = 10.0) -> None:
    """At exit: give stopped monitors' threads up to `timeout_s` to finish their network call."""
    deadline = time.monotonic() + timeout_s
    for thread in list(_RETIRING):
        thread.wait(max(int((deadline - time.monotonic()) * 1000), 0))


__all__ = ["MonitorWorker", "QtServerMonitor", "RequestTableModel", "wait_for_retired"]
