"""`colibri profile --ray`: the shards as Ray tasks on a local Ray cluster that this test starts
(two worker CPUs, loopback only) give the same Parquet statistics as the local run."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from colibri.profile import run_profile

from profile_helpers import CLI_SETTINGS, COLIBRI, CORPUS, DEMO, ROOT, assert_same_statistics, request

RAY = str(Path(sys.executable).with_name("ray"))
# Loopback only, no usage reports, and Ray's token authentication with a token of this test's
# own (nothing is written to ~/.ray).
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
       "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """A Ray head node with 2 CPUs on 127.0.0.1, stopped (only the processes it started) after
    the module. Its temporary directory is short: Ray's socket paths must fit 107 bytes."""
    temp = tempfile.mkdtemp(prefix="cray", dir="/tmp")
    port = _free_port()
    proc = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
         "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
         f"--temp-dir={temp}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV,
        start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(0.5)
        yield address
    finally:
        # Every Ray process of this head is in the session the test started: stop them all.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_cluster_gives_the_local_statistics(ray_cluster: str, tmp_path: Path) -> None:
    run_profile(request(tmp_path / "local"))
    result = subprocess.run(
        [*COLIBRI, "profile", str(DEMO), "--dataset", str(CORPUS), "--out", str(tmp_path / "ray"),
         *CLI_SETTINGS, "--ray", ray_cluster, "--workers", "2", "--json"],
        capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600)
    assert result.returncode == 0, result.stderr
    assert f'"backend": "ray {ray_cluster}"' in result.stdout
    assert_same_statistics(tmp_path / "local", tmp_path / "ray")


def test_an_unreachable_cluster_is_a_clear_error(tmp_path: Path) -> None:
    port = _free_port()   # nothing listens there
    result = subprocess.run(
        [*COLIBRI, "profile", str(DEMO), "--dataset", str(CORPUS), "--out", str(tmp_path / "p"),
         "--max-tokens", "200", "--ray", f"127.0.0.1:{port}"],
        capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120)
    assert result.returncode == 1
    assert (f"cannot start or join the Ray cluster '127.0.0.1:{port}': nothing answers there"
            in result.stderr)


def test_ray_local_starts_its_own_instance(tmp_path: Path) -> None:
    run_profile(request(tmp_path / "local", max_tokens=3000))
    result = subprocess.run(
        [*COLIBRI, "profile", str(DEMO), "--dataset", str(CORPUS), "--out", str(tmp_path / "ray"),
         *CLI_SETTINGS, "--max-tokens", "3000", "--ray", "local", "--workers", "2", "--json"],
        capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600)
    assert result.returncode == 0, result.stderr
    assert '"backend": "ray local"' in result.stdout
    assert_same_statistics(tmp_path / "local", tmp_path / "ray")


WITHOUT_RAY = """
import sys
sys.modules["ray"] = None   # as after `pip install .`, without the cluster extra
from colibri.cli import main
code = main(["profile", sys.argv[1], "--dataset", sys.argv[2], "--out", sys.argv[3],
             "--max-tokens", "300", "--workers", "1"])
assert code == 0, code
assert main(["profile", sys.argv[1], "--dataset", sys.argv[2], "--out", sys.argv[3] + "-ray",
             "--max-tokens", "300", "--ray", "local"]) == 1
"""


def test_profile_runs_without_ray_and_says_how_to_get_it(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", WITHOUT_RAY, str(DEMO), str(CORPUS),
                             str(tmp_path / "p")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert ("--ray needs Ray, which is not installed: pip install 'colibri-moe[cluster]'"
            in result.stderr)
    assert (tmp_path / "p" / "summary.json").exists()
