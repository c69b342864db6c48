"""The ``iteration-time`` objective: the shortest cycle for the given jobs on the topology's GPUs.

All jobs form one group. Every combination of each phase's GPU count and type (its options) is
tried; a phase of a type takes GPUs from the start of that type's pool, so a rollout and a training
phase of the same type overlap on the first GPUs: the training GPUs are lent to rollout and taken
back each cycle, paying the warm-switch time both ways (the seed article's 32-GPU example). The exact
timetable (planner/timetable.py) gives each combination's cycle; the shortest one wins.
"""

from __future__ import annotations

import itertools
import math
import time

from weave_rl.planner.model import PlanningModel
from weave_rl.planner.optimal import NoPlanInTime, _admissible, group_plan, phase_options
from weave_rl.planner.plan import DEFAULT_ELASTIC, Plan, SolverInfo
from weave_rl.planner.timetable import Member, solve_timetable
from weave_rl.topology.topology import node_of

MAX_COMBINATIONS = 4096


def plan_min_iteration(model: PlanningModel, *, time_limit_s: float = 60.0, threads: int = 2,
                       progress=None) -> Plan:
    started = time.perf_counter()
    say = progress or (lambda _msg: None)
    topo = model.topology
    rejected, job_ids = _admissible(model)
    jobs = [model.jobs.jobs[j] for j in job_ids]
    pools = {t: topo.gpus_in(gpu_type=t) for t in {c.gpu_type for c in topo.clusters.values()}}
    per_job = []
    for job in jobs:
        pairs = [(r, t) for r in phase_options(model, job, "rollout") for t in phase_options(model, job, "train")
                 if r.gpus <= len(pools[r.gpu_type]) and t.gpus <= len(pools[t.gpu_type])]
        # Try the fastest-looking pairs first so the cycle cap tightens early.
        pairs.sort(key=lambda p: p[0].duration_s + p[1].duration_s)
        per_job.append(pairs)
    combos = itertools.islice(itertools.product(*per_job), MAX_COMBINATIONS)
    best = None
    tried = 0
    complete = True
    lower = max((min(r.duration_s + t.duration_s for r, t in pairs) for pairs in per_job), default=0.0)
    for combo in combos:
        if time.perf_counter() - started > time_limit_s:
            complete = False
            break
        tried += 1
        members = [Member(job, tuple(pools[r.gpu_type][:r.gpus]), tuple(pools[t.gpu_type][:t.gpus]))
                   for job, (r, t) in zip(jobs, combo)]
        cap = best[0].cycle_s if best else None
        left = time_limit_s - (time.perf_counter() - started)
        tt = solve_timetable(model, members, cycle_cap_s=cap, time_limit_s=max(0.2, min(10.0, left)), threads=threads)
        if tt.ok and (best is None or tt.cycle_s < best[0].cycle_s):
            best = (tt, members)
            say(f"cycle {tt.cycle_s:.2f} s with " + ", ".join(f"{r.gpus}+{t.gpus}" for r, t in combo))
    if best is None:
        raise NoPlanInTime(f"no feasible timetable found within {time_limit_s:g} s")
    tt, members = best
    nodes = sorted({node_of(g) for m in members for g in (*m.rollout_gpus, *m.train_gpus)})
    group = group_plan(model, "g0", members, nodes, tt)
    wall = time.perf_counter() - started
    exhausted = complete and tried == min(math.prod(len(pairs) for pairs in per_job), MAX_COMBINATIONS)
    solver = SolverInfo(name="cpsat", status="OPTIMAL" if exhausted and tt.status == "OPTIMAL" else "FEASIBLE",
                        wall_s=round(wall, 3), objective=tt.cycle_s, bound=round(lower, 3),
                        gap=round((tt.cycle_s - lower) / tt.cycle_s, 6),
                        note=f"objective iteration-time: cycle {tt.cycle_s:.3f} s; bound = fastest phases back to "
                             f"back without sync or switches; {tried} GPU-count combinations tried")
    return Plan(policy="optimal", objective="iteration-time", quantile=model.quantile, topology=topo.name,
                cost_usd_per_hour=round(topo.cost_usd_per_hour(nodes), 6), solver=solver, groups=[group],
                rejected=rejected, elastic=DEFAULT_ELASTIC)
