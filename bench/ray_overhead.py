"""Ray backend overhead against the local backend, per phase, on the same plan.

Run from the repository root::

    .venv/bin/python -m bench.ray_overhead [--iterations 20] [--sizes tiny,small]

The plan is the 2-job round-robin plan of ``tests/test_local_run.py`` on the ``local`` topology
(both jobs roll out on ``local-000:0`` and train on ``local-000:1``), with the ``bandit`` workload at
two sizes: ``tiny`` (phases of about a millisecond: what is printed is almost all overhead) and
``small`` (rollouts of tens of milliseconds). Each size runs once on worker processes (``local``)
and once on Ray actors in one placement group (``ray``, a private 2-CPU Ray instance started once
and timed separately). Printed per backend:

- worker start: from the run call to every worker Ready (Ray: actors in their bundles, placement
  group included; the Ray instance itself is the ``ray.init`` line);
- permit latency, p50 / p99 per phase: permit sent by the controller -> compute starts on the worker
  (pipe message vs actor call);
- mean wall time per phase (``duration_s`` of the records: compute, plus the sync's transfer), mean
  warm switch (``switch_s``), and each job's mean iteration in the second half of the run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

SIZES = {"tiny": dict(steps=1, epochs=1, hidden=32), "small": dict(steps=300, epochs=4, hidden=256)}


def _inputs(folder: Path, size: str):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_local_run import write_inputs

    from weave_rl.executor.inputs import load_run_inputs

    plan, jobs = write_inputs(folder, **SIZES[size])
    return load_run_inputs(plan, jobs, None)


def _run(backend: str, plan, topo, jobs, out: Path, iterations: int) -> dict:
    started = time.perf_counter()
    ready: list[float] = []

    def setup(controller, b):
        ready.append(time.perf_counter() - started)

    if backend == "local":
        from weave_rl.executor.local.devices import map_devices
        from weave_rl.executor.local.run import run_plan_local

        gpus = sorted({g for grp in plan.groups for jp in grp.jobs for s in jp.phases for g in s.gpus})
        res = run_plan_local(plan, topo, jobs, out, iterations=iterations, devices=map_devices(gpus, None),
                             setup=setup)
    else:
        from weave_rl.executor.ray_backend.run import run_plan_ray

        res = run_plan_ray(plan, topo, jobs, out, iterations=iterations, setup=setup)
    recs = res.controller.records
    phases = {}
    for phase in ("rollout", "train", "sync"):
        rows = [r for r in recs if r["phase"] == phase]
        phases[phase] = {"wall_ms": 1e3 * statistics.mean(r["duration_s"] for r in rows),
                         "switch_ms": 1e3 * statistics.mean(r["switch_s"] for r in rows)}
    iters = []
    for job in sorted({r["job"] for r in recs}):
        syncs = sorted(r["end_s"] for r in recs if r["job"] == job and r["phase"] == "sync")
        half = syncs[len(syncs) // 2:]
        if len(half) >= 2:
            iters.append((half[-1] - half[0]) / (len(half) - 1))
    return {"start_s": ready[0] if ready else float("nan"), "latency": res.permit_latency, "phases": phases,
            "iteration_ms": 1e3 * statistics.mean(iters) if iters else float("nan"), "wall_s": res.wall_s}


def _row(name: str, local: float, ray: float, unit: str) -> str:
    return f"   {name:<28} {local:10.2f} {ray:10.2f} {ray - local:+10.2f} {unit}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ray_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--sizes", default="tiny,small")
    args = parser.parse_args(argv)
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, address="local", logging_level="WARNING")
    print(f"ray.init (private 2-CPU instance): {time.perf_counter() - t:.2f} s")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for size in args.sizes.split(","):
                plan, topo, jobs = _inputs(Path(tmp) / size / "in", size)
                out = {b: _run(b, plan, topo, jobs, Path(tmp) / size / b, args.iterations) for b in ("local", "ray")}
                lo, ra = out["local"], out["ray"]
                print(f"\n{size} phases ({SIZES[size]}), 2 jobs x {args.iterations} iterations"
                      f"{'':>4}{'local':>10} {'ray':>10} {'ray-local':>10}")
                print(_row("worker start", lo["start_s"], ra["start_s"], "s"))
                for phase in ("rollout", "train"):
                    a, b = lo["latency"]["by_phase"][phase], ra["latency"]["by_phase"][phase]
                    print(_row(f"permit latency {phase} p50", a["p50_ms"], b["p50_ms"], "ms"))
                    print(_row(f"permit latency {phase} p99", a["p99_ms"], b["p99_ms"], "ms"))
                for phase in ("rollout", "train", "sync"):
                    print(_row(f"mean {phase} wall", lo["phases"][phase]["wall_ms"], ra["phases"][phase]["wall_ms"],
                               "ms"))
                for phase in ("rollout", "train"):
                    print(_row(f"mean {phase} switch", lo["phases"][phase]["switch_ms"],
                               ra["phases"][phase]["switch_ms"], "ms"))
                print(_row("mean iteration (2nd half)", lo["iteration_ms"], ra["iteration_ms"], "ms"))
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
