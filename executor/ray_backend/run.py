"""``run_plan_ray``: run a plan on Ray actors (the library call behind ``weave run --backend ray``).

It is ``weave_rl.executor.local.run.run_plan_local`` (journal, ``--resume``, the shared controller with the
elastic rules off, drift detection and replanning, the same hooks and the same ``LocalResult``)
with a ``RayBackend`` in place of the ``LocalBackend`` (its ``backend_factory``). Choice: one run
loop for both backends, so whatever the local run learns (replanning, resume) the Ray run has too.

Ray is joined or started by ``cluster.connect`` before anything is written, unless this process is
already a Ray driver (then it is left as it is, e.g. a test's ``ray.init``); a Ray instance this call
started is shut down at the end.
"""

from __future__ import annotations

import os
from pathlib import Path

from weave_rl.executor.local.run import LocalResult
from weave_rl.planner.plan import Plan
from weave_rl.profiles.jobs import JobSet
from weave_rl.topology.topology import Topology


def run_plan_ray(plan: Plan, topology: Topology, jobs: JobSet, out: Path, *, iterations: int,
                 address: str | None = None, devices: dict[str, str] | None = None, num_cpus: int | None = None,
                 start_timeout_s: float = 180.0, connect_timeout_s: float = 30.0, **kwargs) -> LocalResult:
    """Every placed job runs ``iterations`` iterations on Ray actors; the other keyword arguments are
    ``run_plan_local``'s (``seed``, ``threads``, ``resume``, ``inputs``, ``progress``, ``setup``, ``drift``...).

    ``address``: None/``local`` (a private Ray instance with ``num_cpus`` CPUs, default
    max(cores, GPUs of the plan), stopped afterwards), ``auto`` or ``HOST:PORT``; ignored when this
    process already called ``ray.init``. ``devices`` overrides the per-node device assignment for
    some logical GPUs (``cpu:N`` / ``cuda:N`` on the GPU's Ray node).
    """
    from weave_rl.executor.local.run import run_plan_local
    from weave_rl.executor.ray_backend.backend import RayBackend
    from weave_rl.executor.ray_backend.cluster import connect

    gpus = sorted({g for grp in plan.groups for jp in grp.jobs for s in jp.phases for g in s.gpus})
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    owned = connect(address, num_cpus=num_cpus or max(cores, len(gpus)), connect_timeout_s=connect_timeout_s)

    def factory(topology_, jobs_, mapped, root, **kw):
        return RayBackend(topology_, jobs_, sorted(mapped), root, devices=devices,
                          start_timeout_s=start_timeout_s, **kw)

    try:
        # The local run reads devices only to size its map; the Ray backend assigns them per node.
        return run_plan_local(plan, topology, jobs, Path(out), iterations=iterations,
                              devices={g: "ray" for g in gpus}, backend_factory=factory, **kwargs)
    finally:
        if owned:
            import ray

            ray.shutdown()


def runner(address: str | None, connect_timeout_s: float = 30.0):
    """``run_plan_local``'s call signature on Ray actors (what ``weave run --backend ray`` calls):
    the local device map is not used, the Ray backend assigns devices per node."""

    def run(plan: Plan, topology: Topology, jobs: JobSet, out: Path, *, devices=None, **kwargs) -> LocalResult:
        return run_plan_ray(plan, topology, jobs, out, address=address, connect_timeout_s=connect_timeout_s, **kwargs)

    return run
