"""ROLL: per job a YAML file with the ``device_mapping`` of ``actor_train``, ``actor_infer`` and
``reference`` in global GPU ranks (order: ``weave_rl.planner.export.layout``).

``device_mapping`` is written as ROLL writes it, ``list(range(a,b))``, when the ranks are
contiguous, else as a list literal (ROLL #205: non-contiguous ranks trip its node arithmetic, so a
warning says so). ``reference`` runs where ``actor_train`` does (ROLL requires it for partial GPU
mode). The ranks assume ROLL's node order is the topology's: node rank = global rank //
``num_gpus_per_node``; the file's header comment lists which ranks land on which node. ROLL reserves
whole nodes for the ranks it is given: a job that holds only part of a node (Weave time-shares a
node's GPUs between a group's jobs) gets a warning, since ROLL would claim the rest of that node.
"""

from __future__ import annotations

from typing import Any

from weave_rl.planner.export.layout import JobLayout, by_node, global_ranks, rank_offsets
from weave_rl.topology.topology import Topology


def device_mapping(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"list(range({ranks[0]},{ranks[-1] + 1}))"
    return "[" + ", ".join(map(str, ranks)) + "]"


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 1 else \
        ",".join(map(str, ranks))


def header(data: dict[str, Any]) -> list[str]:
    """The comment lines at the top of the file: the keys ROLL reads, the operator's, the rank -> node map."""
    place = data.get("weave_placement", {})
    per_node = data.get("num_gpus_per_node")
    lines = ["Keys ROLL reads: " + ", ".join(k for k in data if k != "weave_placement")
             + " (merge them into the pipeline config).",
             "Keys for the operator, not for ROLL: weave_placement - drop it before ROLL reads the file."]
    if per_node:
        lines.append(f"Ranks -> nodes: ROLL node rank = rank // num_gpus_per_node ({per_node}); in topology order:")
        lines += [f"  ranks {first}-{first + per_node - 1} -> {node} (ROLL node {first // per_node})"
                  for node, first in place.get("node_first_rank", {}).items()]
    return lines


def build(layout: JobLayout, topo: Topology, source: str, warnings: list[str]) -> dict[str, Any]:
    train = global_ranks(topo, layout.train)
    infer = global_ranks(topo, layout.rollout)
    for role, ranks in (("actor_train", train), ("actor_infer", infer)):
        if ranks != list(range(ranks[0], ranks[-1] + 1)):
            warnings.append(f"ROLL: job {layout.job} {role} ranks are not contiguous ({device_mapping(ranks)}); "
                            "ROLL expects contiguous device_mapping (ROLL #205)")
    data: dict[str, Any] = {}
    per_node = {n.gpus for n in topo.nodes.values()}
    if len(per_node) == 1:
        data["num_gpus_per_node"] = per_node.pop()
    else:
        warnings.append(f"ROLL: topology {topo.name} mixes GPUs per node; num_gpus_per_node left out")
    node_gpus = {**by_node(topo, layout.rollout)}
    for node, idx in by_node(topo, layout.train).items():
        node_gpus[node] = sorted(set(node_gpus.get(node, [])) | set(idx))
    for node, idx in node_gpus.items():
        have = topo.nodes[node].gpus
        if len(idx) < have:
            warnings.append(f"ROLL: job {layout.job} holds {len(idx)} of node {node}'s {have} GPUs (ranks "
                            f"{_span([rank_offsets(topo)[node] + i for i in idx])}); ROLL reserves whole nodes "
                            f"(node rank = rank // num_gpus_per_node), so it would claim all {have}, "
                            f"{have - len(idx)} beyond what the plan holds")
    data["actor_train"] = {"device_mapping": device_mapping(train)}
    data["actor_infer"] = {"device_mapping": device_mapping(infer)}
    data["reference"] = {"device_mapping": device_mapping(train)}
    offsets = rank_offsets(topo)
    used = {**by_node(topo, layout.rollout), **by_node(topo, layout.train)}
    data["weave_placement"] = {
        "plan": layout.plan, "group": layout.group, "job": layout.job, "topology": topo.name,
        "rank_order": "nodes in topology order x GPU index; rank = GPUs on earlier nodes + index",
        "node_first_rank": {n: offsets[n] for n in topo.nodes if n in used},
    }
    return data
