"""Shared helpers for the debugger tests (imported as a plain module: tests have no packages)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from colibri.debugging import Debugger, RunSettings
from colibri.engine import Model, Session

PROMPT = (3, 4, 5, 6, 7)


def finished(model: Model, settings: RunSettings) -> Debugger:
    """A debugger that has run `settings` to the end."""
    dbg = Debugger(model, settings)
    assert dbg.run().reason == "finished"
    return dbg


def reference_run(model: Model, prompt: tuple[int, ...], n: int, routing: str = "topk",
                  epsilon: float | None = None, seed: int = 0) -> tuple[Any, list[int]]:
    """What the plain Python API gives: prefill the prompt, then greedy steps (as `colibri run`).
    Returns (trace copy, generated ids)."""
    session = Session(model, routing=routing, epsilon=epsilon, seed=seed, trace=True)  # type: ignore[arg-type]
    logits = session.prefill(prompt)[-1]
    generated: list[int] = []
    while len(generated) < n:
        token = int(np.argmax(logits))
        generated.append(token)
        if len(generated) == n or token == model.hparams.eos_token_id:
            break
        logits = session.step(token)
    trace = session.trace
    assert trace is not None
    out = trace.copy()
    session.close()
    return out, generated


def rewrite_session(path: Path, out: Path,
                    edit: Callable[[dict[str, Any], dict[str, bytes]], object]) -> Path:
    """Session file `path` written again at `out` after `edit(manifest, members)` changed, in
    place, its manifest and its other members (name -> bytes): a file an older or newer version
    wrote, or a broken one."""
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(members.pop("manifest.json"))
    edit(manifest, members)
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("manifest.json", json.dumps(manifest))
        for name, data in members.items():
            z.writestr(name, data)
    return out


def drop_arrays(manifest: dict[str, Any], members: dict[str, bytes], *names: str) -> None:
    """Remove record arrays `names` from a session's manifest and members (see rewrite_session)."""
    for name in names:
        del manifest["arrays"][name]
        del members[f"arrays/{name}.npy"]
