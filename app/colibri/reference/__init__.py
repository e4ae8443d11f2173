"""Colibri against its reference implementation: a .colibri file and the Hugging Face checkpoint
it came from, run side by side and compared layer by layer (`colibri diff`, the Inspector's
reference diff).

  * colibri.reference.diff: both runs of a prompt, the comparison (`ReferenceDiff`: hidden-state
    and router-logit differences per layer and position, routing divergences with their cause)
    and its JSON; numpy only at import.
  * colibri.reference.transformers_run: the checkpoint run by transformers and read through
    hooks (the `reference` extra: torch, transformers); the conformance tests read it too.
"""
