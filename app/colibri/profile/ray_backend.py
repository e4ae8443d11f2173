"""Running a profile's shards as Ray tasks, on a cluster or on a Ray instance started here.

`--ray ADDRESS` joins an existing cluster (`ray start --head` on one machine, `ray start
--address HEAD:PORT` on the others; a cluster with Ray's token authentication needs
RAY_AUTH_MODE=token and the token, as every Ray driver does); `--ray local` starts a private Ray
instance on this machine with `workers x threads` CPUs, on the loopback address only, and stops
it afterwards. A loopback ADDRESS keeps the driver on the loopback interface too.
Every node needs colibri-moe installed (`pip install 'colibri-moe[cluster]'`, the same Ray and
Python versions as this driver) and the model file at the same absolute path (a shared file
system, or the same file copied to each node); a node whose file differs is refused by the
worker (`shard.model_identity`).

Each task is `shard.run_shard` itself: Ray reuses worker processes, so each maps the model once.
Shards go out at most twice the parallelism at a time (their tokens travel with them); results
come back to this process, which writes each shard file, so the nodes need no shared output
directory. The merge is the local run's, in shard order, so the statistics are the same bits.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from typing import Any

import numpy as np

from colibri.profile.shard import ProfileError, ShardJob, run_shard

WriteFn = Callable[[ShardJob, dict[str, np.ndarray]], None]


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return address == "local" or host in ("localhost", "::1") or host.startswith("127.")


def _import_ray(address: str) -> Any:
    if _is_loopback(address):
        # Ray would replace a loopback address by the machine's network address; an instance
        # that lives on this machine only keeps to the loopback interface (read at import).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError:
        raise ProfileError("--ray needs Ray, which is not installed: pip install "
                           "'colibri-moe[cluster]'") from None
    return ray


def _error_text(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # RayTaskError wraps the worker's exception
    return str(cause if isinstance(cause, BaseException) else exc).strip().splitlines()[-1]


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A clear error at once when nothing listens at host:port (Ray itself retries for
    minutes); other address forms go to Ray as they are."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ProfileError(f"cannot start or join the Ray cluster {address!r}: nothing answers "
                           f"there ({exc.strerror or exc}); start it with `ray start --head` "
                           "or use --ray local") from None


def run_ray(jobs: list[ShardJob], address: str, workers: int | None, threads: int, write: WriteFn,
            advance: Callable[[int], None], cancelled: Callable[[], bool]) -> None:
    """Run `jobs` as Ray tasks (see the module docstring); raises KeyboardInterrupt when
    `cancelled()` turns true, after cancelling the tasks still out."""
    ray = _import_ray(address)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves this network
    options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False,
                               "configure_logging": True}
    try:
        if address == "local":
            parallel = workers or os.cpu_count() or 1
            ray.init(address="local", num_cpus=parallel * threads, include_dashboard=False,
                     _node_ip_address="127.0.0.1", **options)
        else:
            _check_reachable(address)
            ray.init(address=address, **options)
            cpus = int(ray.cluster_resources().get("CPU", 1))
            parallel = workers or max(1, cpus // threads)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ProfileError(f"cannot start or join the Ray cluster {address!r}: {exc} (a cluster "
                           "with token authentication also needs RAY_AUTH_MODE=token and its "
                           "token in RAY_AUTH_TOKEN or ~/.ray/auth_token)") from None
    task = ray.remote(num_cpus=threads, max_retries=0)(run_shard)
    todo = list(jobs)
    out: dict[Any, ShardJob] = {}
    try:
        while todo or out:
            while todo and len(out) < 2 * parallel:
                job = todo.pop(0)
                out[task.remote(job)] = job
            ready, _ = ray.wait(list(out), num_returns=1, timeout=0.2)
            for ref in ready:
                job = out.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:  # a worker's error, re-raised by Ray
                    raise ProfileError(f"shard {job.index}: {_error_text(exc)}") from None
                write(job, result)
                advance(job.n_tokens)
            if cancelled():
                raise KeyboardInterrupt
    finally:
        for ref in out:
            ray.cancel(ref, force=True)
        ray.shutdown()
