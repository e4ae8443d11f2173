"""What every `colibri` command shares: exit codes, the one error printer, the one place that
opens a model file, and the arguments spelled the same in every command.

Exit codes: 0 success, 1 a problem with the input (invalid file, bad argument, failed
conversion), 2 a file that cannot be read at all. A command returns its code, or raises
`CommandError` (its message and code) or an engine/OS error, which `colibri.cli.main` prints as
one line through `error`.

Arguments: `-n/--generate N` (tokens to generate), `--prompt TEXT` or `--tokens ID,ID,...` (the
prompt; one of them is required), `-t/--threads N`, `--routing`, `--epsilon`, `--seed`, and
`--json` (machine-readable output instead of the text) mean the same everywhere.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from colibri.errors import ColibriError, ColibriIOError
from colibri.tokens import EMBEDDING_TEXT, parse_token_ids, token_text
from colibri.values import ROUTING_MODES

EXIT_OK, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2


class CommandError(Exception):
    """A command cannot go on: `message` is printed, `code` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_INVALID) -> None:
        super().__init__(message)
        self.code = code


def error(message: str) -> None:
    """The one way a command reports a problem: `colibri: message` on stderr."""
    print(f"colibri: {message}", file=sys.stderr)


def exit_code(exc: BaseException) -> int:
    """The exit status of a failure: 2 when a file cannot be read at all, else 1."""
    if isinstance(exc, CommandError):
        return exc.code
    return EXIT_UNREADABLE if isinstance(exc, (ColibriIOError, OSError)) else EXIT_INVALID


def failure(exc: BaseException) -> int:
    """Print a failure and return its exit status."""
    error(str(exc))
    return exit_code(exc)


def fail(message: str, code: int = EXIT_INVALID) -> NoReturn:
    raise CommandError(message, code)


# ---------------------------------------------------------------------------------------------
# Files


def unreadable(path: str) -> str | None:
    """Why `path` cannot be read as a file at all, or None."""
    if not os.path.exists(path):
        return f"{path}: no such file"
    if os.path.isdir(path):
        return f"{path}: is a directory"
    if not os.access(path, os.R_OK):
        return f"{path}: permission denied"
    return None


def open_model(path: str) -> Any:
    """The one place that decides how a path is opened as a model: raises ColibriIOError (exit 2)
    for a path that cannot be read, and the engine's errors for a file it refuses."""
    from colibri.engine import Model

    reason = unreadable(path)
    if reason is not None:
        raise ColibriIOError(reason, 1)
    return Model.open(path)


# ---------------------------------------------------------------------------------------------
# Prompts and tokens


def token_ids(text: str) -> list[int]:
    """argparse type of --tokens: comma-separated token ids (colibri.tokens.parse_token_ids)."""
    try:
        return parse_token_ids(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def tokenizer_of(model: Any, needed: bool) -> Any:
    """The model's tokenizer, or None. A broken embedded tokenizer is an error only when it is
    `needed` (a --prompt to encode); with token ids it just means no text output."""
    try:
        return model.tokenizer
    except ColibriError:
        if needed:
            raise
        return None


def prompt_ids(args: argparse.Namespace, model: Any, tokenizer: Any) -> list[int]:
    """The prompt of --prompt (encoded) or --tokens; CommandError when there is none."""
    if args.prompt is not None:
        if tokenizer is None:
            fail(f"{args.file} has no tokenizer; use --tokens ID,ID,...")
        ids = list(tokenizer.encode(args.prompt).ids)
    else:
        ids = list(args.tokens)
    if not ids:
        fail("the prompt is empty")
    return ids


def progress_line(done: int, total: int, text: str = "") -> None:
    """A colibri.values.Progress for long commands: one rewritten line on a terminal's stderr,
    nothing when stderr is not a terminal."""
    if sys.stderr.isatty():
        print(f"\r[{done}/{total}] {text:<40}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)


def token_label(tokenizer: Any, token: int) -> str:
    """How a token is shown in a line of output: its text quoted, or the id without tokenizer;
    an embedding row fed instead of a token (id -1) is `<embedding>`."""
    if token < 0:
        return EMBEDDING_TEXT
    return repr(token_text(tokenizer, token)) if tokenizer is not None else str(token)


# ---------------------------------------------------------------------------------------------
# Arguments spelled the same in every command


def add_file(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE")


def add_prompt(p: argparse.ArgumentParser, embedding: bool = False) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", metavar="TEXT", help="text, encoded by the embedded tokenizer")
    source.add_argument("--tokens", type=token_ids, metavar="ID,ID,...",
                        help="comma-separated token ids")
    if embedding:
        source.add_argument("--embedding", metavar="X.npy",
                            help="float32 [positions, hidden] rows fed instead of the token "
                                 "embedding lookup")


def intervention_spec(text: str) -> Any:
    """argparse type of --intervene: the spec's grammar (the engine judges the ranges)."""
    from colibri.interventions import Intervention, InterventionError

    try:
        return Intervention.parse(text)
    except InterventionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_intervene(p: argparse.ArgumentParser, help: str) -> None:
    """--intervene SPEC, repeatable (docs/interventions.md): a list of Interventions."""
    p.add_argument("--intervene", action="append", type=intervention_spec, default=[],
                   metavar="SPEC", help=help)


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def add_generate(p: argparse.ArgumentParser, default: int, what: str = "tokens to generate",
                 at_least_one: bool = False) -> None:
    p.add_argument("-n", "--generate", dest="generate", type=positive_int if at_least_one else int,
                   default=default, metavar="N", help=f"{what} (default {default})")


def add_threads(p: argparse.ArgumentParser, what: str = "") -> None:
    p.add_argument("-t", "--threads", type=int, default=1, metavar="N",
                   help=what or "engine threads (results are identical for any count)")


def add_routing(p: argparse.ArgumentParser, epsilon: bool = True, seed: str = "",
                caching: bool = False) -> None:
    """--routing (and --epsilon, --seed); with `caching`, the 'cached' mode and the expert
    cache's options (read back with `caching_options`)."""
    modes = [m for m in ROUTING_MODES if caching or m != "cached"]
    p.add_argument("--routing", choices=modes, default="topk")
    if epsilon:
        p.add_argument("--epsilon", type=float, default=None,
                       help="stable-routing epsilon (default: the model's default_epsilon)")
    if seed:
        p.add_argument("--seed", type=int, default=0, help=seed)
    if caching:
        p.add_argument("--cache-threshold", type=float, default=None, metavar="T",
                       help="--routing cached: a MoE layer keeps the previous position's experts "
                            "while the new top-k's margin over them (summed selection scores "
                            "gained minus dropped) is below T")
        p.add_argument("--expert-cache", type=int, default=0, metavar="N",
                       help="an LRU of N resident experts per MoE layer: hits and misses in the "
                            "trace, the hit rate in the summary (a model of residency)")


def caching_options(args: argparse.Namespace) -> dict[str, float | int]:
    """The Session keywords of --cache-threshold and --expert-cache. The cached mode needs its
    threshold, and a threshold without it would be ignored: both are CommandErrors."""
    if args.routing == "cached" and args.cache_threshold is None:
        fail("--routing cached needs --cache-threshold T (the margin below which a MoE layer "
             "keeps the previous position's experts)")
    if args.routing != "cached" and args.cache_threshold is not None:
        fail("--cache-threshold applies to --routing cached")
    return {"cache_threshold": args.cache_threshold or 0.0, "expert_cache": args.expert_cache}


def add_json(p: argparse.ArgumentParser, help: str = "print JSON instead of text") -> None:
    p.add_argument("--json", action="store_true", help=help)


def add_numerics(p: argparse.ArgumentParser, more: str = "") -> None:
    """--numerics SPEC (read back as a canonical spec, or None when not given)."""
    p.add_argument("--numerics", type=numerics_spec, default=None, metavar="SPEC",
                   help="numerics variant (colibri.numerics spec; default: exact), e.g. dot-bf16: "
                        "bf16 weights by bf16 dot products, faster on CPUs with AVX512-BF16 and "
                        "no AMX; kv-f16: the KV cache in halves, half its bytes and memory at long "
                        "contexts" + more)


def numerics_spec(text: str) -> str:
    """argparse type: a numerics spec that parses, in its canonical spelling (whether the engine
    can run it is the session's to say)."""
    from colibri.numerics import Numerics, NumericsError

    try:
        return Numerics.parse(text).spec
    except NumericsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_UNREADABLE", "CommandError", "add_file",
           "add_generate", "add_json", "add_numerics", "add_prompt", "add_routing", "add_threads",
           "caching_options", "error", "exit_code", "fail", "failure", "numerics_spec",
           "open_model", "positive_int", "progress_line", "prompt_ids", "token_ids", "token_label",
           "tokenizer_of", "unreadable"]
