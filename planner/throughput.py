"""The ``throughput`` objective: the most SLO-meeting iterations per dollar, on the cost objective's
model and constraints.

A plan places every job it can (as the cost objective does: a job is rejected only when no plan
can hold it), so the set of placed jobs is fixed and the objective is the ratio

    iterations per $ = sum_j 3600 / iteration_j  /  cost_usd_per_hour

(each placed job meets its SLO by construction, so every iteration counts).

1. Columns: every candidate group of planner/optimal.py (all of its configurations: here a group
   with more rollout nodes than it needs may be worth its price, so none is held back), plus the
   weave heuristic's groups. The enumeration must be complete; past its budget this objective
   refuses the instance with a clear error rather than return an unproven plan.
2. Each column's best value: for a fixed group (its jobs, nodes and GPUs) the cost is fixed and the
   throughput is highest at the shortest cycle, so each column gets the exact minimum-cycle
   timetable (planner/timetable.py, SLOs enforced); ``T_G = sum_{j in G} 3600 / cycle_G``.
3. The ratio over a set partition is maximised by Dinkelbach's method: with ``lam`` the ratio of the
   current plan, solve ``max sum_G (T_G - lam C_G) x_G`` (the set-partitioning master, every
   placeable job covered once, node counts within the topology); a positive optimum gives a plan of larger ratio, which becomes
   ``lam``; zero proves ``lam`` optimal. It ends in a few rounds (superlinear convergence).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from weave_rl.core.errors import InputError
from weave_rl.planner.baselines import plan_weave
from weave_rl.planner.colgen import solve_integer
from weave_rl.planner.columns import Column, materialize, template_column
from weave_rl.planner.live import NodeAllocator
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.optimal import (CandidateBuilder, EnumerationBudget, _admissible, group_plan)
from weave_rl.planner.plan import DEFAULT_ELASTIC, Plan, Rejection, SolverInfo
from weave_rl.planner.reasons import not_placed_reason, with_placement_note
from weave_rl.planner.timetable import Timetable, solve_timetable

ENUMERATION_BUDGET = 5_000  # candidate groups; past it the instance is refused (an InputError)
MAX_ROUNDS = 50
TIMETABLE_S = 10.0  # most one column's minimum-cycle timetable may take
MASTER_S = 60.0  # most one Dinkelbach round's master may take


def iterations_per_usd(plan: Plan) -> float:
    """A plan's figure of merit: job-iterations per hour over its $/h (0 for an empty plan)."""
    per_hour = sum(3600.0 / j.iteration_s for g in plan.groups for j in g.jobs)
    return per_hour / plan.cost_usd_per_hour if plan.cost_usd_per_hour > 0 else 0.0


def plan_max_throughput(model: PlanningModel, *, max_group_size: int = 5, time_limit_s: float = 60.0,
                        threads: int = 2, progress=None, enumeration_budget: int = ENUMERATION_BUDGET) -> Plan:
    started = time.perf_counter()
    deadline = started + time_limit_s
    say = progress or (lambda _msg: None)
    topo = model.topology
    rejected, job_ids = _admissible(model)
    builder = CandidateBuilder(model, job_ids, max_group_size, max_configs_per_set=10**9,
                               max_rollout_combos=10**9, budget=enumeration_budget)
    try:
        candidates = builder.build()
    except EnumerationBudget as exc:
        raise InputError("<command line>", "--objective", f"the throughput objective enumerates every candidate group, and these {len(job_ids)} jobs "
                       f"have {exc} (budget {enumeration_budget}); use --objective cost, fewer jobs or a smaller "
                       f"--max-group-size") from None
    columns = [Column(c.jobs, c.nodes, c.cost, candidate=c) for c in candidates]
    seen = {col.key for col in columns}
    for group in plan_weave(model, max_group_size=max_group_size).groups:
        col = template_column(model, group)
        if col.key not in seen:
            seen.add(col.key)
            columns.append(col)
    say(f"{len(columns)} columns")

    # Each column at its shortest cycle, on fresh nodes (nodes of a cluster are alike).
    valued: list[tuple[Column, Timetable, float]] = []
    unproven = 0
    for col in columns:
        members, _ = materialize(model, col, NodeAllocator(topo))
        left = deadline - time.perf_counter()
        if left <= 0:
            raise InputError("<command line>", "--time-limit", f"the throughput objective ran out of its "
                             f"{time_limit_s:g} s while timetabling {len(columns)} candidate groups")
        tt = solve_timetable(model, members, enforce_slo=True, time_limit_s=min(TIMETABLE_S, left), threads=threads)
        if not tt.ok:
            unproven += tt.status == "UNKNOWN"
            continue
        if tt.status != "OPTIMAL":
            unproven += 1
        valued.append((col, tt, len(members) * 3600.0 / tt.cycle_s))
    say(f"{len(valued)} columns with a timetable")

    chosen = _dinkelbach(valued, job_ids, topo, threads, say)
    # Decode: the chosen columns on distinct nodes (a timetable holds on any nodes of its clusters).
    free = NodeAllocator(topo)
    groups = []
    for n, i in enumerate(chosen):
        col, tt, _ = valued[i]
        groups.append(group_plan(model, f"g{n}", *materialize(model, col, free), tt))
    placed = {j for i in chosen for j in valued[i][0].jobs}
    for j in sorted(set(job_ids) - placed):
        spec = model.jobs.jobs[j]
        rejected.append(Rejection(name=spec.name, reason=not_placed_reason(model, spec, groups, max_group_size)))
    cost = round(sum(valued[i][0].cost for i in chosen), 6)
    per_hour = sum(valued[i][2] for i in chosen)
    ratio = per_hour / cost if cost > 0 else 0.0
    status = "OPTIMAL" if builder.complete and not unproven else "FEASIBLE"
    note = (f"objective throughput: {ratio:.6f} job-iterations per $ ({per_hour:.3f} per hour at "
            f"${cost:.2f}/h), Dinkelbach over {len(valued)} groups at their shortest cycles")
    if unproven:
        note += f"; {unproven} timetables not proven shortest"
    note = with_placement_note(note, len(model.jobs.jobs) - len(rejected), len(model.jobs.jobs))
    return Plan(policy="optimal", objective="throughput", quantile=model.quantile, topology=topo.name,
                cost_usd_per_hour=cost, lower_bound_usd_per_hour=None,
                solver=SolverInfo(name="cpsat", status=status, wall_s=round(time.perf_counter() - started, 3),
                                  objective=round(ratio, 9), bound=round(ratio, 9) if status == "OPTIMAL" else None,
                                  gap=0.0 if status == "OPTIMAL" else None, note=note),
                groups=groups, rejected=rejected, elastic=DEFAULT_ELASTIC)


def _dinkelbach(valued, job_ids, topo, threads, say) -> list[int]:
    """Each round solves the set-partitioning master (planner/colgen.py) for ``min sum_G (lam C_G -
    T_G) x_G``; its rejection penalty exceeds any column's weight, so every placeable job is placed."""
    if not valued:
        return []
    lam = 0.0
    best: list[int] = []
    for _round in range(MAX_ROUNDS):
        weighted = [replace(col, cost=lam * col.cost - per_hour, extra=0.0) for col, _, per_hour in valued]
        penalty = 1.0 + sum(abs(col.cost) for col in weighted)
        master = solve_integer(weighted, job_ids, topo, allowed=range(len(weighted)), penalty=penalty,
                               time_limit_s=MASTER_S, threads=threads)
        if master.status != "OPTIMAL":
            raise RuntimeError(f"throughput master not solved to optimality (CP-SAT {master.status})")
        chosen = master.chosen
        value = sum(valued[i][2] for i in chosen)
        cost = sum(valued[i][0].cost for i in chosen)
        ratio = value / cost if cost > 0 else math.inf
        say(f"Dinkelbach: lam {lam:.6f} -> {ratio:.6f} iterations per $")
        if best and ratio <= lam * (1 + 1e-12):
            return best  # F(lam) = 0: no plan beats lam
        best, lam = chosen, ratio
    return best
