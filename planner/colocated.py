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
from weave_rl.planner.plan import GroupPlan
from weave_rl.planner.roundrobin import Member, group_plan, round_robin_timetable
from weave_rl.profiles.jobs import JobSpec

SLO_TOL = 1e-9


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
        return self.cycle_s <= job.slo * model.solo_of(job) * (1 + SLO_TOL)

    def fits_nodes(self, model: PlanningModel) -> bool:
        return self.mem_gb <= model.topology.clusters[self.cluster].host_mem_gb


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


def colocated_jobs(plan) -> list[str]:
    """The jobs of a plan whose rollout runs on their own training GPUs."""
    return [j.name for g in plan.groups for j in g.jobs
            if sorted(j.phase("rollout").gpus) == sorted(j.phase("train").gpus)]
