"""``RayBackend``: the Backend protocol over Ray actors (DESIGN 5), one actor per logical GPU.

It is the worker backend (``weave_rl.executor.local.backend.WorkerBackend``: phase and sync
executions, attempts, results, elastic prompt groups, measured times, job rows, permit latency, and
the fault handling that restarts a worker and re-runs a rollout shard alone, a train gang or a
weight sync on all members, no sample lost or trained twice) with a ``RayTransport``
(``transport.py``: placement groups, actor calls, ``ray.wait``, clock pings and offsets, ``ray.kill``)
in place of worker processes. Its ``name`` is ``ray`` (metrics.json's backend).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from weave_rl.executor.local.backend import WorkerBackend
from weave_rl.executor.ray_backend.transport import ActorWorker, RayTransport
from weave_rl.profiles.jobs import JobSet
from weave_rl.topology.topology import Topology

__all__ = ["ActorWorker", "RayBackend", "RayTransport"]


def RayBackend(topology: Topology, jobs: JobSet, gpus: Sequence[str], root: Path, *,  # noqa: N802  a backend's name
               devices: dict[str, str] | None = None, **kwargs) -> WorkerBackend:
    """The worker backend on Ray actors for ``gpus``; ``devices`` forces the device of some of them
    (the others get one per Ray node at start); ``kwargs`` are ``WorkerBackend``'s."""
    forced = dict(devices or {})
    return WorkerBackend(topology, jobs, {g: forced.get(g, "") for g in gpus}, root,
                         transport=RayTransport(Path(root), forced), **kwargs)
