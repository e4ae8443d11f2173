#!/usr/bin/env python3
"""How long opening a big GGUF or safetensors file takes (validation and header parse only).

Builds, in a temporary directory, files shaped like real ones but sparse (the tensor data is a
hole, so a 20 GB file costs nothing): a GGUF with a Qwen-sized vocabulary (151 936 tokens,
151 387 merges, token types) and 579 tensors over 20 GB, and a safetensors checkpoint of 20 GB
in 4 shards with 1 000 tensors each. Prints the median of `--repeats` opens of each, and with
`--gguf-reader` the `gguf` package's GGUFReader on the same GGUF for comparison (slow: over a
minute). The Inspector's first view needs the open to be well under 300 ms.

`--inspector` opens each file in the Inspector (offscreen, in this process) and prints, median
of `--repeats`, when the tab first painted, when it painted with the file's content (the
headers are read on a worker, so the tab paints before them), the UI thread's CPU time until
then and the longest garbage collection meanwhile (it holds the GIL, so it stops the UI
thread wherever it runs; `--no-settle` leaves start-up's objects in every collection's walk,
as colibri-inspector does not); it adds a checkpoint of 19 200 tensors (4 shards).

    python tools/bench_formats.py [--repeats 5] [--inspector] [--gguf-reader]
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))

from colibri.formats import gguf_file, safetensors_file  # noqa: E402

GB = 10 ** 9


def gstr(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def big_gguf(path: Path, n_vocab: int = 151_936, n_merges: int = 151_387,
             n_tensors: int = 579, total: int = 20 * GB) -> None:
    kvs = [gstr("general.architecture") + struct.pack("<I", 8) + gstr("qwen2moe"),
           gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, n_vocab)
           + b"".join(gstr(f"tok{i}") for i in range(n_vocab)),
           gstr("tokenizer.ggml.merges") + struct.pack("<IIQ", 9, 8, n_merges)
           + b"".join(gstr(f"a{i} b{i}") for i in range(n_merges)),
           gstr("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 5, n_vocab)
           + struct.pack(f"<{n_vocab}i", *([1] * n_vocab))]
    per = total // n_tensors // 512 * 512  # [256, per / 512] F16 = per bytes
    infos = b""
    for i in range(n_tensors):
        infos += gstr(f"blk.{i // 12}.t{i % 12}.weight") + struct.pack("<IQQIQ", 2, 256,
                                                                       per // 512, 1, i * per)
    head = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kvs)) + b"".join(kvs) + infos
    data = -(-len(head) // 32) * 32
    with open(path, "wb") as f:
        f.write(head + bytes(data - len(head)))
        f.truncate(data + n_tensors * per)


def big_checkpoint(directory: Path, shards: int = 4, per_shard: int = 1000,
                   total: int = 20 * GB) -> None:
    size = total // shards // per_shard // 2 * 2
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header = {f"model.layers.{s}.t{i}.weight": {"dtype": "BF16", "shape": [size // 2],
                                                     "data_offsets": [i * size, (i + 1) * size]}
                  for i in range(per_shard)}
        raw = json.dumps(header).encode()
        with open(directory / name, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + per_shard * size)
        weight_map.update({k: name for k in header})
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": shards * per_shard * size}, "weight_map": weight_map}))


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def inspector_first_view(path: Path, settle: bool = True
                         ) -> tuple[float, float, float, float]:
    """Seconds from asking the main window to open `path` until its window first painted, and
    until it painted with the file's content (document read, table filled); the UI thread's
    CPU seconds until then; and the longest garbage collection meanwhile (any thread: it holds
    the GIL)."""
    import gc
    import os
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("COLIBRI_INSPECTOR_SETTINGS", tempfile.mkdtemp())
    from PySide6.QtWidgets import QApplication

    from colibri.inspector.foreign_view import QtForeignFileView
    from colibri.inspector.main_window import MainWindow, freeze_long_lived_objects
    app = QApplication.instance() or QApplication([])
    window = MainWindow()
    window.persist = False
    if settle:
        freeze_long_lived_objects()   # as colibri-inspector does once its window is built
    window.resize(1600, 900)
    window.show()
    app.processEvents()
    pauses = [0.0]
    began = [0.0]

    def collection(phase: str, _info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - began[0])
    gc.callbacks.append(collection)
    cpu = time.thread_time()
    start = time.perf_counter()
    view = window.open_path(path)
    window.repaint()  # synchronous: the tab's first paint
    first = time.perf_counter() - start
    while isinstance(view, QtForeignFileView) and not view.is_open():
        app.processEvents()
        time.sleep(0.001)
    window.repaint()
    content = time.perf_counter() - start
    ui_cpu = time.thread_time() - cpu
    gc.callbacks.remove(collection)
    for v in window.views():
        v.shutdown()
    window.close()
    app.processEvents()
    if settle:
        gc.unfreeze()   # the next run starts as colibri-inspector does
    gc.collect()
    return first, content, ui_cpu, max(pauses)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gguf-reader", action="store_true")
    parser.add_argument("--no-settle", action="store_true",
                        help="with --inspector: leave start-up's objects in the collector's "
                             "walks (colibri-inspector freezes them)")
    parser.add_argument("--inspector", action="store_true",
                        help="also time the Inspector opening each file into a tab and painting "
                             "it once (offscreen, in this process)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        g = Path(tmp) / "big.gguf"
        big_gguf(g)
        ckpt = Path(tmp) / "ckpt"
        ckpt.mkdir()
        big_checkpoint(ckpt)
        t_gguf = timed(lambda: gguf_file.GGUFFile.open(str(g)), args.repeats)
        t_st = timed(lambda: safetensors_file.Checkpoint.open(str(ckpt)), args.repeats)
        print(f"GGUF, 20 GB sparse, 151936 tokens + 151387 merges, 579 tensors: open "
              f"{t_gguf * 1000:.0f} ms (median of {args.repeats})")
        print(f"safetensors, 20 GB sparse, 4 shards x 1000 tensors + index: open "
              f"{t_st * 1000:.0f} ms (median of {args.repeats})")
        if args.inspector:
            many = Path(tmp) / "many"
            many.mkdir()
            big_checkpoint(many, shards=4, per_shard=4800)
            for label, path in (("GGUF, 20 GB, 151936 tokens", g),
                                ("checkpoint, 20 GB, 4 x 1000 tensors", ckpt),
                                ("checkpoint, 20 GB, 4 x 4800 tensors", many)):
                runs = [inspector_first_view(path, not args.no_settle)
                        for _ in range(args.repeats)]
                first, content, cpu, pause = (statistics.median(r[i] for r in runs)
                                              for i in range(4))
                print(f"Inspector, {label}: first paint {first * 1000:.0f} ms, with its content "
                      f"{content * 1000:.0f} ms, UI thread CPU {cpu * 1000:.0f} ms, longest "
                      f"collection {pause * 1000:.0f} ms (medians of {args.repeats})")
        if args.gguf_reader:
            import gguf
            t_ref = timed(lambda: gguf.GGUFReader(str(g)), 1)
            print(f"gguf.GGUFReader on the same GGUF: {t_ref * 1000:.0f} ms "
                  f"({t_ref / t_gguf:.0f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
