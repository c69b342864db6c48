"""What every exporter needs from a plan: each job's rollout and train GPUs, grouped by node, and
the global GPU rank order.

Global rank order (ROLL ``device_mapping``): nodes in topology order (clusters as the topology lists
them, nodes ``<cluster>-000``, ``-001``, ... inside each), GPUs by index inside a node; a GPU's rank
is the number of GPUs on the nodes before its node plus its index. On ``micro-a`` (clusters rollout,
train; 8 GPUs each) ``rollout-000:0..7`` are ranks 0..7 and ``train-000:0..7`` ranks 8..15.
"""

from __future__ import annotations

from dataclasses import dataclass

from weave_rl.planner.plan import Plan
from weave_rl.topology.topology import Topology, node_of
from weave_rl.core.errors import InputError


@dataclass(frozen=True)
class JobLayout:
    plan: str
    group: str
    job: str
    rollout: tuple[str, ...]  # GPU ids of the rollout phase (the sync's receivers too), plan order
    train: tuple[str, ...]

    @property
    def colocated(self) -> bool:
        return set(self.rollout) == set(self.train)

    @property
    def disjoint(self) -> bool:
        return not set(self.rollout) & set(self.train)


def job_layouts(plan: Plan, topo: Topology, plan_name: str, source: str = "<plan>") -> list[JobLayout]:
    """Every placed job's GPUs, checked against the topology (InputError naming the plan key)."""
    out = []
    for gi, group in enumerate(plan.groups):
        for ji, job in enumerate(group.jobs):
            roles = {}
            for pi, slot in enumerate(job.phases):
                for gpu in slot.gpus:
                    _check_gpu(topo, gpu, source, f"groups[{gi}].jobs[{ji}].phases[{pi}].gpus")
                if slot.phase in ("rollout", "train"):
                    roles[slot.phase] = tuple(slot.gpus)
            for role in ("rollout", "train"):
                if role not in roles:
                    raise InputError(source, f"groups[{gi}].jobs[{ji}].phases", f"job {job.name} has no {role} phase")
            out.append(JobLayout(plan_name, group.name, job.name, roles["rollout"], roles["train"]))
    return out


def _check_gpu(topo: Topology, gpu: str, source: str, key: str) -> None:
    try:
        node = topo.node(node_of(gpu))
    except (KeyError, ValueError):
        raise InputError(source, key, f"GPU {gpu!r} is not in topology {topo.name!r}") from None
    index = int(gpu.rpartition(":")[2])
    if index >= node.gpus:
        raise InputError(source, key, f"GPU {gpu!r}: node {node.id} has {node.gpus} GPUs")


def by_node(topo: Topology, gpus: tuple[str, ...] | list[str]) -> dict[str, list[int]]:
    """GPU ids -> {node: sorted GPU indices}, nodes in topology order."""
    grouped: dict[str, list[int]] = {}
    for gpu in gpus:
        grouped.setdefault(node_of(gpu), []).append(int(gpu.rpartition(":")[2]))
    order = {n: i for i, n in enumerate(topo.nodes)}
    return {n: sorted(grouped[n]) for n in sorted(grouped, key=order.__getitem__)}


def rank_offsets(topo: Topology) -> dict[str, int]:
    offsets, seen = {}, 0
    for node in topo.nodes.values():
        offsets[node.id] = seen
        seen += node.gpus
    return offsets


def global_ranks(topo: Topology, gpus: tuple[str, ...] | list[str]) -> list[int]:
    offsets = rank_offsets(topo)
    return sorted(offsets[node_of(g)] + int(g.rpartition(":")[2]) for g in gpus)


def uniform_per_node(placed: dict[str, list[int]]) -> int | None:
    """The GPUs per node when every node holds the same count, else None."""
    counts = {len(v) for v in placed.values()}
    return counts.pop() if len(counts) == 1 else None
