#!/usr/bin/env python3
"""Colibri against llama.cpp and ik_llama.cpp: the same checkpoints, each converted by its own
tool, benchmarked in alternating turns on the same machine with the same threads.

For each bench model (tools/bench_models.py: the Mixtral-shaped 0.64 B and the Qwen3-MoE-shaped
0.71 B; their Hugging Face checkpoints are made once and reused) and each precision:
  * Colibri's converter writes the .colibri file: bf16, or bf16 quantised with
    `--quantize q8|q4 --quantize-tensors llama.cpp` (llama-quantize's recipe; docs/converter.md),
    its blocks in the converter's default layout (panels of 8 rows; a file made before panels
    is reused as it is: `colibri convert OLD.colibri NEW.colibri` re-lays it out);
  * llama.cpp's convert_hf_to_gguf.py writes a bf16 GGUF and llama-quantize makes Q8_0 and Q4_0
    from it, Q4_0 with `--output-tensor-type q8_0` (llama.cpp's Q4_0 gives the LM head q6_K,
    which Colibri lacks; both engines then read the same type for every tensor). The GGUF
    converter needs a tokenizer: a small one is trained and put beside the checkpoint in a
    staging directory (tools/make_gguf_fixtures.py's), the vocabulary padded to the model's.
Then, turn after turn, every (model, precision) runs `colibri bench`, llama.cpp's `llama-bench`
and ik_llama.cpp's `llama-bench -rtr 1` (its run-time repacking), each a fresh process with
`-p 128 -n 64 -t 2` by default (the peers' decode after the prompt, as Colibri's follows its
prefill: `--peer-decode`), in an order that rotates from turn to turn, with the read
bandwidth probe (colibri.engine.measure_read_bandwidth, same threads), the compute probe
(colibri.compute: f32 FMA, bf16 and int8 dot products) and the memory-latency probe
(colibri.engine.measure_read_latency, over the bandwidth probe's buffer) between every two
runs. `--numerics SPEC` (repeatable, e.g. dot-bf16, kv-f16) adds Colibri in that numerics mode
as one more engine (dot-bf16 on the cells whose file has bf16 weights, kv-f16 on every cell: the
peers' default KV cache is f16); the default rows stay exact. `--kernels PATH` keeps Colibri to a
path below the machine's best (avx512 on an AMX Xeon stands in for a CPU without AMX).

It prints, per model and precision: each engine's prefill and decode tok/s (medians over
turns), the bytes of weights it reads per decoded token (Colibri from its tensor table, GGUF from
colibri.formats' reader: colibri.bench), the fraction of the bandwidth limit its decode reaches
(per run against the better probe beside it, median over turns), the fraction of the compute
limit its prefill reaches (the prompt's multiply-adds per token from the file's shapes, made with
the arithmetic that engine uses for that precision: Colibri's exact bf16 with f32 FMA, its
dot-bf16 and llama.cpp's bf16 with bf16 dot products, q8_0 and q4_0 with int8 dot products; per
run against the better compute probe beside it), and each Colibri's ratios to each other
engine with their quartiles over turns; a ratio is marked when the two files' bytes per token
differ by more than 5 % (not like for like). `--json` prints everything, every run included.

    python tools/bench_vs_llamacpp.py --ik /work/ext/ik_llama.cpp/build/bin/llama-bench \\
        [--models mixtral,qwen3] [--checkpoint HF_DIR ...] [--precisions bf16,q8,q4] [--turns 5]
        [-p 128] [-n 64] [-t 2] [-r 3] [--work /work/bench-models] [--max-load L] [--json]
        [--numerics dot-bf16] [--kernels avx512] [--llama-cpp-arg=ARG ...] [--save REPORT.json]
    python tools/bench_vs_llamacpp.py --from-json REPORT.json   # the tables of a saved report

Needs the test and fixtures extras (`pip install -e .[test,fixtures]`: torch and transformers
make the checkpoints, sentencepiece the Mixtral tokenizer) and tools/llamacpp.py's build of
llama.cpp (cmake; built once into ~/.cache/colibri). ik_llama.cpp is not built here: pass the
path of a llama-bench built from its sources (without --ik its column is left out). A benchmark,
not a test: nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import bench_models  # noqa: E402
import llamacpp  # noqa: E402
from bench_builds import quartiles  # noqa: E402

ENGINES = ("colibri", "llama.cpp", "ik_llama.cpp")
PRECISIONS = ("bf16", "q8", "q4")
# llama-quantize's type (and options) per precision; see the module docstring for the head
LLAMA_QUANTIZE = {"q8": ["Q8_0"], "q4": ["--output-tensor-type", "q8_0", "Q4_0"]}
GGUF_SUFFIX = {"bf16": "bf16", "q8": "Q8_0", "q4": "Q4_0-output-q8_0"}
MATCHED_BYTES = 0.05  # ratios compare like with like when bytes per token differ by at most this
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
RUN_TIMEOUT = 1800  # seconds: a wedged run must not hang the whole benchmark


def log(message: str) -> None:
    print(f"[vs-llama.cpp] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Files: both engines' conversions of the same checkpoint


@dataclass
class Cell:
    """One (model, precision): each engine's file and the bytes of weights a token reads."""

    model: str
    precision: str
    colibri_file: Path
    gguf_file: Path
    bytes_per_token: dict[str, int]
    file_bytes: dict[str, int]
    runs: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    macs: dict[str, float] = field(default_factory=dict)  # per prompt token, by dtype (colibri.compute)

    @property
    def name(self) -> str:
        return f"{self.model} {self.precision}"

    @property
    def byte_ratio(self) -> float:
        return self.bytes_per_token["colibri"] / self.bytes_per_token["llama.cpp"]

    @property
    def matched(self) -> bool:
        return abs(self.byte_ratio - 1.0) <= MATCHED_BYTES


def _atomic(out: Path, make: Any) -> Path:
    """Run make(temporary path) and rename its result to `out`; nothing is left on failure."""
    if out.exists():
        return out
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        make(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def colibri_file(hf: Path, out: Path, precision: str, layout: str) -> Path:
    from colibri.convert import LLAMA_CPP_RECIPE, convert

    def make(tmp: Path) -> None:
        log(f"converting {out.name} (Colibri's converter)")
        if precision == "bf16":
            convert(hf, tmp, "bf16", layout=layout)
        else:
            convert(hf, tmp, "bf16", quantize=precision, quantize_tensors=LLAMA_CPP_RECIPE,
                    layout=layout)
    return _atomic(out, make)


def gguf_bf16(hf: Path, out: Path) -> Path:
    """convert_hf_to_gguf.py --outtype bf16 on `hf`. A checkpoint without a tokenizer (the bench
    models) is staged beside one trained for its family, as the GGUF fixtures are; the converter
    pads the vocabulary to the model's."""
    import make_gguf_fixtures as fixtures

    def make(tmp: Path) -> None:
        log(f"converting {out.name} (llama.cpp's convert_hf_to_gguf.py)")
        if any((hf / name).exists() for name in ("tokenizer.json", "tokenizer.model")):
            fixtures.convert(llamacpp.LlamaCpp(), hf, tmp, "bf16", "-")
            return
        family = json.loads((hf / "config.json").read_text())["model_type"]
        tokenizer = fixtures.TOKENIZER[family]
        with tempfile.TemporaryDirectory(prefix="colibri-gguf-") as staging:
            stage = Path(staging)
            for item in hf.iterdir():
                (stage / item.name).symlink_to(item.resolve())
            if tokenizer == "spm":
                fixtures.spm_tokenizer(stage, fixtures.corpus())
            else:
                fixtures.bpe_tokenizer(stage, fixtures.corpus(), tokenizer)
            fixtures.convert(llamacpp.LlamaCpp(), stage, tmp, "bf16",
                             "-" if tokenizer == "spm" else tokenizer)
    return _atomic(out, make)


def gguf_quantised(source: Path, out: Path, precision: str, quantize: Path) -> Path:
    def make(tmp: Path) -> None:
        log(f"quantising {out.name} (llama-quantize {' '.join(LLAMA_QUANTIZE[precision])})")
        *options, qtype = LLAMA_QUANTIZE[precision]
        subprocess.run([str(quantize), *options, str(source), str(tmp), qtype], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _atomic(out, make)


def prepare(name: str, hf: Path, precisions: list[str], work: Path, quantize: Path,
            prompt: int, layout: str) -> list[Cell]:
    """The cells of one checkpoint: both engines' files (made in `work` once, then reused;
    Colibri's in `layout`)."""
    from colibri.bench import gguf_weight_bytes_per_token, weight_bytes_per_token
    from colibri.compute import prefill_macs
    from colibri.engine import Model
    from colibri.formats.gguf_file import GGUFFile

    bf16 = gguf_bf16(hf, work / f"{name}-bf16.gguf")
    cells = []
    for precision in precisions:
        suffix = "bf16" if precision == "bf16" else f"{precision}-llama.cpp"
        if precision == "bf16" and layout == "bf16-panels":
            suffix = "bf16x16"
        ours = colibri_file(hf, work / f"{name}-{suffix}.colibri", precision, layout)
        theirs = bf16 if precision == "bf16" else gguf_quantised(
            bf16, work / f"{name}-{GGUF_SUFFIX[precision]}.gguf", precision, quantize)
        with Model.open(ours) as m:
            ours_bytes = weight_bytes_per_token(m)
            macs = prefill_macs(m, prompt)
        theirs_bytes = gguf_weight_bytes_per_token(GGUFFile.open(str(theirs)))
        cells.append(Cell(name, precision, ours, theirs,
                          {"colibri": ours_bytes, "llama.cpp": theirs_bytes,
                           "ik_llama.cpp": theirs_bytes},
                          {"colibri": ours.stat().st_size, "gguf": theirs.stat().st_size},
                          macs=macs))
    return cells


# ---------------------------------------------------------------------------------------------
# Runs


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def numerics_of(engine: str) -> str | None:
    """The numerics spec of a Colibri engine ("colibri dot-bf16"; None for the exact default)."""
    return engine.split(" ", 1)[1] if engine.startswith("colibri ") else None


def runs_on(engine: str, cell: Cell) -> bool:
    """A numerics mode runs only where it changes something: `dot-bf16` on files with bf16
    weights; `kv-f16` (the KV cache in halves) on every file."""
    spec = numerics_of(engine)
    if spec is None or "dot-bf16" not in spec.split("+"):
        return True
    return "bf16" in cell.macs or "bf16x16" in cell.macs


def run_colibri(cell: Cell, args: argparse.Namespace, numerics: str | None
                ) -> tuple[float, float, str, float | None, float | None]:
    """One `colibri bench` process (its own probe kept small: the script's probe is the one
    that counts); its median prefill and decode tok/s over --repeats, its kernel path, the
    share of the mapped file's resident pages in 2 MiB pages (None where unknown), which moves
    its decode by a few % (performance.md, "the mapping's page size"), and the workers' share
    of the decode's multiply-adds (None on one thread), low when the machine ran them late."""
    command = [sys.executable, "-m", "colibri.cli", "bench", str(cell.colibri_file),
               "-p", str(args.p), "-n", str(args.n), "-t", str(args.threads),
               "-r", str(args.repeats), "--probe-mb", "64", "--no-trace-check", "--json"]
    if numerics is not None:
        command += ["--numerics", numerics]
    if args.kernels is not None:
        command += ["--kernels", args.kernels]
    out = subprocess.run(command, check=True, capture_output=True, text=True,
                         timeout=RUN_TIMEOUT).stdout
    r = json.loads(out)
    huge, resident = r.get("mapped_huge_mb"), r["mapped_rss_mb"]
    shares = r.get("decode_thread_shares")
    return (r["prefill_tok_s"], r["decode_tok_s"], r["kernels"],
            huge / resident if huge is not None and resident > 0 else None,
            sum(shares[1:]) if shares else None)


def decode_arguments(engine: str, prompt: int, n: int, after_prompt: bool) -> list[str]:
    """llama-bench's arguments for its decode test: `-n N` decodes from an empty cache; after
    the prompt (as Colibri's decode follows its prefill, reading the prompt's KV cache) llama.cpp
    decodes at a depth (`-d 0,P`: its pp stays at depth 0) and ik_llama.cpp, which has no
    depth, runs its tg-after-pp test (`-gp P,N`, timing only the decode)."""
    if not after_prompt:
        return ["-n", str(n)]
    if engine == "ik_llama.cpp":
        return ["-n", "0", "-gp", f"{prompt},{n}"]
    return ["-n", str(n), "-d", f"0,{prompt}"]


def pick_tests(tests: list[dict[str, Any]], prompt: int, after_prompt: bool
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The prefill test (at depth 0) and the decode test (from an empty cache, or after the
    prompt: llama.cpp's at depth P, ik_llama.cpp's tg-after-pp) among llama-bench's JSON rows."""
    def is_decode(t: dict[str, Any]) -> bool:
        if t["n_gen"] == 0:
            return False
        if not after_prompt:
            return t["n_prompt"] == 0 and not t.get("n_depth")
        return (t["n_prompt"] == 0 and t.get("n_depth") == prompt) or (
            t["n_prompt"] == prompt and not t.get("n_depth"))
    pp = [t for t in tests if t["n_prompt"] > 0 and t["n_gen"] == 0 and not t.get("n_depth")]
    return pp, [t for t in tests if is_decode(t)]


def run_llama_bench(binary: Path, engine: str, cell: Cell, args: argparse.Namespace,
                    extra: list[str]) -> tuple[float, float, str]:
    """One llama-bench process: the median of its --repeats samples of pp and tg, and its build."""
    after_prompt = args.peer_decode == "after-prompt"
    command = [str(binary), "-m", str(cell.gguf_file), "-p", str(args.p),
               *decode_arguments(engine, args.p, args.n, after_prompt),
               "-t", str(args.threads), "-r", str(args.repeats), "-o", "json", *extra]
    out = subprocess.run(command, check=True, capture_output=True, text=True,
                         timeout=RUN_TIMEOUT).stdout
    tests = json.loads(out)
    pp, tg = pick_tests(tests, args.p, after_prompt)
    if len(pp) != 1 or len(tg) != 1:
        raise RuntimeError(f"{binary}: expected one pp and one tg test, got {len(tests)} tests")
    build = f"{tests[0].get('build_commit', '?')} ({tests[0].get('build_number', '?')})"
    return _median(pp[0]["samples_ts"]), _median(tg[0]["samples_ts"]), build


def llama_cpp_arguments(binary: Path, cells: list[Cell], chosen: list[str]) -> list[str]:
    """llama.cpp's extra llama-bench arguments: `chosen`, or, when a short run on each GGUF dies
    by a signal with llama.cpp's weight repacking on (its AMX kernels fault on some CPUs: seen
    with SIGSEGV/SIGILL in tinygemm_kernel_amx), `--repack 0` for every run, said in the log
    and the report, so that the comparison still runs and is labelled."""
    if "--repack" in chosen:
        return chosen
    for gguf in dict.fromkeys(cell.gguf_file for cell in cells):
        run = subprocess.run([str(binary), "-m", str(gguf), "-p", "8", "-n", "1", "-r", "1",
                              "-t", "1", "-o", "json", *chosen], capture_output=True,
                             timeout=RUN_TIMEOUT, check=False)
        if run.returncode < 0:
            log(f"llama-bench died by signal {-run.returncode} on {gguf.name} with its weight "
                "repacking on: every llama.cpp run uses --repack 0")
            return [*chosen, "--repack", "0"]
    return chosen


def probe(args: argparse.Namespace) -> float:
    from colibri.engine import measure_read_bandwidth

    return measure_read_bandwidth(args.probe_mb << 20, args.threads, 3)


def latency_probe(args: argparse.Namespace) -> float:
    from colibri.engine import measure_read_latency

    return measure_read_latency(args.probe_mb << 20)


def compute_probe(args: argparse.Namespace) -> dict[str, float | None]:
    from colibri import compute
    from colibri.engine import ARITHMETIC

    return compute.probe(list(ARITHMETIC), args.threads, args.kernels)  # Colibri's path's rates


def compute_limit(cell: Cell, engine: str, kernels: str | None,
                  rates: dict[str, float | None]) -> float | None:
    """The prefill tok/s `engine` could reach on `cell` at `rates` with its arithmetic."""
    from colibri import compute

    how = (compute.llamacpp_arithmetic if not engine.startswith("colibri") else
           compute.colibri_arithmetic(kernels or "avx512", "dot-bf16" in (numerics_of(engine) or "").split("+")))
    return compute.limit_tok_s(compute.arithmetic_macs(cell.macs, how), rates)


def wait_for_load(limit: float, timeout: float) -> float:
    """Wait up to `timeout` seconds for a 1-minute load average of at most `limit`; the seconds
    waited."""
    started = time.monotonic()
    while os.getloadavg()[0] > limit and time.monotonic() - started < timeout:
        time.sleep(5)
    if os.getloadavg()[0] > limit:
        log(f"load average still {os.getloadavg()[0]:.1f} > {limit}: running anyway")
    return time.monotonic() - started


def cpu_description() -> dict[str, Any]:
    model, flags = platform.processor(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not flags:
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return {"model": model, "cores": os.cpu_count(),
            "flags": [f for f in CPU_FLAGS if f in flags],
            "lacks": [f for f in CPU_FLAGS if f not in flags]}


# ---------------------------------------------------------------------------------------------
# Report


def summarise(cells: list[Cell], engines: list[str]) -> list[dict[str, Any]]:
    rows = []
    for cell in cells:
        row: dict[str, Any] = {"model": cell.model, "precision": cell.precision,
                               "colibri_file": str(cell.colibri_file),
                               "gguf_file": str(cell.gguf_file),
                               "bytes_per_token": cell.bytes_per_token,
                               "file_bytes": cell.file_bytes, "byte_ratio": cell.byte_ratio,
                               "matched": cell.matched, "engines": {}, "ratios": {},
                               "runs": cell.runs}
        for engine in engines:
            runs = cell.runs.get(engine, [])
            if not runs:
                continue
            row["engines"][engine] = {
                key: {"median": _median([r[key] for r in runs]),
                      "quartiles": quartiles([r[key] for r in runs])}
                for key in ("prefill_tok_s", "decode_tok_s", "fraction_of_limit",
                            "prefill_of_compute") if all(r.get(key) for r in runs)}
            for key in ("huge_page_share", "worker_share"):
                shares = [r[key] for r in runs if r.get(key) is not None]
                if shares:
                    row["engines"][engine][key] = {"lowest": min(shares), "highest": max(shares)}
        ours = [e for e in engines if e.startswith("colibri") and cell.runs.get(e)]
        theirs = [e for e in engines if not e.startswith("colibri")]
        for mine in ours:
            # "colibri" vs each other engine (the report's original key), "colibri SPEC/other"
            for other in theirs + [e for e in ours if e != mine and mine == "colibri"]:
                key_name = other if mine == "colibri" else f"{mine}/{other}"
                row["ratios"][key_name] = {}
                for key in ("prefill_tok_s", "decode_tok_s"):
                    # per turn: the two runs were made minutes apart at most
                    per_turn = [a[key] / b[key] for a, b in zip(cell.runs[mine], cell.runs[other])]
                    row["ratios"][key_name][key] = {"median": quartiles(per_turn)[1],
                                                    "quartiles": quartiles(per_turn)}
        rows.append(row)
    return rows


def _share(s: dict[str, float]) -> str:
    low, high = round(100 * s["lowest"]), round(100 * s["highest"])
    return f"{low} %" if low == high else f"{low}-{high} %"


def _ratio(r: dict[str, Any], matched: bool) -> str:
    low, mid, high = r["quartiles"]
    return f"{mid:.2f}x ({low:.2f}-{high:.2f})" + ("" if matched else " *")


def _load_range(report: dict[str, Any]) -> str:
    loads = [r["load"] for row in report["rows"] for runs in row["runs"].values()
             for r in runs if "load" in r]
    where = "at the runs' starts"
    if not loads:  # a report saved before runs recorded their load
        loads, where = report["load"], "at the turns' starts and the end"
    return f"{min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f}) {where}"


def format_report(report: dict[str, Any]) -> str:
    engines = report["engines"]
    cpu = report["cpu"]
    lines = [
        f"CPU: {cpu['model']}, {cpu['cores']} cores; flags: {' '.join(cpu['flags'])}"
        + (f"; lacks: {' '.join(cpu['lacks'])}" if cpu["lacks"] else ""),
        f"-p {report['prompt']} -n {report['decode']} -t {report['threads']}, {report['turns']} "
        f"turns of {report['repeats']} repeats per run"
        + (f"; Colibri limited to its {report['colibri_kernels']} kernels"
           if report.get("colibri_kernels") else "")
        + "; load average (1 min) "
        f"{_load_range(report)}",
        "decode: Colibri's after its prefill; the peers' "
        + ("after the prompt as well (llama.cpp -d, ik_llama.cpp -gp)"
           if report.get("peer_decode") == "after-prompt" else "from an empty cache (llama-bench's tg)"),
        f"read bandwidth probe ({report['threads']} threads, between every two runs): best "
        f"{report['probe_gb_s']['best']:.1f} GB/s, median {report['probe_gb_s']['median']:.1f}, "
        f"lowest {report['probe_gb_s']['lowest']:.1f}",
        *([f"memory latency (dependent loads in random order, between every two runs): lowest "
           f"{report['latency_ns']['lowest']:.0f} ns, median {report['latency_ns']['median']:.0f}, "
           f"highest {report['latency_ns']['highest']:.0f}"] if report.get("latency_ns") else []),
        *([f"compute probe ({report['threads']} threads, between every two runs"
           + (f", on the {report['colibri_kernels']} path" if report.get("colibri_kernels") else "")
           + "), best G multiply-adds/s: " + ", ".join(f"{how} {rate:.1f}" for how, rate in
                                            report["compute_probe"]["best"].items() if rate)]
          if report.get("compute_probe") else []),
        f"llama.cpp: llama-cpp-python {report['llama_cpp']['version']} sdist, build "
        f"{report['llama_cpp']['build']}"
        + (f" ({' '.join(report['llama_cpp']['args'])})" if report["llama_cpp"].get("args") else "")
        + (f"; ik_llama.cpp build {report['ik_llama_cpp']['build']} (-rtr 1)"
           if "ik_llama.cpp" in engines else ""),
        "",
        "| model | precision | engine | MB/token | file MB | prefill tok/s | prefill, of the "
        "compute limit | decode tok/s | decode, of the limit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        for engine in engines:
            e = row["engines"].get(engine)
            if e is None:
                continue
            ours = engine.startswith("colibri")
            file_mb = row["file_bytes"]["colibri" if ours else "gguf"] / 1e6
            compute = (f"{100 * e['prefill_of_compute']['median']:.0f} %"
                       if "prefill_of_compute" in e else "-")
            lines.append(
                f"| {row['model']} | {row['precision']} | {engine} | "
                f"{row['bytes_per_token']['colibri' if ours else engine] / 1e6:.1f} | "
                f"{file_mb:.0f} | {e['prefill_tok_s']['median']:.1f} | {compute} | "
                f"{e['decode_tok_s']['median']:.1f} | {100 * e['fraction_of_limit']['median']:.0f} % |")
    theirs = [e for e in engines if not e.startswith("colibri")]
    header = ["model", "precision", "Colibri", "bytes per token, Colibri / GGUF"]
    for other in theirs:
        header += [f"decode, / {other}", f"prefill, / {other}"]
    lines += ["", "Colibri's ratios, median (quartiles) over turns:", "",
              "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in report["rows"]:
        for mine in [e for e in engines if e.startswith("colibri") and e in row["engines"]]:
            cells = [row["model"], row["precision"], "exact" if mine == "colibri" else numerics_of(mine)
                     or mine, f"{row['byte_ratio']:.3f}"]
            for other in theirs:
                r = row["ratios"][other if mine == "colibri" else f"{mine}/{other}"]
                cells += [_ratio(r["decode_tok_s"], row["matched"]),
                          _ratio(r["prefill_tok_s"], row["matched"])]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    for key, title in (("huge_page_share", "Colibri's files, share of their resident pages mapped 2 MiB "
                                            "at a time (over turns)"),
                       ("worker_share", "Colibri's workers, their share of the decode's multiply-adds "
                                        "(over turns; an even split on 2 threads is 50 %)")):
        cells = [f"{row['model']} {row['precision']} {_share(e[key])}"
                 for row in report["rows"] for name, e in row["engines"].items() if name == "colibri" and key in e]
        if cells:
            lines += ["", f"{title}: " + ", ".join(cells)]
    if not all(row["matched"] for row in report["rows"]):
        lines.append(f"\n* bytes per token differ by more than {100 * MATCHED_BYTES:.0f} %: "
                     "not like for like")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from colibri.values import DEFAULT_LAYOUT, LAYOUTS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ik", type=Path, default=None, metavar="LLAMA_BENCH",
                    help="ik_llama.cpp's llama-bench (built from its sources; run with -rtr 1)")
    ap.add_argument("--models", default="mixtral,qwen3",
                    help=f"bench models ({', '.join(bench_models.MODELS)}; default mixtral,qwen3; "
                         "'' for none)")
    ap.add_argument("--checkpoint", type=Path, action="append", default=[], metavar="HF_DIR",
                    help="a Hugging Face checkpoint to compare as well (repeatable)")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--turns", type=int, default=5, help="runs of each engine per cell")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens")
    ap.add_argument("-n", type=int, default=64, help="decoded tokens")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=3, help="repeats inside each run")
    ap.add_argument("--probe-mb", type=int, default=1024, help="bandwidth probe buffer (MiB)")
    ap.add_argument("--work", type=Path, default=Path("/work/bench-models"),
                    help="where the checkpoints and converted files are made and reused")
    ap.add_argument("--max-load", type=float, default=None, metavar="L",
                    help="before each model and precision of a turn, wait (up to 3 minutes, "
                         "--max-wait in all) for a 1-minute load average of at most L")
    ap.add_argument("--max-wait", type=float, default=1800.0, metavar="SECONDS",
                    help="--max-load's waits in all, after which runs start whatever the load "
                         "(default 1800)")
    ap.add_argument("--layout", default=DEFAULT_LAYOUT, choices=LAYOUTS,
                    help="how Colibri's files store their matrices (colibri convert --layout; "
                         "default %(default)s): bf16-panels stores the bf16 cells' matrices in "
                         "16-row panels (their own files, NAME-bf16x16.colibri)")
    ap.add_argument("--numerics", action="append", default=[], metavar="SPEC",
                    help="also run Colibri in this numerics mode (repeatable; e.g. dot-bf16), "
                         "on the cells whose file has bf16 weights")
    ap.add_argument("--kernels", default=None, choices=("portable", "avx2", "avx512f", "avx512", "amx"),
                    help="the most capable kernel path Colibri may use (default: the best this "
                         "machine has), e.g. avx512 on an AMX machine to see where a CPU without "
                         "AMX would stand; the peers run as built")
    ap.add_argument("--llama-cpp-arg", action="append", default=[], metavar="ARG",
                    help="an argument added to llama.cpp's llama-bench runs (repeatable), e.g. "
                         "--llama-cpp-arg=--repack --llama-cpp-arg=0 where its AMX repacking faults")
    ap.add_argument("--peer-decode", default="after-prompt", choices=("after-prompt", "empty"),
                    help="where llama.cpp's and ik_llama.cpp's decode starts: after the prompt "
                         "(default; like Colibri's, which follows its prefill and reads the "
                         "prompt's KV cache) or from an empty cache (llama-bench's plain tg, as "
                         "the reports before 2026-12-04 ran)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--save", type=Path, default=None, metavar="FILE",
                    help="write the --json report to FILE after every turn (for --from-json)")
    ap.add_argument("--from-json", type=Path, default=None, metavar="FILE",
                    help="print the tables of a report saved with --json, and run nothing")
    args = ap.parse_args(argv)
    if args.from_json is not None:
        print(format_report(json.loads(args.from_json.read_text())))
        return 0
    models = [m for m in args.models.split(",") if m]
    precisions = args.precisions.split(",")
    unknown = [m for m in models if m not in bench_models.MODELS] + [
        p for p in precisions if p not in PRECISIONS]
    if unknown:
        ap.error(f"unknown model or precision: {', '.join(unknown)}")
    if args.turns < 1 or args.repeats < 1 or args.p < 1 or args.n < 1:
        ap.error("--turns, -r, -p and -n must be at least 1")
    if args.ik is not None and not os.access(args.ik, os.X_OK):
        ap.error(f"--ik {args.ik}: not an executable")
    engines = list(ENGINES if args.ik is not None else ENGINES[:2])
    engines[1:1] = [f"colibri {spec}" for spec in args.numerics]

    tools = llamacpp.LlamaCpp()
    llama_bench, quantize = tools.bench(), tools.quantize()
    args.work.mkdir(parents=True, exist_ok=True)
    checkpoints = [(bench_models.MODELS[m][0], bench_models.build_hf(
        args.work / f"{bench_models.MODELS[m][0]}-hf", bench_models.MODELS[m][1])) for m in models]
    checkpoints += [(hf.resolve().name, hf) for hf in args.checkpoint]
    if not checkpoints:
        ap.error("no model to compare: give --models or --checkpoint")
    cells = [c for name, hf in checkpoints for c in prepare(name, hf, precisions, args.work,
                                                             quantize, args.p, args.layout)]
    args.llama_cpp_arg = llama_cpp_arguments(llama_bench, cells, args.llama_cpp_arg)
    for cell in cells:
        cell.runs = {e: [] for e in engines if runs_on(e, cell)}
        log(f"{cell.name}: {cell.bytes_per_token['colibri'] / 1e6:.1f} MB per token (Colibri), "
            f"{cell.bytes_per_token['llama.cpp'] / 1e6:.1f} (GGUF): ratio {cell.byte_ratio:.3f}"
            + ("" if cell.matched else " NOT MATCHED"))

    builds: dict[str, str] = {}
    probes, load = [probe(args)], []
    computes = [compute_probe(args)]
    latencies = [latency_probe(args)]

    def report(turns: int) -> dict[str, Any]:
        return {
            "cpu": cpu_description(), "engines": engines, "colibri_kernels": args.kernels,
            "prompt": args.p, "decode": args.n, "peer_decode": args.peer_decode,
            "threads": args.threads, "turns": turns, "repeats": args.repeats,
            "load": load + [os.getloadavg()[0]],
            "probe_gb_s": {"best": max(probes) / 1e9, "median": statistics.median(probes) / 1e9,
                           "lowest": min(probes) / 1e9, "all": [p / 1e9 for p in probes]},
            "latency_ns": {"lowest": min(latencies), "median": statistics.median(latencies),
                           "highest": max(latencies), "all": latencies},
            "compute_probe": {"best": {how: max((c[how] or 0.0) for c in computes) / 1e9
                                       for how in computes[0]},
                              "all": [{how: (rate or 0.0) / 1e9 for how, rate in c.items()}
                                      for c in computes]},
            "llama_cpp": {"version": llamacpp.VERSION, "build": builds.get("llama.cpp", "?"),
                          "bench": str(llama_bench), "args": args.llama_cpp_arg},
            **({"ik_llama_cpp": {"build": builds.get("ik_llama.cpp", "?"),
                                 "bench": str(args.ik)}} if args.ik is not None else {}),
            "rows": summarise(cells, engines),
        }

    wait_left = args.max_wait
    for turn in range(args.turns):
        load.append(os.getloadavg()[0])
        order = engines[turn % len(engines):] + engines[:turn % len(engines)]
        for cell in cells:
            if args.max_load is not None and wait_left > 0:
                # per cell, so the engines of one ratio run under the same load
                wait_left -= wait_for_load(args.max_load, min(180.0, wait_left))
            for engine in order:
                if engine not in cell.runs:
                    continue
                started, run_load = time.monotonic(), os.getloadavg()[0]
                kernels, huge, workers = None, None, None
                if engine.startswith("colibri"):
                    prefill, decode, kernels, huge, workers = run_colibri(cell, args, numerics_of(engine))
                else:
                    binary = llama_bench if engine == "llama.cpp" else args.ik
                    extra = ["-rtr", "1"] if engine == "ik_llama.cpp" else args.llama_cpp_arg
                    prefill, decode, builds[engine] = run_llama_bench(binary, engine, cell, args,
                                                                      extra)
                probes.append(probe(args))
                computes.append(compute_probe(args))
                latencies.append(latency_probe(args))
                limit = max(probes[-2], probes[-1])
                fraction = cell.bytes_per_token[
                    "colibri" if engine.startswith("colibri") else engine] * decode / limit
                rates = {how: max(computes[-2][how] or 0.0, computes[-1][how] or 0.0) or None
                         for how in computes[-1]}
                prefill_limit = compute_limit(cell, engine, kernels, rates)
                of_compute = prefill / prefill_limit if prefill_limit else None
                cell.runs[engine].append({"prefill_tok_s": prefill, "decode_tok_s": decode,
                                          "fraction_of_limit": fraction, "probe_gb_s": limit / 1e9,
                                          "latency_ns": latencies[-2:],
                                          "prefill_limit_tok_s": prefill_limit,
                                          "prefill_of_compute": of_compute,
                                          "kernels": kernels, "huge_page_share": huge,
                                          "worker_share": workers,
                                          "seconds": time.monotonic() - started,
                                          "load": run_load})
                log(f"turn {turn + 1}/{args.turns} {cell.name} {engine}: prefill {prefill:.1f}"
                    + (f" ({100 * of_compute:.0f} % of {prefill_limit:.0f})" if of_compute else "")
                    + f", decode {decode:.1f} tok/s, {100 * fraction:.0f} % of "
                    f"{limit / 1e9:.1f} GB/s (load {run_load:.1f}"
                    + (f"; file in 2 MiB pages {100 * huge:.0f} %" if huge is not None else "")
                    + (f"; workers {100 * workers:.0f} % of the decode" if workers is not None else "") + ")")
        if args.save is not None:  # a run stopped later keeps its finished turns
            tmp = args.save.with_name(f".{args.save.name}.tmp")
            tmp.write_text(json.dumps(report(turn + 1), indent=2))
            os.replace(tmp, args.save)

    final = report(args.turns)
    print(json.dumps(final, indent=2) if args.json else format_report(final))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
