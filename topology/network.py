"""Weight-sync time model shared by the planner and the simulator (DESIGN section 4)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from weave_rl.topology.ids import node_of

if TYPE_CHECKING:
    from weave_rl.topology.topology import Topology

SYNC_MODELS = ("two_stage", "flat")


def sync_time_s(topology: "Topology", weight_bytes: float, train_gpus: list[str], rollout_gpus: list[str],
                model: str = "two_stage", rollout_tp: int = 1) -> float:
    if model not in SYNC_MODELS:
        raise ValueError(f"unknown sync model {model!r} (models: {', '.join(SYNC_MODELS)})")
    if not train_gpus or not rollout_gpus:
        raise ValueError("weight sync needs at least one training GPU and one rollout GPU")
    if weight_bytes <= 0:
        return 0.0
    bits = weight_bytes * 8
    src = sorted({node_of(g) for g in train_gpus})
    gpus_per_dst = Counter(node_of(g) for g in rollout_gpus)
    dst = sorted(gpus_per_dst)
    remote = [n for n in dst if n not in src]

    def over_network(copies: float) -> float:
        if not remote:
            return 0.0
        gbps = topology.bottleneck_gbps(src, remote)
        if gbps <= 0:
            raise ValueError(f"no network path from {src[0]} to {remote[0]} in topology {topology.name!r}")
        return copies * bits / (gbps * 1e9) + topology.latency_s(src, remote)

    if model == "flat":
        replicas = max(1, len(rollout_gpus) // max(1, rollout_tp))
        local_replicas = sum(gpus_per_dst[n] for n in dst if n in src) // max(1, rollout_tp)
        nvlink = min(topology.node(n).nvlink_gbps for n in dst)
        return over_network(replicas - local_replicas) + local_replicas * bits / (nvlink * 1e9)

    # two_stage: one copy crosses, then ring all-gather among receiving nodes, then NVLink broadcast.
    t_cross = over_network(1.0)
    k = len(dst)
    t_gather = 0.0
    if k > 1:
        fabric = min(topology.node(n).fabric_gbps for n in dst)
        t_gather = bits * (k - 1) / k / (fabric * 1e9)
    t_local = 0.0
    if any(count > 1 for count in gpus_per_dst.values()) or set(dst) & set(src):
        nvlink = min(topology.node(n).nvlink_gbps for n in dst)
        t_local = bits / (nvlink * 1e9)
    return t_cross + t_gather + t_local
