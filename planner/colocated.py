"""A job alone with its rollout and train taking turns on the same GPUs (veRL's hybrid engine).

This is the ``colocate`` policy's group (planner/baselines.py): the rollout runs on the training
GPUs, on a type the training allows that is the training's reference type or one the rollout
allows too, at one of the training's GPU counts; both roles pay their warm switch every cycle
(planner/roundrobin.py). Here every such layout of a job on an empty topology is listed with its
cycle and cost, so that the optimal planner can hold them as columns (and its bounds cover them)
and a rejection can say whether the job would fit this way.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

from weave_rl.planner.model import PlanningModel
from weave_rl.planner.rules import fits_memory, meets_slo, member_cap
from weave_rl.planner.plan import GroupPlan
from weave_rl.planner.roundrobin import Member, group_plan, round_robin_timetable
from weave_rl.profiles.jobs import JobSpec


@dataclass(frozen=True)
class Colocated:
    """One colocated layout of a job on the first nodes of a cluster."""

    cluster: str
    gpu_type: str
    gpus: int
    nodes: int
    cycle_s: float  # its round-robin cycle (both warm switches included)
    cost: float  # $/h of its whole nodes
    mem_gb: float  # host memory pinned per node: both roles' state
    group: GroupPlan  # the group laid out on the cluster's first nodes

    def meets_slo(self, model: PlanningModel, job: JobSpec) -> bool:
        return meets_slo(self.cycle_s, member_cap(model, job))

    def fits_nodes(self, model: PlanningModel) -> bool:
        return fits_memory(self.mem_gb, model.topology.clusters[self.cluster].host_mem_gb)


def colocated_layouts(model: PlanningModel, job: JobSpec) -> list[Colocated]:
    """Every colocated layout the topology is wide enough for (SLO and host memory not checked)."""
    topo = model.topology
    types = [t for t in [job.train.gpu_type, *job.train.gpu_types]
             if t == job.train.gpu_type or t in job.rollout.gpu_types]
    out = []
    for gpu_type in dict.fromkeys(types):
        for cluster in topo.clusters.values():
            if cluster.gpu_type != gpu_type:
                continue
            gpu_ids = topo.gpus_in(cluster=cluster.name)
            for count in sorted(set(job.train.gpu_options)):
                if count > len(gpu_ids):
                    continue
                gpus = tuple(gpu_ids[:count])
                member = Member(job, gpus, gpus)
                rr = round_robin_timetable(model, [member])
                nodes = list(dict.fromkeys(g.rpartition(":")[0] for g in gpus))
                group = group_plan(topo, f"colocated-{job.name}", [member], rr.phases, rr.cycle_s, nodes,
                                   model.solo_of)
                out.append(Colocated(cluster.name, gpu_type, count, math.ceil(count / cluster.gpus_per_node),
                                     rr.cycle_s, round(topo.cost_usd_per_hour(nodes), 6),
                                     job.rollout.host_mem_gb + job.train.host_mem_gb, group))
    return out


_OPTIONS: "weakref.WeakKeyDictionary[PlanningModel, dict[str, list[Colocated]]]" = weakref.WeakKeyDictionary()


def colocated_options(model: PlanningModel, job: JobSpec) -> list[Colocated]:
    """The colocated layouts that meet the job's SLO and fit a node's host memory, cheapest first
    (per model and job once: the columns, the bounds and the reasons all ask)."""
    known = _OPTIONS.setdefault(model, {})
    if job.name not in known:
        known[job.name] = sorted((c for c in colocated_layouts(model, job)
                                  if c.meets_slo(model, job) and c.fits_nodes(model)), key=lambda c: (c.cost, c.gpus))
    return known[job.name]


# ----- several jobs time-sharing one pool ----------------------------------------------------------
POOL_BUDGET = 2_000  # sets of jobs sharing a pool, at most; past it the bounds fall back (see SharedPools)


@dataclass(frozen=True)
class SharedPools:
    """Groups of two or more jobs time-sharing one pool (RLix): each member's rollout and train on
    the same GPUs, every phase of every member taking its turn there.

    ``groups``: every set of jobs that may share a layout (a cluster's first ``g`` GPUs, a count
    and type at which each member meets its SLO colocated alone), laid out round robin in member
    order; the group's timetable is checked later, like any candidate's. A set is listed when the
    members' phases fit one after another within every member's cap (the least cycle any
    timetable can have: the GPUs are the same) and their state fits a node's host memory.
    ``share``: per job, the least $/h a plan can charge it for a pool, ``cost / members`` over the
    sets it is in; when the sets were more than the budget (``complete`` False), its cheapest
    colocated group over ``max_group_size``: a pool costs at least that, and has no more members."""

    groups: list[tuple[tuple[str, ...], GroupPlan]]
    share: dict[str, float]
    complete: bool


def shared_pools(model: PlanningModel, jobs: list[JobSpec], max_group_size: int) -> SharedPools:
    key = (max_group_size, tuple(j.name for j in jobs))
    known = _POOLS.setdefault(model, {})
    if key not in known:
        known[key] = _shared_pools(model, jobs, max_group_size)
    return known[key]


_POOLS: "weakref.WeakKeyDictionary[PlanningModel, dict]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class _Entry:
    job: JobSpec
    busy_s: float  # rollout + train at the layout
    cap_s: float
    mem_gb: float
    layout: Colocated


def _shared_pools(model: PlanningModel, jobs: list[JobSpec], max_group_size: int) -> SharedPools:
    by_layout: dict[tuple[str, int], list[_Entry]] = {}
    for job in jobs:
        for c in colocated_options(model, job):
            phases = c.group.jobs[0]
            busy = phases.phase("rollout").duration_s + phases.phase("train").duration_s
            by_layout.setdefault((c.cluster, c.gpus), []).append(
                _Entry(job, busy, member_cap(model, job), c.mem_gb, c))
    sets: list[tuple[tuple[str, int], list[_Entry]]] = []
    complete = True

    def grow(layout, entries: list[_Entry], start: int, members: list[_Entry], busy: float, cap: float, mem: float):
        nonlocal complete
        mem_cap = model.topology.clusters[layout[0]].host_mem_gb
        for i in range(start, len(entries)):
            e = entries[i]
            if not meets_slo(busy + e.busy_s, cap):
                break  # sorted by busy time: every later job breaks the cap too
            if not meets_slo(busy + e.busy_s, e.cap_s) or not fits_memory(mem + e.mem_gb, mem_cap):
                continue
            if len(sets) >= POOL_BUDGET:
                complete = False
                return
            sets.append((layout, members + [e]))
            if len(members) + 1 < max_group_size:
                grow(layout, entries, i + 1, members + [e], busy + e.busy_s, min(cap, e.cap_s), mem + e.mem_gb)

    for layout, entries in sorted(by_layout.items()):
        entries.sort(key=lambda e: (e.busy_s, e.job.name))
        for i, e in enumerate(entries):
            if complete:
                grow(layout, entries, i + 1, [e], e.busy_s, e.cap_s, e.mem_gb)
    groups, share = [], {}
    for (cluster, _), members in sets:
        gpus = members[0].layout.group.jobs[0].phase("train").gpus
        laid = [Member(e.job, tuple(gpus), tuple(gpus)) for e in members]
        rr = round_robin_timetable(model, laid)
        nodes = list(members[0].layout.group.nodes)
        names = tuple(e.job.name for e in members)
        groups.append((names, group_plan(model.topology, "pool-" + "-".join(names), laid, rr.phases, rr.cycle_s,
                                         nodes, model.solo_of)))
        for name in names:
            share[name] = min(share.get(name, math.inf), members[0].layout.cost / len(members))
    if not complete:
        share = {job.name: colocated_options(model, job)[0].cost / max_group_size
                 for job in jobs if colocated_options(model, job)}
    return SharedPools(groups, share, complete)
