"""Shared by the profile tests: the demo model, the small corpus shipped beside these tests, the
settings every run of them uses, and a comparison of two profiles' Parquet tables."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from colibri.profile.job import ProfileRequest
from colibri.profile.tables import TABLES

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo" / "demo.colibri"
CORPUS = Path(__file__).resolve().parent / "corpus.jsonl"
COLIBRI = [sys.executable, "-m", "colibri.cli"]

# Small windows and shards, so the corpus (31 records, 6892 tokens) makes several shards and
# every record several windows; jitter on every 4th window under two cheap variants.
SETTINGS: dict[str, Any] = {"window": 128, "shard_tokens": 1024, "jitter_variants":
                            ("noise1", "act-bf16"), "jitter_every": 4}
CLI_SETTINGS = ["--window", "128", "--shard-tokens", "1024", "--jitter-variants",
                "noise1,act-bf16", "--jitter-every", "4"]


def request(out_dir: str | os.PathLike[str], **changes: Any) -> ProfileRequest:
    options = {**SETTINGS, "workers": 1, **changes}
    return ProfileRequest(str(DEMO), str(CORPUS), os.fspath(out_dir), **options)


def read_tables(directory: str | os.PathLike[str]) -> dict[str, Any]:
    return {name: pq.read_table(os.path.join(directory, f"{name}.parquet")) for name in TABLES}


def assert_same_statistics(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> None:
    """Every Parquet table of the two profiles holds the same rows, bit for bit."""
    ta, tb = read_tables(a), read_tables(b)
    for name in TABLES:
        assert ta[name].schema == tb[name].schema, name
        assert ta[name].num_rows == tb[name].num_rows, name
        assert ta[name].equals(tb[name]), f"{name}.parquet differs"
