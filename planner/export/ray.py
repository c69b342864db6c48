"""Ray: per job its placement groups as JSON, one per role (one for a colocated job), one bundle per
node holding the GPUs the plan gives the job there.

A bundle is ``{"GPU": n, "CPU": n}``; ``bundle_label_selector`` pins it to the plan's node through a
node label ``weave.io/node=<node id>`` (start each Ray node with ``--labels``), and
``cuda_visible_devices`` names the GPU indices the job's workers must use on it. With several
bundles the strategy is ``STRICT_SPREAD`` (one bundle per node), else ``STRICT_PACK``. Jobs of one
group time-share nodes: ``time_shared_with`` lists the jobs whose bundles land on the same GPUs, so
their groups are created in turn (or once per node, as Weave's ray backend does), never at once.
"""

from __future__ import annotations

from typing import Any

from weave_rl.planner.export.layout import JobLayout, by_node
from weave_rl.topology.topology import Topology

NODE_LABEL = "weave.io/node"


def placement_group(layout: JobLayout, roles: list[str], gpus: tuple[str, ...], topo: Topology) -> dict[str, Any]:
    placed = by_node(topo, gpus)
    return {
        "name": f"weave-{layout.group}-{layout.job}-{'-'.join(r for r in roles if r != 'sync')}",
        "roles": roles,
        "strategy": "STRICT_SPREAD" if len(placed) > 1 else "STRICT_PACK",
        "bundles": [{"GPU": len(g), "CPU": len(g)} for g in placed.values()],
        "bundle_label_selector": [{NODE_LABEL: n} for n in placed],
        "bundle_nodes": list(placed),
        "bundle_gpu_ids": [[f"{n}:{i}" for i in g] for n, g in placed.items()],
        "cuda_visible_devices": [",".join(map(str, g)) for g in placed.values()],
    }


def build(layout: JobLayout, topo: Topology, others: list[JobLayout]) -> dict[str, Any]:
    if layout.colocated:
        groups = [placement_group(layout, ["rollout", "train", "sync"], layout.train, topo)]
    else:
        groups = [placement_group(layout, ["rollout", "sync"], layout.rollout, topo),
                  placement_group(layout, ["train"], layout.train, topo)]
    mine = set(layout.rollout) | set(layout.train)
    shared = [o.job for o in others if o.job != layout.job and mine & (set(o.rollout) | set(o.train))]
    return {"plan": layout.plan, "group": layout.group, "job": layout.job, "node_label": NODE_LABEL,
            "placement_groups": groups, "time_shared_with": shared}
