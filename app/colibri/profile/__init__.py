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

from colibri.profile.dataset import DatasetError
from colibri.profile.job import (DEFAULT_VARIANTS, Interrupted, ProfileOutcome, ProfileRequest,
                                 run_profile)
from colibri.profile.shard import ProfileError

__all__ = ["DEFAULT_VARIANTS", "DatasetError", "Interrupted", "ProfileError", "ProfileOutcome",
           "ProfileRequest", "run_profile"]
