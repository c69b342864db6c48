"""veRL: per job a YAML override file with its resource pools.

Top-level keys are veRL's own config keys: ``trainer.nnodes`` / ``trainer.n_gpus_per_node`` (the
training pool) and, for a disaggregated job, ``rollout.nnodes`` / ``rollout.n_gpus_per_node`` with
``actor_rollout_ref.hybrid_engine: false`` (fully_async / one_step_off_policy recipes); a job whose
rollout and train share GPUs gets the hybrid engine and one pool. veRL has no config key for the
pool spec itself (its split-placement example builds ``resource_pool_spec`` and ``mapping`` in
Python), so those, with the nodes and CUDA device indices the plan pins, sit under
``weave_placement`` for a launcher to read; drop that key before handing the file to Hydra. The
file's header comment says so and lists the keys veRL reads as ready-made overrides.
veRL pools must be disjoint or identical (verl #3125): a partial overlap is an error.
"""

from __future__ import annotations

from typing import Any

from weave_rl.planner.export.layout import JobLayout, by_node, uniform_per_node
from weave_rl.topology.topology import Topology
from weave_rl.core.errors import InputError

TRAINER_ROLES = ("Actor", "Critic", "RefPolicy", "RewardModel")  # veRL Role names on the trainer pool


def build(layout: JobLayout, topo: Topology, source: str, warnings: list[str]) -> dict[str, Any]:
    train = by_node(topo, layout.train)
    rollout = by_node(topo, layout.rollout)
    if layout.colocated:
        pools = {"global_pool": train}
        mapping = {role: "global_pool" for role in ("ActorRollout", *TRAINER_ROLES[1:])}
        data: dict[str, Any] = {"trainer": _nodes_keys(layout, "train", train, warnings),
                                "actor_rollout_ref": {"hybrid_engine": True}}
    elif layout.disjoint:
        pools = {"trainer_pool": train, "rollout_pool": rollout}
        mapping = {**{role: "trainer_pool" for role in TRAINER_ROLES}, "Rollout": "rollout_pool"}
        data = {"trainer": _nodes_keys(layout, "train", train, warnings),
                "rollout": _nodes_keys(layout, "rollout", rollout, warnings),
                "actor_rollout_ref": {"hybrid_engine": False}}
    else:
        raise InputError(source, f"job {layout.job}", "rollout and train GPUs overlap in part: veRL resource pools "
                         "must be disjoint or identical")
    data = {k: v for k, v in data.items() if v}  # a pool nnodes x n_gpus_per_node cannot describe stays out
    data["weave_placement"] = {
        "plan": layout.plan, "group": layout.group, "job": layout.job,
        "resource_pool_spec": {name: [len(g) for g in placed.values()] for name, placed in pools.items()},
        "mapping": mapping,
        "nodes": {name: list(placed) for name, placed in pools.items()},
        "cuda_visible_devices": {name: {n: ",".join(map(str, g)) for n, g in placed.items()}
                                 for name, placed in pools.items()},
    }
    return data


def header(data: dict[str, Any]) -> list[str]:
    """The comment lines at the top of the file: which keys veRL reads and which are the operator's."""
    keys = [f"{section}.{key}={value}".replace("True", "true").replace("False", "false")
            for section, body in data.items() if section != "weave_placement" for key, value in body.items()]
    return [
        "Keys veRL reads (Hydra overrides of ppo_trainer.yaml or fully_async_ppo_trainer.yaml):",
        "  " + " ".join(keys),
        "Keys for the operator, not for veRL: weave_placement (resource_pool_spec, mapping, nodes,",
        "  cuda_visible_devices) - veRL's struct config rejects unknown keys, so drop it before Hydra",
        "  reads the file (e.g. yq 'del(.weave_placement)'), or pass only the overrides above.",
    ]


def _nodes_keys(layout: JobLayout, role: str, placed: dict[str, list[int]], warnings: list[str]) -> dict[str, int]:
    per_node = uniform_per_node(placed)
    if per_node is None:
        warnings.append(f"veRL: job {layout.job} {role} holds {'+'.join(str(len(g)) for g in placed.values())} GPUs "
                        "on its nodes; nnodes x n_gpus_per_node cannot say that, see weave_placement.resource_pool_spec")
        return {}
    return {"nnodes": len(placed), "n_gpus_per_node": per_node}
