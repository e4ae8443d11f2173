"""Benchmark of Colibri Inspector on big files: time to first paint, to validated, scroll frames.

Builds (once, cached in $TMPDIR) a ~20 GB sparse synthetic Mixtral-shaped .colibri file whose
tensors are all zeros, with correct CRC-32s computed analytically (the CRC of n zero bytes by
crc32_combine doubling, no 20 GB read), then runs the Inspector in a fresh subprocess per file
and reports:
  * first paint: process-relative time until the main window is shown and both the header view
    and the hexdump have painted once (target: < 300 ms on the 20 GB file);
  * validated (structural): time until the document is open with its problem list;
  * validated with checksums + NaN scan (demo model and, with --full, the 20 GB file);
  * hexdump scroll frame times (p50 / p95 / max) over a programmatic scroll through the file.
Also for the demo model (resources/demo/demo.colibri) when it exists. Not a timed test: it prints.

    python tools/bench_inspector.py [--size-gb 20] [--full] [--rebuild]

`build_sparse_model` is also used by tests/inspector/test_responsiveness.py (2 GB file).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from functools import cache
from pathlib import Path

_T0 = time.perf_counter()
REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# CRC-32 of zeros without reading them (zlib's crc32_combine, in Python)

_POLY = 0xEDB88320


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of A || B from crc(A), crc(B) and len(B) (zlib's algorithm)."""
    if len2 <= 0:
        return crc1
    odd = [_POLY] + [1 << (n - 1) for n in range(1, 32)]   # operator for one zero bit
    even = _gf2_square(odd)                                  # two zero bits
    odd = _gf2_square(even)                                  # four zero bits
    while True:
        even = _gf2_square(odd)
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _gf2_square(even)
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return (crc1 ^ crc2) & 0xFFFFFFFF


@cache
def crc32_zeros(n: int) -> int:
    """zlib.crc32(bytes(n)) for any n, in O(log n) combines."""
    block = 1 << 20
    q, r = divmod(n, block)
    acc, base, base_len = 0, zlib.crc32(bytes(block)), block
    while q:
        if q & 1:
            acc = crc32_combine(acc, base, base_len)
        q >>= 1
        if q:
            base = crc32_combine(base, base, base_len)
            base_len *= 2
    return crc32_combine(acc, zlib.crc32(bytes(r)), r)


# ---------------------------------------------------------------------------------------------
# Sparse synthetic model


def build_sparse_model(path: str | os.PathLike[str], n_layers: int = 7, d_model: int = 4096,
                       d_ff: int = 14336, n_experts: int = 8, vocab: int = 32000,
                       n_heads: int = 32, n_kv_heads: int = 8, dtype: str = "bf16") -> Path:
    """Write a valid Mixtral-shaped .colibri whose tensor data are all zeros, as a sparse file
    (only the header and tables are written). Defaults give ~20.8 GB."""
    from colibri import fileformat as ff
    from colibri.values import HParams

    head_dim = d_model // n_heads
    hp = HParams(arch=ff.ARCH_MIXTRAL, n_layers=n_layers, n_experts=n_experts,
                 n_experts_active=2, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                 head_dim=head_dim, vocab_size=vocab, max_context=4096, d_ff_expert=d_ff,
                 flags=ff.FLAG_NORM_TOPK, rope_theta=1e6, norm_eps=1e-5,
                 default_epsilon=1e-6, bos_token_id=1, eos_token_id=2)
    big = ff.DTYPE_BY_NAME[dtype]
    H, E, I, q, kv = d_model, n_experts, d_ff, n_heads * head_dim, n_kv_heads * head_dim
    shapes: list[tuple[str, int, tuple[int, ...]]] = [("token_embd", big, (vocab, H))]
    for layer in range(n_layers):
        p = f"layers.{layer}."
        shapes += [(p + "attn_norm", ff.DTYPE_F32, (H,)), (p + "attn_q", big, (q, H)),
                   (p + "attn_k", big, (kv, H)), (p + "attn_v", big, (kv, H)),
                   (p + "attn_o", big, (H, q)), (p + "ffn_norm", ff.DTYPE_F32, (H,)),
                   (p + "moe_gate", ff.DTYPE_F32, (E, H)), (p + "moe_w1", big, (E, I, H)),
                   (p + "moe_w2", big, (E, H, I)), (p + "moe_w3", big, (E, I, H))]
    shapes += [("output_norm", ff.DTYPE_F32, (H,)), ("output", big, (vocab, H))]

    def never() -> object:
        raise RuntimeError("sparse model: tensor data is never materialised")

    specs = [ff.TensorSpec(name, dt, shape, never) for name, dt, shape in shapes]
    metadata = {"synthetic": True, "note": "sparse all-zero tensors for benchmarks"}
    plan = ff.plan_file(hp, [ff.LAYER_MOE] * n_layers, specs, metadata=metadata)
    plan.crcs = [crc32_zeros(s.nbytes) for s in specs]
    head = bytearray(plan.data_offset)
    ff._write_metadata_sections(plan, head)  # header, routing, table, metadata: the only bytes
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        out.truncate(plan.file_size)
        out.write(head)
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------
# The measured child process


def _child(path: str, checks: bool, scroll_frames: int) -> dict[str, float]:
    """Runs in a fresh interpreter: open `path` in the Inspector and time it."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("COLIBRI_INSPECTOR_SETTINGS", tempfile.mkdtemp(prefix="bench-set-"))
    from PySide6.QtCore import QEvent, QObject, QTimer
    from PySide6.QtWidgets import QApplication

    from colibri.inspector.app import application, build_window

    t_import = time.perf_counter() - _T0
    app = application()
    painted: dict[str, float] = {}

    class PaintProbe(QObject):
        def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802
            if event.type() == QEvent.Type.Paint and obj.objectName() not in painted:
                painted[obj.objectName()] = time.perf_counter()
            return False

    t_open0 = time.perf_counter()
    window = build_window([path], "header", persist=False)
    t_validated = time.perf_counter()
    view = window.current_view()
    assert view is not None
    probe = PaintProbe()
    view.hex.setObjectName("hexview")
    view.header.tree.viewport().setObjectName("headertree")
    for w in view.hex.findChildren(QObject):
        if hasattr(w, "viewport"):
            w.viewport().setObjectName("hexviewport")
            w.viewport().installEventFilter(probe)
    view.header.tree.viewport().installEventFilter(probe)
    window.resize(1400, 860)
    window.show()
    deadline = time.perf_counter() + 10
    while len(painted) < 2 and time.perf_counter() < deadline:
        app.processEvents()
    t_paint = max(painted.values()) if painted else float("nan")
    result = {"import_s": t_import, "open_and_structural_validation_s": t_validated - t_open0,
              "first_paint_since_start_s": t_paint - _T0,
              "first_paint_since_open_s": t_paint - t_open0,
              "size_bytes": float(view.doc.size), "problems": float(len(view.doc.problems))}

    # Scroll the hexdump programmatically, one frame per step, timing repaint.
    view.set_view("hex")
    hexview = view.hex
    size = view.doc.size
    frames: list[float] = []
    for i in range(scroll_frames):
        t = time.perf_counter()
        hexview.goto((size // scroll_frames) * i if i % 2 else (i * 4096) % max(size, 1), 1)
        hexview.repaint()
        app.processEvents()
        frames.append((time.perf_counter() - t) * 1000)
    if frames:
        frames.sort()
        result["scroll_p50_ms"] = frames[len(frames) // 2]
        result["scroll_p95_ms"] = frames[int(len(frames) * 0.95)]
        result["scroll_max_ms"] = frames[-1]

    if checks and view.doc.model is not None:
        # Event-loop gap while the data checks run on the worker.
        gaps: list[float] = []
        last = [time.perf_counter()]

        def tick() -> None:
            now = time.perf_counter()
            gaps.append((now - last[0]) * 1000)
            last[0] = now

        timer = QTimer()
        timer.setInterval(10)
        timer.timeout.connect(tick)
        timer.start()
        t = time.perf_counter()
        view.run_checks(True, True)
        while view.is_checking():
            app.processEvents()
            time.sleep(0.001)
        timer.stop()
        result["validated_with_checks_s"] = time.perf_counter() - t
        result["check_problems"] = float(len(view.data_result.problems)
                                         if view.data_result else -1)
        result["event_loop_worst_gap_ms"] = max(gaps) if gaps else float("nan")
    window.close()
    QApplication.processEvents()
    return result


def _run_child(path: Path, checks: bool, frames: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", str(path), "--frames", str(frames)]
    if checks:
        cmd.append("--checks")
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _report(title: str, r: dict[str, float]) -> None:
    print(f"\n== {title}")
    print(f"   file size                      {r['size_bytes'] / 2**30:10.2f} GiB,"
          f" {int(r['problems'])} structural problem(s)")
    print(f"   imports                        {r['import_s'] * 1000:10.1f} ms")
    print(f"   open + structural validation   {r['open_and_structural_validation_s'] * 1000:10.1f} ms")
    print(f"   first paint (since open)       {r['first_paint_since_open_s'] * 1000:10.1f} ms")
    print(f"   first paint (since start)      {r['first_paint_since_start_s'] * 1000:10.1f} ms")
    if "scroll_p50_ms" in r:
        print(f"   hexdump scroll frames p50/p95/max "
              f"{r['scroll_p50_ms']:.2f} / {r['scroll_p95_ms']:.2f} / {r['scroll_max_ms']:.2f} ms")
    if "validated_with_checks_s" in r:
        print(f"   validated with checksums + NaN {r['validated_with_checks_s']:10.2f} s "
              f"({int(r['check_problems'])} problem(s)); worst event-loop gap "
              f"{r['event_loop_worst_gap_ms']:.1f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=20.0,
                        help="approximate size of the synthetic file (default 20)")
    parser.add_argument("--full", action="store_true",
                        help="also run checksums + NaN scan on the synthetic file (reads it all)")
    parser.add_argument("--frames", type=int, default=200, help="scroll frames to time")
    parser.add_argument("--rebuild", action="store_true",
                        help="rebuild the cached synthetic file")
    parser.add_argument("--child", metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--checks", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.checks, args.frames)))
        return 0

    layers = max(1, round(args.size_gb / 2.95))
    cache_dir = Path(tempfile.gettempdir()) / "colibri-bench"
    cache_dir.mkdir(exist_ok=True)
    synthetic = cache_dir / f"mixtral-sparse-L{layers}.colibri"
    t = time.perf_counter()
    if args.rebuild or not synthetic.exists():
        build_sparse_model(synthetic, n_layers=layers)
        print(f"built {synthetic} ({synthetic.stat().st_size / 2**30:.2f} GiB sparse) in "
              f"{time.perf_counter() - t:.1f} s")
    else:
        print(f"using cached {synthetic}")
    _report(f"synthetic sparse Mixtral-shaped file ({layers} layers)",
            _run_child(synthetic, args.full, args.frames))
    demo = REPO / "resources" / "demo" / "demo.colibri"
    if demo.exists():
        _report("demo model", _run_child(demo, True, args.frames))
    else:
        print(f"\n== demo model: not found at {demo} (skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
