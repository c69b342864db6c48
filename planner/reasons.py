"""Why a job is not in a plan: the one rule every optimal planner path uses to word a rejection.

The reason is built from what is true of the lost job against the plan's groups, in this order:
1. the topology cannot host it even empty (every way to run it alone is too wide for its clusters,
   misses its SLO alone, or does not fit a node's host memory);
2. else whether it fits alone on the nodes the plan leaves free (how many nodes of which type it
   needs, how many are free), for its rollout and train on GPUs of their own or colocated on the
   same GPUs;
3. and whether it could join a placed group: every group's cycle is at least each member's own
   loop (rollout + train + sync), so a member whose loop exceeds the job's cap, or the job's loop
   another member's cap, rules the group out for sure; for the others the round-robin timetable
   with the job on the group's GPUs gives the cycle it would get, against every member's cap
   ``slo x solo``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from weave_rl.planner.colocated import colocated_layouts
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.live import HostMemory
from weave_rl.planner.rules import SLO_TOL as TOL, meets_slo, member_cap
from weave_rl.planner.optimal import own_loop_s, phase_options
from weave_rl.planner.plan import GroupPlan
from weave_rl.planner.roundrobin import Member, round_robin_timetable
from weave_rl.profiles.jobs import JobSpec

ROUND_ROBIN_GROUPS = 5  # the closest groups (by their members' loops) tried with the round robin


@dataclass(frozen=True)
class _Alone:
    """One way to run the job alone: GPUs per cluster, its cycle, and what rules it out on an empty topology."""

    label: str
    gpus: tuple[tuple[str, int], ...]
    problem: str | None  # None when the empty topology hosts it


def not_placed_reason(model: PlanningModel, job: JobSpec, groups: Sequence[GroupPlan], max_group_size: int) -> str:
    """The reason ``job`` is not in a plan made of ``groups`` (see the module docstring)."""
    layouts = _alone_layouts(model, job)
    hosted = [a for a in layouts if a.problem is None]
    if not hosted:
        problems = list(dict.fromkeys(f"{a.label}: {a.problem}" for a in layouts))
        return "the topology cannot host it even empty (" + "; ".join(problems[:3]) + ")"
    free = _free_nodes(model, groups)
    fits = [a for a in hosted if _shortfall(model, a, free) == 0]
    if fits:
        return (f"it fits alone on the nodes the plan leaves free ({fits[0].label}: needs "
                f"{_needs(model, fits[0], free)}), but the planner verified no plan placing it")
    closest = min(hosted, key=lambda a: _shortfall(model, a, free))
    text = f"does not fit alone on the nodes the plan leaves free ({closest.label}: needs {_needs(model, closest, free)})"
    share = _sharing(model, job, groups, max_group_size)
    return text + ("; " + share if share else "")


# ----- alone ------------------------------------------------------------------------------------
def _alone_layouts(model: PlanningModel, job: JobSpec) -> list[_Alone]:
    cap = member_cap(model, job)
    topo = model.topology
    out = []
    for o in phase_options(model, job, "rollout"):
        for t in phase_options(model, job, "train"):
            gpus = {o.cluster: o.gpus}  # GPUs per cluster: both phases' where they share one
            gpus[t.cluster] = gpus.get(t.cluster, 0) + t.gpus
            loop = own_loop_s(model, job, t, o)
            problem = _width(model, gpus)
            if problem is None and not meets_slo(loop, cap):
                problem = f"alone its loop takes {loop:.1f} s, above its cap {_cap_text(model, job)}"
            out.append(_Alone(f"rollout on {o.gpus} {o.gpu_type} and train on {t.gpus} {t.gpu_type} GPUs",
                              tuple(sorted(gpus.items())), problem))
    for c in colocated_layouts(model, job):
        problem = None
        if c.mem_gb > topo.clusters[c.cluster].host_mem_gb:
            problem = (f"both roles' state needs {c.mem_gb:g} GB of host memory per node, more than "
                       f"its {topo.clusters[c.cluster].host_mem_gb:g} GB")
        elif not c.meets_slo(model, job):
            problem = f"its cycle is {c.cycle_s:.1f} s, above its cap {_cap_text(model, job)}"
        out.append(_Alone(f"colocated on the same {c.gpus} {c.gpu_type} GPUs", ((c.cluster, c.gpus),), problem))
    if not any(a.label.startswith("colocated") for a in out):
        out.append(_Alone("colocated", (), "no cluster of its training types is as wide as one of its training "
                                           "GPU counts"))
    return out


def _width(model: PlanningModel, gpus: dict[str, int]) -> str | None:
    for cluster, n in gpus.items():
        spec = model.topology.clusters[cluster]
        if n > spec.nodes * spec.gpus_per_node:
            return f"needs {n} {spec.gpu_type} GPUs in cluster {cluster}, which has {spec.nodes * spec.gpus_per_node}"
    return None


def _free_nodes(model: PlanningModel, groups: Sequence[GroupPlan]) -> dict[str, int]:
    free = {c: spec.nodes for c, spec in model.topology.clusters.items()}
    for g in groups:
        for n in g.nodes:
            free[model.topology.node(n).cluster] -= 1
    return free


def _node_count(model: PlanningModel, cluster: str, gpus: int) -> int:
    return math.ceil(gpus / model.topology.clusters[cluster].gpus_per_node)


def _shortfall(model: PlanningModel, alone: _Alone, free: dict[str, int]) -> int:
    return sum(max(0, _node_count(model, c, n) - free[c]) for c, n in alone.gpus)


def _needs(model: PlanningModel, alone: _Alone, free: dict[str, int]) -> str:
    parts = []
    for c, n in alone.gpus:
        count = _node_count(model, c, n)
        parts.append(f"{count} x {model.topology.clusters[c].gpu_type} node{'s' if count != 1 else ''} "
                     f"in cluster {c}, {free[c]} free")
    return "; ".join(parts)


def _cap_text(model: PlanningModel, job: JobSpec) -> str:
    solo = model.solo_of(job)
    return f"{job.slo:g} x solo {solo:.1f} s = {job.slo * solo:.1f} s"


# ----- sharing ----------------------------------------------------------------------------------
def _sharing(model: PlanningModel, job: JobSpec, groups: Sequence[GroupPlan], max_group_size: int) -> str:
    """What joining a placed group would do ('' when no group is placed)."""
    if not groups:
        return ""
    usable = {o.cluster for kind in ("rollout", "train") for o in phase_options(model, job, kind)}
    near = [g for g in groups if usable & {model.topology.node(n).cluster for n in g.nodes}]
    if not near:
        return "no placed group holds nodes of its GPU types"
    open_ = [g for g in near if len(g.jobs) < max_group_size]
    if not open_:
        return f"every placed group of its GPU types is full ({max_group_size} jobs)"
    own = min(own_loop_s(model, job, t, o) for o in phase_options(model, job, "rollout")
              for t in phase_options(model, job, "train"))
    # A group's cycle is at least every member's own loop: a sure SLO break when that exceeds a cap.
    sure, maybe = [], []
    for g in open_:
        worst = _worst_member(model, job, own, g)
        (sure if worst[0] > 1 + TOL else maybe).append((worst, g))
    if not maybe:
        (ratio, text), g = min(sure, key=lambda x: x[0][0])
        return f"any group with the placed jobs breaks an SLO (closest: {_group_text(g)}: {text})"
    tried = []
    for _, g in sorted(maybe, key=lambda x: x[0][0])[:ROUND_ROBIN_GROUPS]:
        result = _round_robin_join(model, job, g)
        if result is not None:
            tried.append((result, g))
    if not tried:
        return "no placed group of its GPU types has GPUs its options fit, or host memory to spare"
    (ratio, text), g = min(tried, key=lambda x: x[0][0])
    if ratio <= 1 + TOL:
        return (f"it could share {_group_text(g)} ({text}), a group the planner did not verify in its time")
    return f"sharing a placed group breaks an SLO (closest: {_group_text(g)}: the round robin gives {text})"


def _member_loop(jp) -> float:
    return sum(jp.phase(k).duration_s for k in ("rollout", "train", "sync"))


def _worst_member(model: PlanningModel, job: JobSpec, own: float, group: GroupPlan) -> tuple[float, str]:
    """The largest ratio of the group's least cycle (every member's loop, the job's too) to a cap."""
    specs = [model.jobs[j.name] for j in group.jobs]
    loops = {j.name: _member_loop(j) / (1 + model.jobs[j.name].max_staleness) for j in group.jobs}
    loops[job.name] = own
    least = max(loops.values())
    longest = max(loops, key=loops.get)
    worst = max(specs + [job], key=lambda s: least / member_cap(model, s))
    ratio = least / member_cap(model, worst)
    return ratio, (f"a cycle of at least {least:.1f} s ({longest}'s own loop), above {worst.name}'s cap "
                   f"{_cap_text(model, worst)} by {100 * (ratio - 1):.1f} %" if ratio > 1 + TOL else
                   f"a cycle of at least {least:.1f} s")


def _group_text(group: GroupPlan) -> str:
    return f"{group.name} with {', '.join(j.name for j in group.jobs)}"


def _round_robin_join(model: PlanningModel, job: JobSpec, group: GroupPlan) -> tuple[float, str] | None:
    """The job on the group's GPUs (its first GPUs of each phase's cluster, or colocated on its
    training ones), best of its options by the round-robin cycle: (ratio to the tightest cap, text)."""
    topo = model.topology
    members = [Member(model.jobs[j.name], tuple(j.phase("rollout").gpus), tuple(j.phase("train").gpus))
               for j in group.jobs]
    by_cluster: dict[str, list[str]] = {}
    for n in group.nodes:
        by_cluster.setdefault(topo.node(n).cluster, []).extend(topo.node(n).gpu_ids)
    layouts = []
    for t in phase_options(model, job, "train"):
        train = by_cluster.get(t.cluster, [])[:t.gpus]
        if len(train) < t.gpus:
            continue
        for o in phase_options(model, job, "rollout"):
            rollout = by_cluster.get(o.cluster, [])[:o.gpus]
            if len(rollout) == o.gpus:
                layouts.append(Member(job, tuple(rollout), tuple(train)))
        if t.gpu_type == job.train.gpu_type or t.gpu_type in job.rollout.gpu_types:
            layouts.append(Member(job, tuple(train), tuple(train)))
    memory = HostMemory(topo)
    for m in members:
        memory.add(m)
    best = None
    for new in layouts:
        if memory.overflow(new) is not None:
            continue
        cycle = round_robin_timetable(model, members + [new]).cycle_s
        specs = [m.job for m in members] + [job]
        worst = min(specs, key=lambda s: member_cap(model, s))
        ratio = cycle / member_cap(model, worst)
        text = (f"a cycle of {cycle:.1f} s, above {worst.name}'s cap {_cap_text(model, worst)} by "
                f"{100 * (ratio - 1):.1f} %" if ratio > 1 + TOL else f"a cycle of {cycle:.1f} s within every SLO")
        if best is None or ratio < best[0]:
            best = (ratio, text)
    return best


def with_placement_note(note: str | None, placed: int, total: int) -> str | None:
    """``note`` with what a plan that rejects jobs must say: how many it placed, and that its
    status and bound are about plans placing as many (a plan placing none is $0 and 'optimal')."""
    if placed >= total:
        return note
    head = "no job placed" if placed == 0 else f"{placed} of {total} jobs placed"
    text = (f"{head}: {total - placed} rejected (reasons under rejected); the status and the bound are for "
            f"plans that place as many")
    return f"{note}; {text}" if note else text
