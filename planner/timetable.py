"""Exact cyclic timetable of one co-execution group: by enumeration where the group is small
(planner/cyclic.py, milliseconds), else with OR-Tools CP-SAT (the model below).

Given the group's members with fixed GPU sets, find phase offsets and the smallest cycle C such that
- each job runs rollout -> train -> sync once per cycle, and its next rollout starts no earlier than
  its sync ends (``max_staleness`` 1: one cycle later than that at most, see planner/plan.py);
- on every GPU the phases are disjoint modulo C, each preceded by its warm-switch time when the GPU
  hosts two or more distinct (job, role) phases;
- ``C <= slo * solo`` for every member (unless ``enforce_slo`` is off).

Times are integers in milliseconds (durations rounded up, so the plan never undercuts the profile).
Circular non-overlap is modelled exactly by giving each interval a copy shifted by C and putting
both copies in one NoOverlap: with interval starts in [0, C) and lengths <= C, two arcs of the circle
meet iff some pair of copies meets on the line.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from weave_rl.planner.cyclic import Cyclic, least_cycle
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.roundrobin import Member, PhaseTime, gpu_users

MS = 1000  # CP-SAT time unit: milliseconds


@dataclass
class Timetable:
    status: str  # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN
    cycle_s: float | None = None
    phases: dict[str, dict[str, PhaseTime]] = field(default_factory=dict)
    lower_bound_s: float | None = None
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("OPTIMAL", "FEASIBLE")


def _ms(seconds: float) -> int:
    return int(math.ceil(seconds * MS - 1e-6))


def phase_durations_ms(model: PlanningModel, member: Member) -> dict[str, int]:
    out = {kind: _ms(model.duration(member.job, kind, len(member.gpus(kind)),
                                    model.topology.gpu_type_of(member.gpus(kind)[0])))
           for kind in ("rollout", "train")}
    out["sync"] = _ms(model.sync_s(member.job, list(member.train_gpus), list(member.rollout_gpus)))
    return out


def shared_resources(members: list[Member]) -> dict[frozenset, list[tuple[str, str]]]:
    """GPUs grouped by the set of (job, role) phases that use them; only sets of two or more matter."""
    classes: dict[frozenset, list[tuple[str, str]]] = {}
    for phases in gpu_users(members).values():
        if len(phases) >= 2:
            classes.setdefault(frozenset(phases), sorted(phases))
    return classes


def switch_ms(model: PlanningModel, member: Member, kind: str) -> int:
    return _ms(model.max_switch_s(member.job, kind, list(member.gpus(kind))))


def solve_timetable(model: PlanningModel, members: list[Member], *, enforce_slo: bool = True,
                    cycle_cap_s: float | None = None, time_limit_s: float = 10.0, threads: int = 2,
                    try_lower_bound: bool = True, enumerate_orders: bool = True, least: bool = True) -> Timetable:
    """The least-cycle timetable: by enumeration (planner/cyclic.py) where its search is small
    (``enumerate_orders``), else with CP-SAT. Without ``least`` the enumeration stops at its first
    timetable (FEASIBLE: whether one exists is all that is asked)."""
    started = time.perf_counter()
    names = [m.job.name for m in members]
    dur = {m.job.name: phase_durations_ms(model, m) for m in members}
    resources = shared_resources(members)
    shared_phases = {p for phases in resources.values() for p in phases}
    sw = {(m.job.name, k): (switch_ms(model, m, k) if (m.job.name, k) in shared_phases else 0)
          for m in members for k in ("rollout", "train")}
    stale = {m.job.name: m.job.max_staleness for m in members}

    # Lower bound: each job's own loop, and the busy time of every shared GPU set.
    lb = max(math.ceil((dur[n]["rollout"] + dur[n]["train"] + dur[n]["sync"]) / (1 + stale[n])) for n in names)
    lb = max([lb] + [max(dur[n][k], sw[(n, k)] + dur[n][k]) for n in names for k in ("rollout", "train")])
    for phases in resources.values():
        lb = max(lb, sum(dur[n][k] + sw[(n, k)] for n, k in phases))
    ub = sum(d + sw.get((n, k), 0) for n in names for k, d in dur[n].items()) + 1
    if enforce_slo:
        ub = min(ub, min(int(math.floor(m.job.slo * model.solo_of(m.job) * MS + 1e-6)) for m in members))
    if cycle_cap_s is not None:
        ub = min(ub, int(math.floor(cycle_cap_s * MS)))
    if lb > ub:
        return Timetable("INFEASIBLE", lower_bound_s=lb / MS, wall_s=time.perf_counter() - started)

    # Small groups: every order enumerated (planner/cyclic.py), exact in milliseconds where CP-SAT
    # may take seconds; a search over its budget leaves the group to CP-SAT.
    enumerated = least_cycle(names, dur, sw, stale, list(resources.values()), lb, ub, least=least) \
        if enumerate_orders else None
    if enumerated is not None:
        return _enumerated(enumerated, names, dur, lb, time.perf_counter() - started, least)

    # The cycle is almost always its lower bound: try that first as a linear feasibility model
    # (a constant cycle makes the wrap-around shifts linear), which CP-SAT settles in milliseconds;
    # only when it fails, minimise the cycle with the full model.
    tries = ([(lb, min(0.25, time_limit_s / 4))] if try_lower_bound else []) + [(None, None)]
    for fixed, limit in tries:
        cp, cycle, start = _timetable_model(names, dur, sw, stale, resources, shared_phases, lb, ub, fixed)
        solver = cp_model.CpSolver()
        left = time_limit_s - (time.perf_counter() - started)
        solver.parameters.max_time_in_seconds = max(0.05, left if limit is None else min(limit, left))
        solver.parameters.num_workers = max(1, threads)
        status = solver.solve(cp)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
    wall = time.perf_counter() - started
    name = "OPTIMAL" if fixed is not None else solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Timetable("INFEASIBLE" if status == cp_model.INFEASIBLE else "UNKNOWN",
                         lower_bound_s=lb / MS, wall_s=wall)
    c = solver.value(cycle) if fixed is None else fixed
    phases = {n: {k: PhaseTime(solver.value(start[(n, k)]) % c / MS, dur[n][k] / MS)
                  for k in ("rollout", "train", "sync")} for n in names}
    assert all(0 <= p.start_s < c / MS for job in phases.values() for p in job.values())
    bound = lb if fixed is not None else max(lb, solver.best_objective_bound)
    return Timetable(name, c / MS, phases, lower_bound_s=bound / MS, wall_s=wall)


def _enumerated(found: Cyclic, names, dur, lb: int, wall: float, least: bool) -> Timetable:
    if found.cycle is None:
        return Timetable("INFEASIBLE", lower_bound_s=lb / MS, wall_s=wall)
    c = found.cycle
    phases = {n: {"rollout": PhaseTime(found.starts[(n, "rollout")] / MS, dur[n]["rollout"] / MS),
                  "train": PhaseTime(found.starts[(n, "train")] / MS, dur[n]["train"] / MS),
                  "sync": PhaseTime((found.starts[(n, "train")] + dur[n]["train"]) % c / MS, dur[n]["sync"] / MS)}
              for n in names}
    if not least:
        return Timetable("FEASIBLE", c / MS, phases, lower_bound_s=lb / MS, wall_s=wall)
    return Timetable("OPTIMAL", c / MS, phases, lower_bound_s=c / MS, wall_s=wall)


def _timetable_model(names, dur, sw, stale, resources, shared_phases, lb: int, ub: int, fixed: int | None):
    """The CP-SAT model: the cycle a variable in [lb, ub] to minimise, or the constant ``fixed``."""
    cp = cp_model.CpModel()
    cycle = cp.new_int_var(lb, ub, "cycle") if fixed is None else fixed
    top = ub if fixed is None else fixed
    horizon = 4 * top
    start: dict[tuple[str, str], cp_model.IntVar] = {}
    for n in names:
        k_max = 1 + stale[n]
        r = cp.new_int_var(0, top - 1, f"{n}.rollout")
        t = cp.new_int_var(0, horizon, f"{n}.train")
        s = cp.new_int_var(0, horizon, f"{n}.sync")
        cp.add(r < cycle)
        cp.add(t >= r + dur[n]["rollout"])
        cp.add(s >= t + dur[n]["train"])
        # Chain closes within (1 + staleness) cycles: next-next... rollout waits for this sync.
        if fixed is not None:
            loop_end = fixed * k_max
        else:
            loop_end = cp.new_int_var(0, horizon, f"{n}.loop")
            cp.add_multiplication_equality(loop_end, [cycle, k_max]) if k_max > 1 else cp.add(loop_end == cycle)
        cp.add(s + dur[n]["sync"] <= r + loop_end)
        start.update({(n, "rollout"): r, (n, "train"): t, (n, "sync"): s})

    # Circular non-overlap on every shared GPU set.
    wrapped: dict[tuple, object] = {}
    for (n, k) in sorted(shared_phases):
        x = cp.new_int_var(0, top - 1, f"{n}.{k}.x")  # switch-extended start, modulo the cycle
        wraps = cp.new_int_var(-1, 3, f"{n}.{k}.wraps")
        if fixed is not None:
            shift = wraps * fixed
        else:
            shift = cp.new_int_var(-top, 3 * top, f"{n}.{k}.shift")
            cp.add_multiplication_equality(shift, [wraps, cycle])
        cp.add(x == start[(n, k)] - sw[(n, k)] - shift)
        cp.add(x < cycle)
        x2 = cp.new_int_var(0, 2 * top, f"{n}.{k}.x2")
        cp.add(x2 == x + cycle)
        wrapped[(n, k)] = x
        wrapped[(n, k, "copy")] = x2
    for phases in resources.values():
        intervals = []
        for (n, k) in phases:
            length = dur[n][k] + sw[(n, k)]
            for key in ((n, k), (n, k, "copy")):
                intervals.append(cp.new_fixed_size_interval_var(wrapped[key], length, f"iv.{'.'.join(key)}"))
        cp.add_no_overlap(intervals)
    if fixed is None:
        cp.minimize(cycle)
    return cp, cycle, start
