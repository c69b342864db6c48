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
   current plan, solve ``max sum_G (T_G - lam C_G) x_G`` (CP-SAT, every placeable job covered once,
   node counts within the topology); a positive optimum gives a plan of larger ratio, which becomes
   ``lam``; zero proves ``lam`` optimal. It ends in a few rounds (superlinear convergence).
"""

from __future__ import annotations

import math
import time

from ortools.sat.python import cp_model

from weave_rl.core.errors import InputError
from weave_rl.planner.columns import Column, FreeNodes, materialize, template_column
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.optimal import (CandidateBuilder, EnumerationBudget, _admissible, group_plan)
from weave_rl.planner.plan import DEFAULT_ELASTIC, Plan, SolverInfo
from weave_rl.planner.timetable import Member, Timetable, solve_timetable

ENUMERATION_BUDGET = 5_000  # candidate groups; past it the instance is refused (an InputError)
SCALE = 1_000_000  # CP-SAT objective unit: 1e-6 (iterations per hour, and lam * $/h)
MAX_ROUNDS = 50
TIMETABLE_S = 10.0  # most one column's minimum-cycle timetable may take


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
    from weave_rl.planner.baselines import plan_weave

    seen = {col.key for col in columns}
    for group in plan_weave(model, max_group_size=max_group_size).groups:
        col = template_column(model, group)
        if col.key not in seen:
            seen.add(col.key)
            columns.append(col)
    say(f"{len(columns)} columns")

    # Each column at its shortest cycle, on fresh nodes (nodes of a cluster are alike).
    valued: list[tuple[Column, list[Member], list[str], Timetable, float]] = []
    unproven = 0
    for col in columns:
        members, nodes = materialize(model, col, FreeNodes(topo))
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
        valued.append((col, members, nodes, tt, len(members) * 3600.0 / tt.cycle_s))
    say(f"{len(valued)} columns with a timetable")

    placeable = _most_placed(valued, job_ids, topo, threads)
    chosen = _dinkelbach(valued, job_ids, placeable, topo, threads, say)
    # Decode: lay the chosen columns out on distinct nodes, moving each timetable with its nodes.
    free = FreeNodes(topo)
    groups = []
    for n, i in enumerate(chosen):
        col, members, nodes, tt, _ = valued[i]
        _, placed_nodes = materialize(model, col, free)
        mapping = dict(zip(nodes, placed_nodes))
        moved = [Member(m.job, tuple(_move(g, mapping) for g in m.rollout_gpus),
                        tuple(_move(g, mapping) for g in m.train_gpus)) for m in members]
        groups.append(group_plan(model, f"g{n}", moved, placed_nodes, tt))
    index = set(job_ids)
    placed = {j for i in chosen for j in valued[i][0].jobs}
    from weave_rl.planner.plan import Rejection
    from weave_rl.planner.reasons import not_placed_reason, with_placement_note

    for j in sorted(index - placed):
        spec = model.jobs.jobs[j]
        rejected.append(Rejection(name=spec.name, reason=not_placed_reason(model, spec, groups, max_group_size)))
    cost = round(sum(valued[i][0].cost for i in chosen), 6)
    per_hour = sum(valued[i][4] for i in chosen)
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


def _move(gpu: str, mapping: dict[str, str]) -> str:
    node, _, index = gpu.rpartition(":")
    return f"{mapping[node]}:{index}"


def _master(valued, job_ids, topo):
    cp = cp_model.CpModel()
    x = [cp.new_bool_var(f"x{i}") for i in range(len(valued))]
    cover: dict[int, list] = {j: [] for j in job_ids}
    usage: dict[str, list] = {}
    for var, (col, *_rest) in zip(x, valued):
        for j in col.jobs:
            cover[j].append(var)
        for cluster, count in col.nodes:
            usage.setdefault(cluster, []).append(count * var)
    for vars_ in cover.values():
        if vars_:
            cp.add_at_most_one(vars_)
    for cluster, terms in usage.items():
        cp.add(sum(terms) <= topo.clusters[cluster].nodes)
    placed = sum(len(col.jobs) * var for var, (col, *_rest) in zip(x, valued))
    return cp, x, placed


def _solve(cp, threads) -> cp_model.CpSolver:
    sat = cp_model.CpSolver()
    sat.parameters.num_workers = max(1, threads)
    sat.parameters.max_time_in_seconds = 60.0
    status = sat.solve(cp)
    if status != cp_model.OPTIMAL:
        raise RuntimeError(f"throughput master not solved to optimality (CP-SAT {sat.status_name(status)})")
    return sat


def _most_placed(valued, job_ids, topo, threads) -> int:
    """The most jobs any plan over the columns places (the cost objective places as many)."""
    if not valued:
        return 0
    cp, _x, placed = _master(valued, job_ids, topo)
    cp.maximize(placed)
    return int(round(_solve(cp, threads).objective_value))


def _dinkelbach(valued, job_ids, placeable: int, topo, threads, say) -> list[int]:
    if placeable == 0:
        return []
    lam = 0.0
    best: list[int] = []
    for _round in range(MAX_ROUNDS):
        cp, x, placed = _master(valued, job_ids, topo)
        cp.add(placed == placeable)
        weight = [int(round((v[4] - lam * v[0].cost) * SCALE)) for v in valued]
        cp.maximize(sum(w * var for w, var in zip(weight, x)))
        sat = _solve(cp, threads)
        chosen = [i for i, var in enumerate(x) if sat.value(var)]
        value = sum(valued[i][4] for i in chosen)
        cost = sum(valued[i][0].cost for i in chosen)
        ratio = value / cost if cost > 0 else math.inf
        say(f"Dinkelbach: lam {lam:.6f} -> {ratio:.6f} iterations per $")
        if best and ratio <= lam * (1 + 1e-12):
            return best  # F(lam) = 0: no plan beats lam
        best, lam = chosen, ratio
    return best
