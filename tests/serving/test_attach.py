"""The Inspector attached to a real server (File > Attach): requests appear live in the request
table and in the debugger's own views with the engine's routing; detaching keeps them; a server
that goes away, or was never there, is named in the status line; the UI thread stays free."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from colibri.engine import Model, Session
from colibri.inspector.attach import QtServerMonitor
from colibri.inspector.main_window import MainWindow
from colibri.serving.client import Monitor, RemoteRequest

from server_helpers import MODEL, RunningServer
from tiny_models import live_copy, replace_with

WAIT_MS = 60_000


pytestmark = pytest.mark.usefixtures("inspector_settings")


@pytest.fixture
def model_path(tiny_model_path: Callable[..., Path]) -> Path:
    return tiny_model_path("mixtral", **MODEL)


def finished(monitor: QtServerMonitor) -> list[RemoteRequest]:
    return [r for r in monitor.requests.requests if r.status == "finished"]


def test_attach_shows_each_request_live_in_the_debugger_views(
        qtbot, window: MainWindow, serve: Callable[..., RunningServer], model_path: Path) -> None:
    server = serve(model_path)
    before = server.client.complete([1, 2, 3], max_tokens=4, temperature=0)  # served earlier
    monitor = window.attach(server.address)
    assert monitor is not None and window.files.currentWidget() is monitor
    assert window.monitors() == [monitor] and window.views() == []
    qtbot.waitUntil(lambda: monitor.attached and len(finished(monitor)) == 1, timeout=WAIT_MS)
    assert model_path.name in monitor.status.text()

    prompt = [5, 9, 2, 7]
    answers = [server.client.complete(prompt, max_tokens=n, temperature=0) for n in (3, 6)]
    qtbot.waitUntil(lambda: len(finished(monitor)) == 3, timeout=WAIT_MS)
    ids = [r.id for r in monitor.requests.requests]
    assert ids == [before["id"], *(a["id"] for a in answers)]
    # following the newest request: the last one is on view, in the debugger's views
    qtbot.waitUntil(lambda: monitor.shown is not None and monitor.shown.id == ids[-1]
                    and monitor.shown.status == "finished", timeout=WAIT_MS)
    shown = monitor.shown
    assert shown is not None and shown.record is not None and shown.events is not None
    with Model.open(model_path) as model:
        session = Session(model, max_context=16)
        session.generate(prompt, 6)
        want = session.trace.copy()
    assert shown.record.n_positions == want.n_positions == len(prompt) + 5
    assert shown.record.expert_ids.tobytes() == want.expert_ids.tobytes()
    assert shown.record.router_logits.tobytes() == want.router_logits.tobytes()
    qtbot.waitUntil(lambda: monitor.event_list.model.rowCount() == len(shown.events),
                    timeout=WAIT_MS)
    assert len(shown.events) == want.n_positions * 2
    last = shown.events[len(shown.events) - 1]
    assert monitor.token_view.title.text() and str(last.position) in monitor.token_view.title.text()
    monitor.tabs.setCurrentWidget(monitor.latency)
    qtbot.waitUntil(lambda: "tok/s" in monitor.latency.summary.text(), timeout=WAIT_MS)
    # the request table: one row per request, with its latency
    model = monitor.requests
    row = model.row_of(ids[-1])
    columns = {name: model.data(model.index(row, c)) for c, name in enumerate(model.COLUMNS)}
    assert columns["status"] == "finished" and columns["tokens"] == 6
    assert float(columns["total ms"]) > 0 and columns["finish"] == "length"
    # clicking an older request shows it
    monitor.show_request(ids[0])
    assert monitor.shown is not None and monitor.shown.record is not None
    assert monitor.shown.record.n_positions == 3 + 4 - 1

    # detaching keeps what was received; attaching again resumes
    monitor.detach()
    assert not monitor.following and "3 requests kept on view" in monitor.status.text()
    server.client.complete([4], max_tokens=2, temperature=0)
    qtbot.wait(300)
    assert len(monitor.requests.requests) == 3
    monitor.attach()
    qtbot.waitUntil(lambda: len(finished(monitor)) == 4, timeout=WAIT_MS)


def test_a_running_request_grows_live(qtbot, window: MainWindow,
                                      serve: Callable[..., RunningServer]) -> None:
    demo = Path(__file__).resolve().parents[2] / "resources" / "demo" / "demo.colibri"
    server = serve(demo)
    monitor = window.attach(server.address)
    assert monitor is not None
    qtbot.waitUntil(lambda: monitor.attached, timeout=WAIT_MS)
    result: list[dict] = []
    worker = threading.Thread(target=lambda: result.append(server.client.complete(
        "import os", max_tokens=1500, temperature=0)))
    worker.start()
    sizes: list[int] = []

    def running_rows() -> bool:
        shown = monitor.shown
        if shown is not None and shown.status == "running" and shown.record is not None:
            sizes.append(shown.record.n_positions)
        return len(set(sizes)) >= 3

    qtbot.waitUntil(running_rows, timeout=WAIT_MS)  # seen at three lengths while it ran
    worker.join(120)
    qtbot.waitUntil(lambda: monitor.shown is not None and monitor.shown.status == "finished",
                    timeout=WAIT_MS)
    assert monitor.shown.record.n_positions == 2 + 1500 - 1
    assert sizes == sorted(sizes)


def test_reloads_show_in_the_status_and_the_request_table(
        qtbot, window: MainWindow, serve: Callable[..., RunningServer],
        tiny_model: Callable[..., Any], tmp_path: Path) -> None:
    live = live_copy(tiny_model("mixtral", seed=1, **MODEL).path, tmp_path)
    server = serve(live)
    monitor = window.attach(server.address)
    assert monitor is not None
    qtbot.waitUntil(lambda: monitor.attached, timeout=WAIT_MS)
    replace_with(tiny_model("mixtral", seed=2, **MODEL).path, live)
    server.signal(signal.SIGUSR1)
    qtbot.waitUntil(lambda: "model generation 1" in monitor.status.text(), timeout=WAIT_MS)
    assert f"reloaded {live}" in monitor.status.text()
    server.client.complete([1, 2], max_tokens=2)
    qtbot.waitUntil(lambda: len(finished(monitor)) == 1, timeout=WAIT_MS)
    table = monitor.requests
    assert table.data(table.index(0, table.COLUMNS.index("model gen"))) == 1


def test_a_server_that_goes_away_is_named_and_found_again(
        qtbot, window: MainWindow, serve: Callable[..., RunningServer], model_path: Path,
        tmp_path: Path) -> None:
    server = serve(model_path)
    server.client.complete([1, 2], max_tokens=2)
    monitor = window.attach(server.address)
    assert monitor is not None
    qtbot.waitUntil(lambda: len(finished(monitor)) == 1, timeout=WAIT_MS)
    server.stop()
    qtbot.waitUntil(lambda: "retrying" in monitor.status.text(), timeout=WAIT_MS)
    assert server.address in monitor.status.text()
    assert "1 requests kept on view" in monitor.status.text() and not monitor.attached
    assert len(monitor.requests.requests) == 1
    window.close_current()  # closing the tab while it retries never waits on the network
    assert window.monitors() == []


def test_attaching_to_nothing_says_so_without_blocking(qtbot, window: MainWindow) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monitor = window.attach(f"127.0.0.1:{port}")
    assert monitor is not None
    # the connection is the worker's to make: attach returns before its answer reaches the UI
    assert "cannot reach" not in monitor.status.text()
    qtbot.waitUntil(lambda: "connection refused" in monitor.status.text(), timeout=WAIT_MS)
    assert f"cannot reach 127.0.0.1:{port}" in monitor.status.text()
    monitor.detach()
    assert "detached" in monitor.status.text()


def test_the_attach_action_is_in_the_file_menu(window: MainWindow) -> None:
    titles = [a.text() for a in window.menuBar().actions()[0].menu().actions()]
    assert "&Attach to Server…" in titles
    assert window.attach_action.shortcut().toString() == "Ctrl+Shift+A"


def test_monitor_emits_requests_without_qt(serve: Callable[..., RunningServer],
                                           model_path: Path) -> None:
    server = serve(model_path)
    monitor = Monitor("127.0.0.1", server.port)
    seen: list[tuple[str, object]] = []
    thread = threading.Thread(target=monitor.run, args=(lambda k, d: seen.append((k, d)),))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not any(k == "attached" for k, _ in seen):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        body = server.client.complete([3, 1, 4, 1, 5], max_tokens=3, temperature=0)
        while not any(k == "request" and d.id == body["id"] and d.status == "finished"
                      for k, d in seen):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        monitor.stop()
        thread.join(30)
    assert not thread.is_alive()
    states = [d.status for k, d in seen if k == "request" and d.id == body["id"]]
    assert states[0] == "queued" and states[-1] == "finished"
    last = [d for k, d in seen if k == "request" and d.id == body["id"]][-1]
    assert last.record is not None and np.array_equal(last.record.tokens[:5], [3, 1, 4, 1, 5])
