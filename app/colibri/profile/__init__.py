"""Routing over a whole corpus (Qt-free): which experts carry which tokens, how balanced each
layer is, which experts are chosen together, how close decisions sit to a tie and how often
they flip under other numerics.

    outcome = run_profile(ProfileRequest("model.colibri", "corpus.jsonl", "prof/", field="text"))
    profile = CorpusProfile.open("prof/")              # what the Inspector's Corpus view reads

The job (`job`) tokenises the dataset (`dataset`), runs its shards through the per-shard
function (`shard.run_shard`) here, in local worker processes or as Ray tasks (`ray_backend`),
merges their statistics (`stats`) and writes Parquet tables (`tables`) and a JSON summary;
`results` reads a profile back and compares two.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from colibri.lazy import lazy_exports

if TYPE_CHECKING:
    from colibri.profile.dataset import DatasetError
    from colibri.profile.job import Interrupted, ProfileOutcome, ProfileRequest, run_profile
    from colibri.profile.shard import ProfileError

# The numerics variants a profile counts flips under by default: cheap ones (the reduction-order
# variants re-run every window). Here, not in `job`, so that the CLI's parser can name them
# without loading the job (the engine, Parquet, the jitter lab).
DEFAULT_VARIANTS = ("noise1", "act-bf16")

# Each name is imported from its module on first use.
__getattr__ = lazy_exports(__name__, {
    "colibri.profile.dataset": ("DatasetError",),
    "colibri.profile.job": ("Interrupted", "ProfileOutcome", "ProfileRequest", "run_profile"),
    "colibri.profile.shard": ("ProfileError",),
})


__all__ = ["DEFAULT_VARIANTS", "DatasetError", "Interrupted", "ProfileError", "ProfileOutcome",
           "ProfileRequest", "run_profile"]
