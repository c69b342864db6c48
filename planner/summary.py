"""Figures of a plan: utilization, switch and bubble (idle) share per cluster; slowdowns per job."""

from __future__ import annotations

from dataclasses import dataclass

from weave_rl.planner.plan import Plan
from weave_rl.topology.topology import Topology, node_of


@dataclass(frozen=True)
class ClusterUse:
    cluster: str
    gpus: int  # GPUs the plan holds in this cluster
    busy_share: float  # GPU-time running phases / GPU-time held
    bubble_share: float  # idle GPU-time / GPU-time held


def cluster_use(plan: Plan, topology: Topology) -> list[ClusterUse]:
    """Per cluster, GPU-seconds per second: each group contributes its phases' GPU-seconds per cycle."""
    held: dict[str, float] = {}
    busy: dict[str, float] = {}
    for group in plan.groups:
        for node_id in group.nodes:
            node = topology.node(node_id)
            held[node.cluster] = held.get(node.cluster, 0.0) + node.gpus
        for job in group.jobs:
            for slot in job.phases:
                if slot.phase == "sync":
                    continue
                for gpu in slot.gpus:
                    cluster = topology.node(node_of(gpu)).cluster
                    busy[cluster] = busy.get(cluster, 0.0) + slot.duration_s / group.cycle_s
    out = []
    for cluster in topology.clusters:
        if held.get(cluster):
            share = busy.get(cluster, 0.0) / held[cluster]
            out.append(ClusterUse(cluster, int(held[cluster]), share, 1.0 - share))
    return out


def usd_per_iteration(plan: Plan) -> float:
    """Dollars per job-iteration: $/h over iterations per hour of all jobs together."""
    per_hour = sum(3600.0 / job.iteration_s for group in plan.groups for job in group.jobs)
    return plan.cost_usd_per_hour / per_hour if per_hour else float("nan")
