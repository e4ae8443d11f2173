"""`colibri profile` on one machine: the statistics are the engine's routing, counted right; local
worker processes give the same bits as one worker; a killed run resumes to the same result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from colibri.engine import Model, Session
from colibri.jitter import Runner, Variant, margins
from colibri.margins import group_limits
from colibri.profile import ProfileError, run_profile
from colibri.profile.classes import CLASS_NAMES
from colibri.profile.dataset import read_documents, tokenize
from colibri.profile.job import SHARD_DIR, SUMMARY
from colibri.profile.results import CorpusProfile, compare
from colibri.profile.stats import ulp_bin_index

from profile_helpers import (CLI_SETTINGS, COLIBRI, CORPUS, DEMO, ROOT, SETTINGS,
                             assert_same_statistics, read_tables, request)


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference profile: one worker, in this process."""
    out = tmp_path_factory.mktemp("profile") / "local"
    run_profile(request(out))
    return out


def _windows() -> list[np.ndarray]:
    model = Model.open(DEMO)
    corpus = tokenize(read_documents(str(CORPUS)), model.tokenizer, SETTINGS["window"],
                      model.hparams.vocab_size, str(CORPUS))
    return [corpus.window(w) for w in range(corpus.n_windows)]


def test_statistics_are_the_engines_routing(local_dir: Path) -> None:
    """Load, mean weight, co-selection, token counts and margin histograms equal what a plain
    Session run of every window, counted here with numpy, gives."""
    model = Model.open(DEMO)
    hp = model.hparams
    E, k = hp.n_experts, hp.n_experts_active
    windows = _windows()
    ids, weights, traces, toks = [], [], [], []
    with Session(model, max_context=SETTINGS["window"]) as s:
        for w in windows:
            s.reset()
            s.prefill(w, all_logits=False)
            t = s.trace
            ids.append(np.array(t.expert_ids))
            weights.append(np.array(t.expert_weights))
            traces.append(t.copy())
            toks.append(np.array(t.tokens))
    ids_a, w_a, tok_a = np.concatenate(ids), np.concatenate(weights), np.concatenate(toks)
    M = ids_a.shape[1]
    profile = CorpusProfile.open(local_dir)
    assert profile.n_tokens == tok_a.size == sum(w.size for w in windows)
    for m in range(M):
        load = np.bincount(ids_a[:, m].reshape(-1), minlength=E)
        assert profile.load[m].tolist() == load.tolist()
        wsum = np.bincount(ids_a[:, m].reshape(-1), weights=w_a[:, m].reshape(-1), minlength=E)
        np.testing.assert_allclose(profile.mean_weight[m], wsum / load, rtol=1e-12)
        both = np.zeros((E, E))
        for a in range(E):
            for b in range(E):
                if a != b:
                    both[a, b] = ((ids_a[:, m] == a).any(-1) & (ids_a[:, m] == b).any(-1)).sum()
        assert profile.coselection_counts[m].tolist() == both.astype(np.int64).tolist()
    ulps = np.concatenate([margins(t, group_limits(model), k)[1] for t in traces])
    for m in range(M):
        hist = np.bincount(ulp_bin_index(ulps[:, m]), minlength=profile.ulp_hist.shape[1])
        assert profile.ulp_hist[m].tolist() == hist.tolist()
    tokens = read_tables(local_dir)["tokens"].to_pydict()
    for m, layer in enumerate(profile.layers):
        for e in (0, 5):
            want = np.bincount(tok_a[(ids_a[:, m] == e).any(-1)], minlength=hp.vocab_size)
            got = np.zeros(hp.vocab_size, np.int64)
            for lay, ex, t, c in zip(tokens["layer"], tokens["expert"], tokens["token_id"],
                                     tokens["count"]):
                if lay == layer and ex == e:
                    got[t] = c
            assert got.tolist() == want.tolist()


def test_token_classes_and_examples_add_up(local_dir: Path) -> None:
    profile = CorpusProfile.open(local_dir)
    assert profile.class_counts.sum(axis=-1).tolist() == profile.load.tolist()
    assert profile.class_occurrences.sum() == profile.n_tokens
    digits = CLASS_NAMES.index("digits")
    assert profile.class_occurrences[digits] > 0   # the corpus has a record of numbers
    for m in range(len(profile.layers)):
        e = int(profile.load[m].argmax())
        rows = profile.top_tokens(m, e, 10)
        assert [r.count for r in rows] == sorted((r.count for r in rows), reverse=True)
        assert all(0 < r.share_of_token <= 1 for r in rows)
        examples = profile.examples(m, e)
        assert 0 < len(examples) <= 16
        assert [x.weight for x in examples] == sorted((x.weight for x in examples), reverse=True)
        assert all(x.record >= 1 and x.token for x in examples)


def test_jitter_counts_are_the_jitter_labs_flips(local_dir: Path) -> None:
    """The sampled windows' flips under act-bf16 are those the jitter lab's Runner finds."""
    profile = CorpusProfile.open(local_dir)
    windows = _windows()
    sampled = windows[::SETTINGS["jitter_every"]]
    k = profile.k
    cells = np.zeros_like(profile.jitter_cells[0])
    flips = np.zeros_like(profile.jitter_flips[0])
    with Runner.open(DEMO) as runner:
        for w in sampled:
            base = runner.run(w)
            run = runner.run(w, Variant.parse("act-bf16"))
            bins = ulp_bin_index(margins(base, group_limits(runner.model), k)[1])
            flipped = (run.sets != base.sets).any(-1)
            for m in range(bins.shape[1]):
                cells[m] += np.bincount(bins[:, m], minlength=cells.shape[1])
                flips[m] += np.bincount(bins[flipped[:, m], m], minlength=cells.shape[1])
    v = profile.variants.index("act-bf16")
    assert profile.jitter_cells[v].tolist() == cells.tolist()
    assert profile.jitter_flips[v].tolist() == flips.tolist()
    assert profile.summary["totals"]["sampled_windows"] == len(sampled)


def test_worker_processes_give_the_same_statistics(local_dir: Path, tmp_path: Path) -> None:
    outcome = run_profile(request(tmp_path / "two", workers=2))
    assert outcome.summary["run"]["workers"] == 2
    assert_same_statistics(local_dir, tmp_path / "two")
    diff = compare(CorpusProfile.open(local_dir), CorpusProfile.open(tmp_path / "two"))
    assert not diff.load_share.any() and not np.nan_to_num(diff.class_lift).any()


def test_a_finished_profile_is_not_run_again(local_dir: Path, tmp_path: Path) -> None:
    before = read_tables(local_dir)
    again = run_profile(request(local_dir))
    assert again.resumed == again.shards > 1 and again.tokens_run == 0
    after = read_tables(local_dir)
    assert all(before[name].equals(after[name]) for name in before)


def test_other_settings_are_refused_in_a_profile_directory(tmp_path: Path) -> None:
    out = tmp_path / "p"
    run_profile(request(out, max_tokens=300))
    with pytest.raises(ProfileError, match=r"other settings \(different: window\)"):
        run_profile(request(out, max_tokens=300, window=64))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ProfileError, match="not empty and holds no profile"):
        run_profile(request(tmp_path / "other"))


def _shards(out: Path) -> list[Path]:
    directory = out / SHARD_DIR
    return sorted(directory.glob("shard-*.npz")) if directory.exists() else []


def _living(group: int) -> list[str]:
    """The processes of a process group that still run (zombies awaiting their reaper aside)."""
    ps = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(group)], capture_output=True,
                        text=True)
    return [line for line in ps.stdout.splitlines() if "Z" not in line.split()[1]]


def _interruptible() -> None:
    """In the child before exec: Ctrl+C as a terminal delivers it, even where this test run
    inherited SIGINT ignored (a job started in the background by a non-interactive shell)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*COLIBRI, "profile", str(DEMO), "--dataset", str(CORPUS), "--out",
                             str(out), *CLI_SETTINGS, "--workers", "1", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=ROOT, preexec_fn=_interruptible)


def _wait_for_shards(proc: subprocess.Popen[str], out: Path, n: int) -> None:
    deadline = time.monotonic() + 120
    while len(_shards(out)) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no shard finished in time"
        time.sleep(0.05)


def test_a_killed_run_resumes_to_the_same_result(local_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "killed"
    proc = _start(out)
    try:
        _wait_for_shards(proc, out, 2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)   # no chance to clean up: as a crash or power cut
        proc.communicate()
    kept = len(_shards(out))
    assert kept >= 2 and not (out / SUMMARY).exists()
    result = subprocess.run([*COLIBRI, "profile", str(DEMO), "--dataset", str(CORPUS), "--out",
                             str(out), *CLI_SETTINGS, "--workers", "1", "--json"],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["run"]["resumed_shards"] == kept
    assert_same_statistics(local_dir, out)


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm"])
def test_a_stop_is_clean_and_keeps_finished_shards(local_dir: Path, tmp_path: Path,
                                                   stop: str) -> None:
    out = tmp_path / "interrupted"
    proc = _start(out, "--workers", "2")
    try:
        _wait_for_shards(proc, out, 1)
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)   # Ctrl+C reaches the whole process group
        else:
            os.kill(proc.pid, signal.SIGTERM)    # a scheduler stops the main process only
        _, err = proc.communicate(timeout=60)
        deadline = time.monotonic() + 10
        while _living(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _living(proc.pid), f"worker processes outlived the run: {_living(proc.pid)}"
    finally:
        if _living(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    kept = len(_shards(out))
    assert f"interrupted: {kept} of " in err and "run the same command again to resume" in err
    assert not (out / SUMMARY).exists()
    outcome = run_profile(request(out))
    assert outcome.resumed == kept
    assert_same_statistics(local_dir, out)
