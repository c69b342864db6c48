"""Kubernetes: per group one file of Deployments, one per pool (topology cluster) of the group.

Weave gives a group whole nodes and time-shares their GPUs between the group's jobs, so a pod holds
a whole node: ``replicas`` = the group's nodes in that pool, each pod requests all the node's GPUs
(``nvidia.com/gpu``, request = limit, written as quantity strings ``"8"``), a required node affinity on ``kubernetes.io/hostname`` pins
the pods to exactly those nodes (Weave node ids are the Kubernetes node names), a required pod
anti-affinity puts one pod per node, and ``nodeSelector: {pool: <cluster>}`` keeps them in their
pool (nodes labelled ``pool=<cluster>``, as in the seed article). Labels name the plan, group, pool
and role (``rollout``, ``train``, or ``rollout-train`` for shared GPUs); ``job.weave.io/<job>`` labels
give each job's role on the pool. The worker learns its share from ``WEAVE_*`` environment variables.
Every manifest passes ``k8s_schema.manifest_problems`` before it is written.
"""

from __future__ import annotations

from typing import Any

from weave_rl.planner.export.k8s_schema import GPU, dns_label, label_name, manifest_problems
from weave_rl.planner.export.layout import JobLayout
from weave_rl.planner.plan import Plan
from weave_rl.topology.topology import Topology, node_of

HOSTNAME = "kubernetes.io/hostname"


def build(plan: Plan, topo: Topology, layouts: list[JobLayout], plan_name: str, image: str,
          namespace: str | None) -> dict[str, list[dict[str, Any]]]:
    """{group name: [Deployment, ...]} in topology cluster order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for group in plan.groups:
        jobs = [lay for lay in layouts if lay.group == group.name]
        docs = []
        for cluster in topo.clusters:
            nodes = [n for n in topo.nodes if n in group.nodes and topo.nodes[n].cluster == cluster]
            if nodes:
                docs.append(_deployment(plan_name, group.name, cluster, nodes, jobs, topo, image, namespace))
        out[group.name] = docs
    return out


def _deployment(plan_name: str, group: str, pool: str, nodes: list[str], jobs: list[JobLayout], topo: Topology,
                image: str, namespace: str | None) -> dict[str, Any]:
    job_roles: dict[str, list[str]] = {}
    for lay in jobs:
        for role, gpus in (("rollout", lay.rollout), ("train", lay.train)):
            if any(node_of(g) in nodes for g in gpus):
                job_roles.setdefault(lay.job, []).append(role)
    roles = sorted({r for rs in job_roles.values() for r in rs})
    selector = {"weave.io/plan": label_name(plan_name), "weave.io/group": label_name(group),
                "weave.io/pool": label_name(pool)}
    labels = {"app.kubernetes.io/name": "weave-worker", "app.kubernetes.io/part-of": "weave", **selector,
              "weave.io/role": "-".join(roles) or "idle",
              **{f"job.weave.io/{label_name(j)}": "-".join(rs) for j, rs in job_roles.items()}}
    gpus = max(topo.nodes[n].gpus for n in nodes)
    metadata: dict[str, Any] = {"name": dns_label(f"weave-{plan_name}-{group}-{pool}"), "labels": labels,
                                "annotations": {"weave.io/nodes": ",".join(nodes),
                                                "weave.io/jobs": ",".join(f"{j}={'+'.join(rs)}"
                                                                          for j, rs in job_roles.items())}}
    if namespace:
        metadata["namespace"] = namespace
    doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": len(nodes),
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"pool": pool},
                    "affinity": {
                        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                            {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": nodes}]}]}},
                        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                            {"labelSelector": {"matchLabels": selector}, "topologyKey": HOSTNAME}]},
                    },
                    "containers": [{
                        "name": "worker",
                        "image": image,
                        "env": [{"name": "WEAVE_PLAN", "value": plan_name}, {"name": "WEAVE_GROUP", "value": group},
                                {"name": "WEAVE_POOL", "value": pool},
                                {"name": "WEAVE_JOBS", "value": ",".join(job_roles)}],
                        "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}},  # quantities
                    }],
                },
            },
        },
    }
    problems = manifest_problems(doc)
    if problems:  # our own output: a bug, not a user mistake
        raise AssertionError(f"k8s manifest {metadata['name']} fails its schema check: {'; '.join(problems)}")
    return doc
