"""The weave-testbed topology and a candidate builder over its jobs: shared by the planner's tests
(tests/ is on sys.path under pytest).

Prices on weave-testbed: a training node (8 H800) is 42.24 $/h, a rollout node (8 H20) 14.80 $/h.
"""

from weave_rl.planner.model import PlanningModel
from weave_rl.planner.optimal import CandidateBuilder, _admissible
from weave_rl.topology.topology import load_topology, topology_from_data

TESTBED = load_topology("weave-testbed")
TRAIN_NODE, ROLLOUT_NODE = 8 * 5.28, 8 * 1.85


def small_testbed(name: str, nodes: int):
    """weave-testbed's two clusters (8 H20 / 8 H800 a node, 20 Gbit/s between) with ``nodes`` each."""
    cluster = {"gpus_per_node": 8, "host_mem_gb": 2048, "pcie_gbps": 256, "nvlink_gbps": 3600, "fabric_gbps": 400}
    return topology_from_data({"name": name, "clusters": [
        {"name": "rollout", "gpu_type": "H20", "nodes": nodes, **cluster},
        {"name": "train", "gpu_type": "H800", "nodes": nodes, **cluster}],
        "links": [{"between": ["rollout", "train"], "gbps": 20, "latency_ms": 1}]}, f"{name}.yaml")


def builder_for(jobs, k=5):
    model = PlanningModel(TESTBED, jobs)
    _, ids = _admissible(model)
    return model, CandidateBuilder(model, ids, k)


def least_per_leader(builder, candidates, value) -> dict[int, float]:
    """Per leader (a group's member of smallest cycle cap, ties by index), the least reduced cost
    ``cost - sum of values`` of a candidate it leads, at most 0: what pricing's per-leader bound sums."""
    least: dict[int, float] = {}
    for c in candidates:
        leader = min(c.jobs, key=lambda j: (builder.cap[j], j))
        least[leader] = min(least.get(leader, 0.0), c.cost - sum(value[j] for j in c.jobs))
    return least


def colocated_jobs(plan) -> list[str]:
    """The jobs of a plan whose rollout runs on their own training GPUs."""
    return [j.name for g in plan.groups for j in g.jobs
            if sorted(j.phase("rollout").gpus) == sorted(j.phase("train").gpus)]
