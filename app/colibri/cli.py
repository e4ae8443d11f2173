"""`colibri`: the command line over the public Python API (convert, validate, info, dump, run,
trace).

The API's first user and a debugging aid that needs no GUI. Every subcommand returns an exit code
instead of raising: 0 success, 1 a problem with the input (invalid file, bad argument, conversion
failure), 2 a file that cannot be read at all. Engine errors are printed to stderr as one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from colibri.errors import ColibriError, ColibriFileChangedError, ColibriIOError
from colibri.files import atomic_write
from colibri.tokens import token_text

EXIT_OK, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2

RUN_EPILOG = """\
positions: the prompt's tokens are processed first, then every generated token except the last
one (its logits are never needed), so a run producing M tokens processes len(prompt) + M - 1
positions (len(prompt) when M is 0). --dump-logits writes float32 [positions, vocab], row i being
the logits after position i (the distribution of token i+1); --dump-trace holds the same
positions: expert_ids int32 [positions, moe_layers, k], expert_weights float32 [positions,
moe_layers, k], router_logits float32 [positions, moe_layers, n_experts], selection_scores
float32 [positions, moe_layers, n_experts] (the values the choice ranked: the logits for a
softmax without a correction bias, sigmoid + bias for DeepSeek-V3), chosen_groups int32
[positions, moe_layers, groups] (the kept groups, best first, -1 in layers without groups; only
when a layer routes within groups), bias_changed bool [positions, moe_layers] (the correction bias
changed the choice; only when it did somewhere), moe_layers int32 [moe_layers] (the layer index
of each MoE layer) and tokens int32 [positions].
Decoding is greedy (argmax, lowest id on ties); it stops early after the model's eos token."""


def _err(message: str) -> None:
    print(f"colibri: {message}", file=sys.stderr)


def _failure(exc: ColibriError | OSError) -> int:
    """Print an engine or OS error; exit 2 when the file cannot be read, else 1."""
    _err(str(exc))
    return EXIT_UNREADABLE if isinstance(exc, (ColibriIOError, OSError)) else EXIT_INVALID


def cmd_bench(args: argparse.Namespace) -> int:
    from colibri import bench

    try:
        return bench.run_cli(args)
    except (ColibriError, OSError) as exc:
        return _failure(exc)


def _unreadable(path: str) -> str | None:
    """Why `path` cannot be read as a file at all, or None."""
    if not os.path.exists(path):
        return f"{path}: no such file"
    if os.path.isdir(path):
        return f"{path}: is a directory"
    if not os.access(path, os.R_OK):
        return f"{path}: permission denied"
    return None


_atomic_write = atomic_write  # kept for the subcommands' call sites


# ---------------------------------------------------------------------------------------------
# convert


def _progress_line(done: int, total: int) -> None:
    print(f"\rconverting: {done}/{total} tensors", end="", file=sys.stderr, flush=True)


def cmd_convert(args: argparse.Namespace) -> int:
    try:
        from colibri import convert
    except ImportError as exc:
        _err(f"the converter is not available: {exc}")
        return EXIT_INVALID
    progress = _progress_line if sys.stderr.isatty() else None
    try:
        quant = ({"quantize": args.quantize, "quantize_tensors": args.quantize_tensors}
                 if args.quantize else {})
        convert.convert(args.hf_dir, args.out, dtype=args.dtype, progress=progress, **quant)
    except convert.ConversionError as exc:
        if progress is not None:
            print(file=sys.stderr)
        _err(f"conversion failed: {exc}")
        return EXIT_INVALID
    if progress is not None:
        print(file=sys.stderr)
    print(f"wrote {args.out}")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# validate


def cmd_validate(args: argparse.Namespace) -> int:
    from colibri.engine import validate

    reason = _unreadable(args.file)
    try:
        if reason is not None:
            raise ColibriIOError(reason, 1)
        problems = validate(args.file, checksums=args.checksums, nan_check=args.nan_check)
    except (ColibriIOError, OSError) as exc:
        if args.json:
            print(json.dumps({"valid": False, "error": str(exc), "problems": []}))
        else:
            _err(str(exc))
        return EXIT_UNREADABLE
    except ColibriError as exc:  # the engine refused to validate (e.g. out of memory)
        _err(str(exc))
        return EXIT_INVALID
    valid = not any(p.severity == "error" for p in problems)
    if args.json:
        print(json.dumps({"valid": valid, "problems": [p.to_dict() for p in problems]}, indent=2))
    else:
        for p in problems:
            tensor = f" tensor '{p.tensor}'" if p.tensor else ""
            print(f"{p.severity}: {p.code_name} at 0x{p.offset:X}{tensor}: {p.message}")
        n_err = sum(p.severity == "error" for p in problems)
        n_warn = len(problems) - n_err
        verdict = "valid" if valid else "INVALID"
        print(f"{args.file}: {verdict} ({n_err} error(s), {n_warn} warning(s))")
    return EXIT_OK if valid else EXIT_INVALID


# ---------------------------------------------------------------------------------------------
# info and dump


def _open(path: str) -> Any:
    from colibri.engine import Model

    reason = _unreadable(path)
    if reason is not None:
        raise ColibriIOError(reason, 1)
    return Model.open(path)


def _field_value(value: int | float | bytes | None) -> Any:
    """A header value for JSON: bytes as hex (or a count of zeros), numbers as they are."""
    if isinstance(value, bytes):
        return value.hex() if any(value) else f"{len(value)} zero bytes"
    return value


def _show(value: int | float | bytes | None) -> str:
    """A header or hyper-parameter value for people: float32 fields without float64 noise."""
    if isinstance(value, float):
        return f"{value:.7g}"
    if isinstance(value, bytes) and any(value) and all(32 <= b < 127 for b in value):
        return repr(value)
    return str(_field_value(value))


def _flag_names(flags: int) -> str:
    from colibri.engine import ffi

    names = [name.removeprefix("COL_FLAG_") for bit, name in
             sorted(ffi.typeof("col_model_flag").elements.items()) if flags & bit]
    unknown = flags & ~sum(ffi.typeof("col_model_flag").elements)
    if unknown:
        names.append(f"0x{unknown:X}")
    return "|".join(names) or "none"


def cmd_info(args: argparse.Namespace) -> int:
    try:
        model = _open(args.file)
    except (ColibriError, OSError) as exc:
        return _failure(exc)
    with model:
        header = model.header_fields()
        tensors = model.tensors
        user = model.metadata["user"]
        hp = model.hparams.to_dict()
        routing = [model.routing(layer) for layer in range(model.hparams.n_layers)]
        if args.json:
            doc = {
                "path": model.path, "arch": model.arch, "size": model.size,
                "header": [{"name": f.name, "group": f.group, "offset": f.offset, "size": f.size,
                            "kind": f.kind, "value": _field_value(f.value)} for f in header],
                "hparams": hp, "user_metadata": user,
                "routing": [{**dataclasses.asdict(r), "rule": r.describe()} for r in routing],
                "tensors": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape),
                             "offset": t.offset, "nbytes": t.nbytes, "crc32": t.crc32}
                            for t in tensors],
            }
            print(json.dumps(doc, indent=2, default=str))
            return EXIT_OK
        print(f"{model.path}: {model.arch}, {model.size} bytes, {len(tensors)} tensors")
        print("\nheader:")
        for f in header:
            value = (f"0x{f.value:08X}" if f.name.endswith("crc32") and isinstance(f.value, int)
                     else _show(f.value))
            print(f"  0x{f.offset:03X}  {f.name:<28} {value}")
        print("\nhyper-parameters:")
        for name, value in hp.items():
            extra = f" ({_flag_names(int(value))})" if name == "flags" else ""
            print(f"  {name:<28} {_show(value)}{extra}")
        print("\nrouting:")
        for r in routing:
            print(f"  layer {r.layer:<4} {r.describe()}")
        if user is not None:
            print("\nuser metadata:")
            print("  " + json.dumps(user, sort_keys=True)[:2000])
        print("\ntensors:")
        width = max((len(t.name) for t in tensors), default=4)
        print(f"  {'name':<{width}}  dtype  {'shape':<20} {'offset':>12} {'bytes':>12}")
        for t in tensors:
            shape = "[" + ", ".join(map(str, t.shape)) + "]"
            print(f"  {t.name:<{width}}  {t.dtype:<5}  {shape:<20} 0x{t.offset:010X} {t.nbytes:>12}")
    return EXIT_OK


def cmd_dump(args: argparse.Namespace) -> int:
    try:
        model = _open(args.file)
    except (ColibriError, OSError) as exc:
        return _failure(exc)
    with model:
        if args.tensor not in model:
            _err(f"{args.file}: no tensor {args.tensor!r} (see `colibri info {args.file}`)")
            return EXIT_INVALID
        info = model.tensor_info(args.tensor)
        values = model.tensor_f32(args.tensor)
    finite = values[np.isfinite(values)]
    print(f"{info.name}: dtype {info.dtype}, shape {list(info.shape)}, offset 0x{info.offset:X}, "
          f"{info.nbytes} bytes, crc32 0x{info.crc32:08X}")
    if finite.size:
        print(f"min {finite.min():.6g}  max {finite.max():.6g}  mean {finite.mean():.6g}  "
              f"std {finite.std():.6g}")
    print(f"nan {int(np.isnan(values).sum())}  inf {int(np.isinf(values).sum())}")
    rows = values.reshape(-1, values.shape[-1]) if values.ndim > 1 else values
    n = max(args.rows, 0)
    print(f"first {min(n, rows.shape[0])} row(s):")
    with np.printoptions(precision=5, suppress=True, linewidth=120):
        print(rows[:n])
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# run


def _parse_tokens(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}")


def _token_text(tokenizer: Any, token: int) -> str:
    return repr(token_text(tokenizer, token)) if tokenizer is not None else str(token)


def _print_routing(trace: Any, tokenizer: Any, first: int) -> None:
    """One line per (position >= first, MoE layer): chosen experts and weights."""
    for pos in range(first, trace.n_positions):
        token = int(trace.tokens[pos])
        for m, layer in enumerate(trace.moe_layers):
            ids = ",".join(str(int(e)) for e in trace.expert_ids[pos, m])
            weights = ",".join(f"{float(w):.2f}" for w in trace.expert_weights[pos, m])
            print(f"pos {pos} token {_token_text(tokenizer, token)} layer {int(layer)}: "
                  f"experts [{ids}] weights [{weights}]")


def cmd_run(args: argparse.Namespace) -> int:
    from colibri.engine import Session
    from colibri.reload import HotModel, on_sigusr1

    try:
        model = _open(args.file)
    except (ColibriError, OSError) as exc:
        return _failure(exc)
    with model:
        try:
            tokenizer = model.tokenizer
        except ColibriError as exc:
            if args.prompt is not None:
                return _failure(exc)
            tokenizer = None  # token ids only: a broken tokenizer just means no text output
        if args.prompt is not None:
            if tokenizer is None:
                _err(f"{args.file} has no tokenizer; use --tokens ID,ID,...")
                return EXIT_INVALID
            prompt = list(tokenizer.encode(args.prompt).ids)
        else:
            prompt = args.tokens
        if not prompt:
            _err("the prompt is empty")
            return EXIT_INVALID
        if args.n < 0:
            _err("-n must be >= 0")
            return EXIT_INVALID
        positions = len(prompt) + max(args.n - 1, 0)
        if positions > model.hparams.max_context:
            _err(f"{positions} positions exceed the model's max_context "
                 f"{model.hparams.max_context}")
            return EXIT_INVALID
        want_trace = args.debug_routing or args.dump_trace is not None
        hot = HotModel(args.file, model)
        restore = on_sigusr1(hot)  # `kill -USR1`: reopen, validate and swap between tokens

        def new_session(m: Any) -> Any:
            return Session(m, routing=args.routing, epsilon=args.epsilon, seed=args.seed,
                           threads=args.threads, max_context=max(positions, 1), trace=want_trace)

        try:
            session = new_session(model)
            generated, logits, session = _generate(
                session, prompt, args.n, model.hparams.eos_token_id,
                tokenizer if args.debug_routing else None, args.debug_routing,
                reload=_reloader(hot, new_session))
            trace = session.trace.copy() if want_trace and session.trace is not None else None
            session.close()
        except (ColibriError, OSError) as exc:
            return _failure(exc)
        finally:
            restore()
    if args.dump_logits is not None:
        stacked = np.ascontiguousarray(np.concatenate(logits), dtype=np.float32)
        _atomic_write(args.dump_logits, lambda f: np.save(f, stacked))
    if args.dump_trace is not None and trace is not None:
        arrays = {"expert_ids": trace.expert_ids.astype(np.int32),
                  "expert_weights": trace.expert_weights.astype(np.float32),
                  "router_logits": trace.router_logits.astype(np.float32),
                  "selection_scores": trace.selection_scores.astype(np.float32),
                  "moe_layers": trace.moe_layers.astype(np.int32),
                  "tokens": trace.tokens.astype(np.int32)}
        if trace.chosen_groups.shape[2]:
            arrays["chosen_groups"] = trace.chosen_groups.astype(np.int32)
        if trace.bias_changed.any():
            arrays["bias_changed"] = trace.bias_changed.astype(np.bool_)
        _atomic_write(args.dump_trace, lambda f: np.savez(f, **arrays))
    if tokenizer is not None:
        print(f"prompt: {tokenizer.decode(prompt)}")
        print(f"text: {tokenizer.decode(generated)}")
    print("prompt tokens: " + ",".join(map(str, prompt)))
    print("tokens: " + ",".join(map(str, generated)))
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    """A long-running loop: one prompt per stdin line (comma-separated token ids), greedy
    generation of -n tokens, one `tokens: ...` line out per prompt. `kill -USR1 PID` after an
    atomic replace of FILE (or a replace noticed between tokens) swaps the new model in between
    tokens once it validates; a broken replacement is refused and the loaded model kept."""
    from colibri.engine import Session
    from colibri.errors import ColibriValueError
    from colibri.reload import HotModel, on_sigusr1

    try:
        model = _open(args.file)
    except (ColibriError, OSError) as exc:
        return _failure(exc)
    hot = HotModel(args.file, model)
    restore = on_sigusr1(hot)

    def new_session(m: Any) -> Any:
        return Session(m, routing=args.routing, threads=args.threads, trace=False)

    reload = _reloader(hot, new_session)
    try:
        session = new_session(model)
        print(f"serving {args.file} (pid {os.getpid()})", file=sys.stderr, flush=True)
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                prompt = _parse_tokens(line.strip())
                session = reload(session, [], False) or session
                session.reset()
                generated, _, session = _generate(session, prompt, args.n,
                                                  hot.model.hparams.eos_token_id, None, False,
                                                  reload=reload)
            except (argparse.ArgumentTypeError, ColibriValueError) as exc:
                _err(str(exc))
                continue
            print("tokens: " + ",".join(map(str, generated)), flush=True)
    except (ColibriError, OSError) as exc:
        return _failure(exc)
    finally:
        restore()
    return EXIT_OK


def _reloader(hot: Any, new_session: Callable[[Any], Any]
              ) -> Callable[[Any, list[int], bool], Any | None]:
    """Between tokens: when `hot` has a new model (SIGUSR1, or the file replaced or rewritten),
    a new session on it that has processed `history` again, else None. `changed` says the old
    mapping failed a step (FILE_CHANGED): then a reload is required, not optional."""

    def reload(session: Any, history: list[int], changed: bool) -> Any | None:
        model = hot.poll()
        if model is None:
            if hot.last_error is not None:
                _err(f"reload of {hot.path} refused, keeping the loaded model: {hot.last_error}")
                hot.last_error = None
            return None
        fresh = new_session(model)
        if history:
            fresh.prefill(history, all_logits=False)
        session.close()
        _err(f"reloaded {hot.path} (generation {hot.generation}) at position {len(history)}")
        return fresh

    return reload


def _generate(session: Any, prompt: list[int], n: int, eos: int, tokenizer: Any,
              debug: bool, reload: Callable[[Any, list[int], bool], Any | None] | None = None
              ) -> tuple[list[int], list[np.ndarray], Any]:
    """Greedy decoding; returns the generated ids, the logits of every processed position and
    the session that finished (a different one when `reload` swapped the model between tokens:
    positions before the swap keep the old model's logits)."""
    logits = [session.prefill(prompt)]
    if debug:
        _print_routing(session.trace, tokenizer, 0)
    generated: list[int] = []
    while len(generated) < n:
        token = int(np.argmax(logits[-1][-1]))
        generated.append(token)
        if len(generated) == n or token == eos:
            break
        history = prompt + generated[:-1]
        if reload is not None:
            session = reload(session, history, False) or session
        before = session.position
        try:
            step = session.step(token)
        except ColibriFileChangedError:
            fresh = reload(session, history, True) if reload is not None else None
            if fresh is None:
                raise
            session, before = fresh, fresh.position
            step = session.step(token)
        logits.append(step[None, :])
        if debug:
            _print_routing(session.trace, tokenizer, before)
    return generated, logits, session


# ---------------------------------------------------------------------------------------------
# argument parsing


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="colibri", description="Colibri MoE engine: convert, validate, inspect and run "
                                    ".colibri files.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("convert", help="convert a Hugging Face MoE checkpoint to .colibri")
    p.add_argument("hf_dir", metavar="HF_DIR")
    p.add_argument("out", metavar="OUT.colibri")
    p.add_argument("--dtype", choices=("f32", "f16", "bf16"), default="f32",
                   help="storage dtype of the matrices (norms and routers stay f32)")
    p.add_argument("--quantize", choices=("q8", "q4"), default=None,
                   help="store the --quantize-tensors matrices as q8_0 / q4_0 blocks of 32")
    p.add_argument("--quantize-tensors", choices=("experts", "ffn", "all"), default="experts",
                   help="experts (default): moe_w1/w2/w3; ffn: + shared experts and dense MLPs; "
                        "all: + attention and LM head. The router is never quantised")
    p.set_defaults(func=cmd_convert)

    from colibri import bench  # `colibri bench`
    p = sub.add_parser("bench", help="prefill/decode speed against this machine's measured "
                                     "read bandwidth")
    bench.add_arguments(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("validate", help="check a .colibri file; exit 0 valid, 1 invalid, "
                                        "2 unreadable")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--checksums", action="store_true", help="verify every tensor's CRC-32")
    p.add_argument("--nan-check", action="store_true", help="scan every tensor for NaN/Inf")
    p.add_argument("--json", action="store_true", help='print {"valid": ..., "problems": [...]}')
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("info", help="header fields, hyper-parameters and tensor table")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("dump", help="statistics and first rows of one tensor")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--tensor", required=True, metavar="NAME")
    p.add_argument("--rows", type=int, default=4, metavar="N",
                   help="rows to print (of the tensor viewed as [-1, last dim]); default 4")
    p.set_defaults(func=cmd_dump)

    p = sub.add_parser("run", help="greedy generation", epilog=RUN_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", metavar="TEXT", help="text, encoded by the embedded tokenizer")
    source.add_argument("--tokens", type=_parse_tokens, metavar="ID,ID,...", help="token ids")
    p.add_argument("-n", type=int, default=16, metavar="N", help="tokens to generate (default 16)")
    p.add_argument("--routing", choices=("topk", "stable", "soft", "gumbel"), default="topk")
    p.add_argument("--epsilon", type=float, default=None,
                   help="stable-routing epsilon (default: the model's default_epsilon)")
    p.add_argument("--seed", type=int, default=0, help="Gumbel routing seed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--debug-routing", action="store_true",
                   help="print the experts and weights chosen per position and MoE layer")
    p.add_argument("--dump-logits", metavar="OUT.npy", help="save float32 [positions, vocab]")
    p.add_argument("--dump-trace", metavar="OUT.npz", help="save the routing trace")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("serve", help="generate for prompts read from stdin (one per line: token "
                                     "ids); SIGUSR1 hot-reloads FILE between tokens")
    p.add_argument("file", metavar="FILE")
    p.add_argument("-n", type=int, default=16, metavar="N", help="tokens per prompt (default 16)")
    p.add_argument("--routing", choices=("topk", "stable", "soft", "gumbel"), default="topk")
    p.add_argument("--threads", type=int, default=1)
    p.set_defaults(func=cmd_serve)

    from colibri.debugging.commands import add_trace_parser  # `colibri trace` (the debugger)
    add_trace_parser(sub)
    from colibri.jitter.cli import add_commands as add_jitter_commands  # `jitter`, `epsilon`
    add_jitter_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except BrokenPipeError:  # `colibri info big.colibri | head`
        sys.stderr.close()
        return EXIT_OK
    return code


if __name__ == "__main__":
    sys.exit(main())
