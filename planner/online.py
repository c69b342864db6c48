"""Online planning for the executor: admit an arriving job, release a finished one, re-optimize.

``OnlinePlanner`` is the admission state of ``planner/admission.py`` (``admit`` and ``release`` on a
live plan, no new solve) plus ``replan(jobs)``, which solves again with the ``optimal`` policy
(planner/optimize.py). Every current group, and every current group less one member, may stay
pinned on its nodes for free; a job placed anywhere else pays its migration: its GPUs' price for
``migration_cost_s``, spread over ``horizon_s`` (so the charge is in $/h, like the objective).

Imports run one way: this module -> planner.optimize -> planner.admission.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection

from weave_rl.planner.admission import Admission, AdmissionPlanner
from weave_rl.planner.check import check_plan
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.optimal import NoPlanInTime
from weave_rl.planner.optimize import plan_optimal
from weave_rl.planner.plan import GroupPlan, JobPlan, Plan
from weave_rl.profiles.jobs import JobSet
from weave_rl.topology.topology import Topology, node_of


@dataclass(frozen=True)
class Replan:
    plan: Plan
    moved: list[str]
    cost_before: float
    cost_after: float
    kept: str | None = None  # why the plan in force was kept instead of the new solve's


class OnlinePlanner(AdmissionPlanner):
    """Admission, release and re-optimization of a live plan."""

    def replan(self, jobs: JobSet, *, migration_cost_s: float = 60.0, horizon_s: float = 3600.0,
               time_limit_s: float = 10.0, threads: int = 2, solver: str = "auto",
               keep: Collection[str] = (), unstarted: Collection[str] = ()) -> Replan:
        """Re-optimize ``jobs`` (new profiles, arrivals and departures included), keeping a job where
        it is unless moving it saves more than its migration charge. A job in ``keep`` (one whose SLO
        cannot absorb a migration) moves only where no plan keeps it: its charge is the whole
        topology's $/h, more than any move saves. A job in ``unstarted`` (placed, not started yet)
        moves for free."""
        before = self.plan

        def unchanged(why: str | None = None) -> Replan:  # the plan in force stays
            return Replan(self.plan, [], before.cost_usd_per_hour, self.plan.cost_usd_per_hour, kept=why)
        names = set(jobs.names)
        for name in [m.job.name for g in list(self.groups.values()) for m in g.members]:
            if name not in names:
                self.release(name)
        current = self.plan
        model = PlanningModel(self.topology, jobs, self.quantile)
        pinned = _pinned_variants(current, self.topology)
        old = {jp.name: _gpus_of(jp) for g in current.groups for jp in g.jobs}
        charge = {}
        for g in current.groups:
            for jp in g.jobs:
                usd = sum(self.topology.node_usd_per_hour(node_of(x)) / self.topology.node(node_of(x)).gpus
                          for x in set(_gpus_of(jp)))
                charge[jp.name] = usd * migration_cost_s / horizon_s
        whole = self.topology.cost_usd_per_hour()
        charge.update({name: whole for name in keep if name in charge})
        charge.update({name: 0.0 for name in unstarted if name in charge})
        try:
            new_plan = plan_optimal(model, max_group_size=self.max_group_size, time_limit_s=time_limit_s,
                                    threads=threads, solver=solver, pinned=pinned, extra=charge).plan
        except NoPlanInTime:
            return unchanged()
        dropped = sorted(set(current.jobs) - set(new_plan.jobs))
        if dropped:
            # Switching would stop a running job for good (e.g. a refit tightened another job's SLO
            # on a topology with no room left, or the solve ran out of time): keep what runs.
            return unchanged(f"the new one leaves {', '.join(dropped)} unplaced")
        moved = sorted(jp.name for g in new_plan.groups for jp in g.jobs
                       if jp.name in old and _gpus_of(jp) != old[jp.name])
        if (new_plan.cost_usd_per_hour + sum(charge[name] for name in moved) >= current.cost_usd_per_hour - 1e-9
                and set(current.jobs) == names and not check_plan(current, self.topology, jobs)):
            # A solve cut short returns its fallback (the weave plan, every job moved) or a plan no
            # cheaper than what runs: moving jobs to it would pay migrations for nothing.
            return unchanged("the new one saves less than its moves cost")
        loaded = dict(self.link_load)
        self.reset(jobs, new_plan, "<replan>")
        over = [pair for pair, share in sorted(self.link_load.items()) if self.link_budget is not None
                and share > max(self.link_budget, loaded.get(pair, 0.0)) + 1e-9]
        if over:
            # The solve does not model the links; admission keeps their sync load within the
            # budget, and so does a replan: past it, syncs queue and stretch iterations past SLOs.
            self.reset(jobs, current, "<replan>")
            a, b = over[0]
            return unchanged(f"the new one loads the {a}-{b} link over {100 * self.link_budget:.0f}%")
        return Replan(new_plan, moved, before.cost_usd_per_hour, new_plan.cost_usd_per_hour)


def _gpus_of(jp: JobPlan) -> tuple[str, ...]:
    return tuple(g for s in jp.phases if s.phase != "sync" for g in s.gpus)


def _pinned_variants(plan: Plan, topology: Topology) -> list[GroupPlan]:
    """Every group as it is, and every group less one member (its nodes that only that member
    used dropped): the ways to keep jobs where they are."""
    out = []
    for g in plan.groups:
        out.append(g)
        if len(g.jobs) < 2:
            continue
        for leave in g.jobs:
            rest = [jp for jp in g.jobs if jp.name != leave.name]
            used = {node_of(x) for jp in rest for x in _gpus_of(jp)}
            nodes = [n for n in g.nodes if n in used]
            out.append(g.model_copy(update={"jobs": rest, "nodes": nodes, "name": f"{g.name}-{leave.name}",
                                            "usd_per_hour": topology.cost_usd_per_hour(nodes)}))
    return out


def replan(plan: Plan, jobs: JobSet, topology: Topology, *, migration_cost_s: float = 60.0, **options) -> Replan:
    return OnlinePlanner(topology, jobs, plan).replan(jobs, migration_cost_s=migration_cost_s, **options)


__all__ = ["Admission", "OnlinePlanner", "Replan", "replan"]
