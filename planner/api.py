"""One public entry point for planning, used by the CLI, the benches and (later) the executor."""

from __future__ import annotations

import time
from typing import Callable

from weave_rl.planner.model import PlanningModel
from weave_rl.planner.plan import POLICIES, Plan, SolverInfo
from weave_rl.profiles.jobs import JobSet
from weave_rl.topology.topology import Topology

OBJECTIVES = ("cost", "iteration-time", "throughput")


def make_plan(topology: Topology, jobs: JobSet, *, policy: str = "optimal", objective: str = "cost",
              quantile: float | str = 0.95, time_limit_s: float = 60.0, threads: int = 2,
              max_group_size: int = 5, progress: Callable[[str], None] | None = None,
              solver: str = "auto", start: Plan | None = None) -> Plan:
    """Plan ``jobs`` on ``topology``. The ``optimal`` policy solves its master with ``solver`` (auto | cpsat | pulp),
    starts from ``start`` when given, and falls back to ``weave`` (status FALLBACK, the reason in
    ``solver.note``) when it verifies no plan within the time limit."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (policies: {', '.join(POLICIES)})")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r} (objectives: {', '.join(OBJECTIVES)})")
    if objective == "throughput" and policy != "optimal":
        raise ValueError(f"the throughput objective is the optimal policy's (got policy {policy!r})")
    started = time.perf_counter()
    model = PlanningModel(topology, jobs, quantile)
    if policy == "optimal":
        from weave_rl.planner.optimal import NoPlanInTime
        from weave_rl.planner.optimize import plan_optimal
        from weave_rl.planner.reasons import with_placement_note

        try:
            if objective == "iteration-time":
                from weave_rl.planner.iteration import plan_min_iteration

                return plan_min_iteration(model, time_limit_s=time_limit_s, threads=threads, progress=progress)
            if objective == "throughput":
                from weave_rl.planner.throughput import plan_max_throughput

                return plan_max_throughput(model, max_group_size=max_group_size, time_limit_s=time_limit_s,
                                           threads=threads, progress=progress)
            return plan_optimal(model, max_group_size=max_group_size, time_limit_s=time_limit_s, threads=threads,
                                progress=progress, solver=solver, start=start).plan
        except NoPlanInTime as exc:
            from weave_rl.planner.baselines import plan_weave

            fallback = exc.fallback or plan_weave(model, max_group_size=max_group_size)
            placed = sum(len(g.jobs) for g in fallback.groups)
            note = with_placement_note(f"fallback to the weave policy: {exc}", placed, placed + len(fallback.rejected))
            cost = fallback.cost_usd_per_hour
            bound = min(exc.bound, cost) if exc.bound is not None else None
            gap = round((cost - bound) / cost, 6) if bound is not None and cost > 0 else None
            return fallback.model_copy(update={
                "lower_bound_usd_per_hour": round(bound, 6) if bound is not None else fallback.lower_bound_usd_per_hour,
                "solver": SolverInfo(name="weave", status="FALLBACK", wall_s=round(time.perf_counter() - started, 3),
                                     gap=gap, bound=None if bound is None else round(bound, 6), note=note)})
    from weave_rl.planner import baselines

    if policy == "weave":
        return baselines.plan_weave(model, max_group_size=max_group_size)
    if policy == "solo":
        return baselines.plan_solo(model)
    return baselines.plan_colocate(model)
