"""Node and GPU ids: ``<cluster>-<NNN>`` nodes, ``<node>:<index>`` GPUs, ``switch:<cluster>`` switches.

Below the topology model and the sync-time model, which both need them.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1 << 16)  # called in every hot path of the planner and the executor
def node_of(gpu_id: str) -> str:
    """``rollout-003:5`` -> ``rollout-003``."""
    node, sep, index = gpu_id.rpartition(":")
    if not sep or not index.isdigit():
        raise ValueError(f"not a GPU id: {gpu_id!r} (expected <node>:<index>)")
    return node


def switch_of(cluster: str) -> str:
    return f"switch:{cluster}"
