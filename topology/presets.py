"""Built-in topologies: the Weave testbed, the seed article's 32 x A100 cluster, and this machine."""

from __future__ import annotations

import importlib.util
import os
from typing import Callable

from weave_rl.core.errors import InputError
from weave_rl.topology.spec import ClusterSpec, LinkSpec, TopologySpec

MAX_NODES = 9999  # ClusterSpec.nodes' bound


def weave_testbed() -> TopologySpec:
    """The Weave paper's testbed: 328 H20 + 328 H800 in two geo-distributed clusters (20 Gbit/s apart)."""
    return TopologySpec(
        name="weave-testbed",
        clusters=[
            ClusterSpec(name="rollout", gpu_type="H20", nodes=41, gpus_per_node=8, host_mem_gb=2048,
                        pcie_gbps=256, nvlink_gbps=3600, fabric_gbps=400),
            ClusterSpec(name="train", gpu_type="H800", nodes=41, gpus_per_node=8, host_mem_gb=2048,
                        pcie_gbps=256, nvlink_gbps=3600, fabric_gbps=400),
        ],
        links=[LinkSpec(between=("rollout", "train"), gbps=20, latency_ms=1)],
    )


def a100_32() -> TopologySpec:
    """The seed article's single-job example: 4 nodes x 8 A100 on one fabric."""
    return TopologySpec(
        name="a100-32",
        clusters=[ClusterSpec(name="a100", gpu_type="A100", nodes=4, gpus_per_node=8, host_mem_gb=1024,
                              pcie_gbps=256, nvlink_gbps=4800, fabric_gbps=200)],
    )


def local() -> TopologySpec:
    """One node with this machine's logical devices: CUDA GPUs when present, else one per CPU core."""
    gpus, gpu_type = _local_devices()
    mem_gb = _host_mem_gb()
    return TopologySpec(
        name="local",
        clusters=[ClusterSpec(name="local", gpu_type=gpu_type, nodes=1, gpus_per_node=gpus, host_mem_gb=mem_gb)],
    )


def _local_devices() -> tuple[int, str]:
    # Importing torch costs seconds; only do it when it is installed.
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            name = torch.cuda.get_device_name(0).upper()
            for known in ("H200", "H800", "H100", "H20", "A800", "A100", "L40S"):
                if known in name:
                    return torch.cuda.device_count(), known
            return torch.cuda.device_count(), "H100"
    return max(1, os.cpu_count() or 1), "CPU"


def _host_mem_gb() -> float:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    except (ValueError, OSError, AttributeError):
        return 16.0


PRESETS: dict[str, Callable[[], TopologySpec]] = {
    "weave-testbed": weave_testbed,
    "a100-32": a100_32,
    "local": local,
}


def scaled(spec: TopologySpec, factor: int) -> TopologySpec:
    """The same clusters with ``factor`` times the nodes (preset names ``<preset>-x<factor>``, e.g.
    ``weave-testbed-x3``: larger generated topologies for planning at scale)."""
    clusters = [c.model_copy(update={"nodes": c.nodes * factor}) for c in spec.clusters]
    return spec.model_copy(update={"name": f"{spec.name}-x{factor}", "clusters": clusters})


def preset_spec(name: str) -> TopologySpec | None:
    """The preset called ``name`` (or a scaled one, ``<preset>-x<N>``), None if there is none."""
    if name in PRESETS:
        return PRESETS[name]()
    base, sep, factor = name.rpartition("-x")
    if sep and base in PRESETS and factor.isdigit() and int(factor) >= 1:
        spec = PRESETS[base]()
        most = max(c.nodes for c in spec.clusters)
        if int(factor) * most > MAX_NODES:
            raise InputError(name, None, f"preset {base!r} scaled {int(factor)} times has "
                             f"{int(factor) * most:,} nodes in one cluster; at most {MAX_NODES:,} "
                             f"(factor <= {MAX_NODES // most})")
        return scaled(spec, int(factor))
    return None
