"""Columns of the set-partitioning master: one possible co-execution group each.

A column covers a set of jobs and holds whole nodes per cluster at a $/h cost. Three kinds:
- a ``Candidate`` (planner/optimal.py): a group structure (shared train pool, rollout classes) that
  is laid out on any free nodes when it is chosen;
- a *template*: an existing group of some plan (the weave heuristic's, or the plan given with
  ``--from``) moved as a block onto free nodes of the same clusters; nodes of one cluster are
  identical, so the layout stays valid and only its timetable is recomputed for the current profiles;
- a *pinned* group: an existing group kept on its own nodes (``replan`` keeps unmoved jobs where
  they are).

``extra`` is cost that is not $/h of nodes, e.g. the migration charge of jobs a column would move;
the master minimises ``cost + extra`` and plans report ``cost``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from weave_rl.planner.drawn import meets_slos_as_drawn
from weave_rl.planner.live import NodeAllocator
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.rules import group_cap, meets_slo, member_cap
from weave_rl.planner.plan import GroupPlan
from weave_rl.planner.roundrobin import round_robin_timetable
from weave_rl.planner.timetable import Member, Timetable, phase_durations_ms, solve_timetable

# The integer masters' objective unit, 1e-4 $/h: fine enough for a migration charge (a GPU's price
# for a minute, spread over an hour) to break a tie between keeping a job and moving it.
OBJECTIVE_SCALE = 10_000


def objective_units(usd_per_hour: float) -> int:
    return int(round(usd_per_hour * OBJECTIVE_SCALE))


@dataclass(frozen=True)
class Column:
    jobs: tuple[int, ...]  # job indices (positions in the model's JobSet), sorted
    nodes: tuple[tuple[str, int], ...]  # (cluster, node count)
    cost: float  # $/h of the nodes
    candidate: object | None = None  # planner.optimal.Candidate
    template: GroupPlan | None = None
    pinned: bool = False
    extra: float = 0.0

    @property
    def objective(self) -> float:
        return self.cost + self.extra

    @property
    def key(self) -> tuple:
        """Identity for de-duplication: same jobs, same structure."""
        if self.template is not None:
            return ("pinned" if self.pinned else "template", self.jobs, tuple(self.template.nodes) if self.pinned
                    else self.nodes, tuple((j.name, tuple(tuple(s.gpus) for s in j.phases)) for j in self.template.jobs))
        return ("candidate", self.candidate)


def template_column(model: PlanningModel, group: GroupPlan, *, pinned: bool = False, extra: float = 0.0) -> Column:
    index = {name: i for i, name in enumerate(model.jobs.names)}
    topo = model.topology
    counts = Counter(topo.node(n).cluster for n in group.nodes)
    return Column(tuple(sorted(index[j.name] for j in group.jobs)), tuple(sorted(counts.items())),
                  round(topo.cost_usd_per_hour(group.nodes), 6), template=group, pinned=pinned, extra=extra)


def materialize(model: PlanningModel, column: Column, free: NodeAllocator) -> tuple[list[Member], list[str]]:
    """The column's members with concrete GPUs, and its nodes."""
    if column.candidate is not None:
        from weave_rl.planner.optimal import candidate_members

        return candidate_members(model, column.candidate, free)  # type: ignore[arg-type]
    group = column.template
    assert group is not None
    if column.pinned:
        mapping = {n: n for n in group.nodes}
    else:
        mapping = {n: free.claim(model.topology.node(n).cluster, 1)[0] for n in group.nodes}
    members = []
    for job in group.jobs:
        spec = model.jobs[job.name]
        gpus = {s.phase: tuple(_move(g, mapping) for g in s.gpus) for s in job.phases if s.phase != "sync"}
        members.append(Member(spec, gpus["rollout"], gpus["train"]))
    return members, [mapping[n] for n in group.nodes]


def _move(gpu: str, mapping: dict[str, str]) -> str:
    node, _, index = gpu.rpartition(":")
    return f"{mapping[node]}:{index}"


def group_timetable(model: PlanningModel, members: list[Member], *, time_limit_s: float, threads: int) -> Timetable:
    """Round robin first (constant time, Weave's meta-iteration), in the members' order, then in a
    few others (``member_orders``); the exact CP-SAT timetable when every one misses an SLO. Either
    way every member's cycle cap is met, and its SLO as drawn (planner/drawn.py), or the result is
    not ok."""
    cap = group_cap(member_cap(model, m.job) for m in members)
    for order in member_orders(model, members):
        rr = round_robin_timetable(model, order)
        if meets_slo(rr.cycle_s, cap) and meets_slos_as_drawn(model, members, rr.phases, rr.cycle_s):
            return Timetable("FEASIBLE", rr.cycle_s, rr.phases)
    if time_limit_s <= 0:
        return Timetable("UNKNOWN")
    return exact_timetable(model, members, time_limit_s=time_limit_s, threads=threads)


def column_timetable(model: PlanningModel, column: Column, *, time_limit_s: float, threads: int = 1) -> Timetable:
    """``group_timetable`` of the column's group laid out on free nodes (which nodes of its clusters
    it gets changes no timetable)."""
    members, _ = materialize(model, column, NodeAllocator(model.topology))
    return group_timetable(model, members, time_limit_s=time_limit_s, threads=threads)


def exact_timetable(model: PlanningModel, members: list[Member], *, time_limit_s: float, threads: int,
                    least: bool = True) -> Timetable:
    """The least-cycle timetable (planner/timetable.py; without ``least``, any), not ok when it misses
    an SLO as drawn."""
    exact = solve_timetable(model, members, time_limit_s=time_limit_s, threads=threads, least=least)
    if exact.ok and not meets_slos_as_drawn(model, members, exact.phases, exact.cycle_s):
        return Timetable("UNKNOWN", wall_s=exact.wall_s)  # the least cycle, yet some SLO is missed as drawn
    return exact


def member_orders(model: PlanningModel, members: list[Member]) -> list[list[Member]]:
    """The members' order; where they train on different GPU counts (parts of a pool), then widest
    training first, narrowest first, and by rollout, train and rollout-minus-train time each way:
    there the order the round robin starts them in decides whether it meets the caps (on 100 Hetero
    jobs these orders found a round robin within the caps for 11 of the 14 groups where some
    permutation had one). Elsewhere the members' order alone, as before."""
    if len({len(m.train_gpus) for m in members}) < 2:
        return [members]
    times = {m.job.name: phase_durations_ms(model, m) for m in members}
    keys = [lambda m: (-len(m.train_gpus), -times[m.job.name]["rollout"]),
            lambda m: (len(m.train_gpus), -times[m.job.name]["rollout"])]
    for measure in (lambda t: t["rollout"], lambda t: t["train"], lambda t: t["rollout"] - t["train"]):
        keys += [lambda m, f=measure: -f(times[m.job.name]), lambda m, f=measure: f(times[m.job.name])]
    orders = [list(members)]
    for key in keys:
        order = sorted(members, key=key)
        if order not in orders:
            orders.append(order)
    return orders


@dataclass
class Incumbent:
    """The best integer solution known so far: chosen columns and rejected job indices."""

    columns: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    objective: float = math.inf
