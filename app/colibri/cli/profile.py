"""`colibri profile`: routing statistics over a whole corpus, on this machine or a Ray cluster.

    colibri profile FILE --dataset PATH --out PROFILE_DIR [--field NAME] [--format F]
                    [--window N] [--max-tokens N] [--routing R] [--epsilon E] [--seed S]
                    [--jitter-variants LIST] [--jitter-every N] [--workers N] [--threads N]
                    [--shard-tokens N] [--ray ADDRESS|local] [--json]

A progress bar (tokens, tokens/s, ETA) goes to stderr; Ctrl+C (or SIGTERM) stops cleanly (exit
130) and keeps every finished shard, so running the same command again resumes. Exit 1 for a bad dataset,
argument or job, 2 for a model file that cannot be read (the engine's and OS errors go to
`colibri.cli.main`'s one printer).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from colibri.cli.common import (EXIT_OK, add_file, add_json, add_routing, add_threads, error,
                                failure)
from colibri.jitter.variants import DEFAULT_VARIANTS as JITTER_VARIANTS
from colibri.profile import DEFAULT_VARIANTS
from colibri.profile.dataset import FORMATS

if TYPE_CHECKING:
    from colibri.profile.job import ProfileOutcome

EXIT_INTERRUPTED = 130


class BarProgress:
    """A `colibri.values.Progress` drawing tqdm's bar on stderr: tokens done, tokens/s and the
    time left (the first report's `done` is what an earlier run already finished)."""

    def __init__(self) -> None:
        self._bar: Any = None

    def __call__(self, done: int, total: int, text: str = "") -> None:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=done, unit="tok", unit_scale=True,
                             desc="profile", file=sys.stderr, dynamic_ncols=True, smoothing=0.05,
                             disable=None)
        elif done > self._bar.n:
            self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _raise_interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def _variants(text: str | None) -> list[str]:
    if text is None:
        return list(DEFAULT_VARIANTS)
    if text.strip().lower() in ("", "none"):
        return []
    return [s.strip() for s in text.split(",") if s.strip()]


def print_outcome(outcome: ProfileOutcome) -> None:
    from colibri.profile.results import CorpusProfile

    s = outcome.summary
    tot, model, run = s["totals"], s["model"], s["run"]
    profile = CorpusProfile.open(outcome.out_dir)
    print(f"profile: {model['name']} on {os.path.basename(s['dataset']['path'])}: "
          f"{tot['tokens']:,} tokens ({s['dataset']['records']:,} records, {tot['windows']:,} "
          f"windows) x {len(model['moe_layers'])} MoE layers, top-{model['k']} of "
          f"{model['n_experts']} experts")
    rate = run["tokens_per_s"]
    print(f"run: {outcome.shards} shards ({outcome.resumed} already done), {run['backend']}, "
          f"{run['workers']} worker(s) x {run['threads']} thread(s), {run['elapsed_s']:.1f} s"
          + (f", {rate:,.0f} tok/s" if rate else ""))
    print()
    print(f"{'layer':>5} {'load CV':>8} {'max/mean':>8}  {'busiest expert':<16} "
          f"{'idlest expert':<16} {'median margin':>14}")
    for i, layer in enumerate(profile.layers):
        share = profile.load_share[i]
        hi, lo = int(share.argmax()), int(share.argmin())
        print(f"{layer:>5} {profile.load_cv[i]:>8.3f} {profile.max_over_mean[i]:>8.2f}  "
              f"{f'{hi} ({share[hi]:.1%})':<16} {f'{lo} ({share[lo]:.1%})':<16} "
              f"{profile.median_margin_label(i):>14}")
    if profile.variants:
        print(f"\njitter on {tot['sampled_windows']:,} sampled windows "
              f"({tot['sampled_tokens']:,} tokens; 1 window in {s['settings']['jitter_every']}):")
        for v in profile.variants:
            cells, flips = profile.jitter_totals(v)
            print(f"  {v:<22} {flips:>7,} of {cells:,} cells flipped "
                  f"({flips / max(cells, 1):.4%})")
    print(f"\nwrote {outcome.out_dir}: {', '.join(outcome.files)}, summary.json")


def cmd_profile(args: argparse.Namespace) -> int:
    from colibri.profile.dataset import DatasetError
    from colibri.profile.job import Interrupted, ProfileRequest, run_profile
    from colibri.profile.shard import ProfileError

    req = ProfileRequest(
        model=args.file, dataset=args.dataset, out_dir=args.out, fmt=args.format,
        field=args.field, window=args.window, shard_tokens=args.shard_tokens,
        max_tokens=args.max_tokens, routing=args.routing, epsilon=args.epsilon, seed=args.seed,
        jitter_variants=_variants(args.jitter_variants), jitter_every=args.jitter_every,
        workers=args.workers, threads=args.threads, ray=args.ray)
    # `kill PID` (a scheduler's stop) stops as cleanly as Ctrl+C: finished shards are kept and
    # the worker processes are ended with the run.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    bar = BarProgress()
    try:
        outcome = run_profile(req, bar)
    except Interrupted as exc:
        bar.close()
        error(str(exc))
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # before any shard ran (reading or tokenising the dataset)
        bar.close()
        error("interrupted before any shard ran")
        return EXIT_INTERRUPTED
    except (DatasetError, ProfileError) as exc:
        bar.close()
        return failure(exc)
    finally:
        bar.close()
        signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(json.dumps(outcome.summary, indent=1, sort_keys=True))
    else:
        print_outcome(outcome)
    return EXIT_OK


def add_commands(sub: Any) -> None:
    """Register `profile` on the CLI's subparsers."""
    p = sub.add_parser(
        "profile", help="routing statistics over a corpus (expert load, token classes, "
        "co-selection, margins, sampled jitter) as Parquet; resumable; local or on Ray",
        description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_file(p)
    p.add_argument("--dataset", required=True, metavar="PATH",
                   help="a text file (one document), JSON Lines (.jsonl) or Parquet (.parquet)")
    p.add_argument("--out", required=True, metavar="PROFILE_DIR",
                   help="directory of the profile (created; an unfinished one is resumed)")
    p.add_argument("--field", default=None, metavar="NAME",
                   help="the text field of JSON Lines / Parquet records (default 'text')")
    p.add_argument("--format", choices=("auto", *FORMATS), default="auto",
                   help="dataset format (default: from the extension)")
    p.add_argument("--window", type=int, default=512, metavar="N",
                   help="tokens per window, each run from an empty context (default 512)")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N",
                   help="profile the first N tokens of the dataset only")
    add_routing(p, seed="Gumbel routing seed")
    p.add_argument("--jitter-variants", default=None, metavar="LIST",
                   help="numerics variants whose flips are counted on sampled windows, as "
                   "`colibri jitter --variants` (e.g. " + ",".join(JITTER_VARIANTS[:4]) +
                   ", w-bf16, k-avx2); 'none' for no jitter. Default: "
                   + ",".join(DEFAULT_VARIANTS) + " (cheap; the reduction-order variants take "
                   "1.2-2x the default's time to decode and 2.5-4.5x to prefill)")
    p.add_argument("--jitter-every", type=int, default=32, metavar="N",
                   help="run the jitter variants on every Nth window (default 32)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes, each mapping the model file (default: the CPU "
                   "count); with --ray local the Ray instance's workers, with --ray ADDRESS the "
                   "tasks run at once (default: the cluster's CPUs / threads)")
    add_threads(p, "engine threads per worker (default 1; results are identical for any count)")
    p.add_argument("--shard-tokens", type=int, default=16384, metavar="N",
                   help="tokens per shard, the unit of resumption and of work sent to a worker "
                   "(default 16384)")
    p.add_argument("--ray", default=None, metavar="ADDRESS|local",
                   help="run the shards as Ray tasks: on the cluster at ADDRESS (host:port), or "
                   "on a Ray instance started here with --workers workers (needs "
                   "pip install 'colibri-moe[cluster]')")
    add_json(p, "print the summary as JSON")
    p.set_defaults(func=cmd_profile)


__all__ = ["add_commands", "cmd_profile", "print_outcome"]
