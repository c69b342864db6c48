"""The cluster as a typed value plus a networkx graph, and the queries the planner needs.

Graph: one vertex per host (``rollout-003``) and one per cluster switch (``switch:rollout``); each
host hangs off its cluster's switch with its fabric bandwidth, switches are joined by the
inter-cluster links. Capacities are in Gbit/s. GPUs are attributes of their host (``gpu_ids``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

import networkx as nx
from pydantic import ValidationError

from weave_rl.core.errors import InputError, Problems, validation_problems
from weave_rl.core.yamlio import load_yaml_file
from weave_rl.topology.catalog import BUILTIN_GPU_TYPES, GpuType
from weave_rl.topology.ids import node_of, switch_of
from weave_rl.topology.network import sync_time_s
from weave_rl.topology.presets import PRESETS, preset_spec
from weave_rl.topology.spec import ClusterSpec, TopologySpec


@dataclass(frozen=True)
class Node:
    id: str
    cluster: str
    gpu_type: str
    gpus: int
    host_mem_gb: float
    pcie_gbps: float
    nvlink_gbps: float
    fabric_gbps: float

    @property
    def gpu_ids(self) -> list[str]:
        return [f"{self.id}:{i}" for i in range(self.gpus)]


class Topology:
    """Nodes, GPUs, prices and the network of one deployment."""

    def __init__(self, spec: TopologySpec, source: str = "<topology>"):
        self.spec = spec
        self.name = spec.name
        self.source = source
        self.gpu_types: dict[str, GpuType] = {**BUILTIN_GPU_TYPES, **spec.gpu_types}
        self.clusters: dict[str, ClusterSpec] = {c.name: c for c in spec.clusters}
        self._check_references()
        self.nodes: dict[str, Node] = {}
        self._index: dict[tuple, list] = {}
        for cluster in spec.clusters:
            for i in range(cluster.nodes):
                node_id = f"{cluster.name}-{i:03d}"
                self.nodes[node_id] = Node(node_id, cluster.name, cluster.gpu_type, cluster.gpus_per_node,
                                           cluster.host_mem_gb, cluster.pcie_gbps, cluster.nvlink_gbps,
                                           cluster.fabric_gbps)
        self.graph = self._build_graph()
        self._flow_cache: dict[tuple, float] = {}

    # ----- construction -------------------------------------------------------------------
    def _check_references(self) -> None:
        problems = Problems(self.source)
        data = self.spec.model_dump()
        found = _reference_problems(data, self.gpu_types)
        # Connectivity only of an otherwise sound file: a bad name or link already explains a cut.
        found = found or _disconnected([c["name"] for c in data["clusters"]], data["links"])
        for key, reason in found:
            problems.add(key, reason)
        problems.raise_if_any()

    def _build_graph(self) -> nx.Graph:
        graph = nx.Graph(name=self.name)
        for cluster in self.spec.clusters:
            graph.add_node(switch_of(cluster.name), kind="switch", cluster=cluster.name)
        for node in self.nodes.values():
            graph.add_node(node.id, kind="host", cluster=node.cluster, gpu_type=node.gpu_type,
                           gpus=node.gpus, gpu_ids=node.gpu_ids, host_mem_gb=node.host_mem_gb)
            graph.add_edge(node.id, switch_of(node.cluster), capacity=node.fabric_gbps, latency_ms=0.0)
        for link in self.spec.links:
            a, b = (switch_of(c) for c in link.between)
            graph.add_edge(a, b, capacity=link.gbps, latency_ms=link.latency_ms)
        return graph

    # ----- inventory ----------------------------------------------------------------------
    def nodes_in(self, cluster: str | None = None, gpu_type: str | None = None) -> list[Node]:
        key = (cluster, gpu_type)
        if key not in self._index:  # nodes never change: index each query once (planners ask often)
            self._index[key] = [n for n in self.nodes.values() if (cluster is None or n.cluster == cluster)
                                and (gpu_type is None or n.gpu_type == gpu_type)]
        return list(self._index[key])

    def gpus_in(self, cluster: str | None = None, gpu_type: str | None = None) -> list[str]:
        key = ("gpus", cluster, gpu_type)
        if key not in self._index:
            self._index[key] = [g for n in self.nodes_in(cluster, gpu_type) for g in n.gpu_ids]
        return list(self._index[key])

    def node(self, node_id: str) -> Node:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise KeyError(f"unknown node {node_id!r} in topology {self.name!r}") from None

    def gpu_type_of(self, gpu_id: str) -> str:
        return self.node(node_of(gpu_id)).gpu_type

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes.values())

    def node_usd_per_hour(self, node_id: str) -> float:
        node = self.node(node_id)
        return node.gpus * self.gpu_types[node.gpu_type].usd_per_hour

    def cluster_node_usd_per_hour(self) -> dict[str, float]:
        """Cluster name -> $/h of one of its nodes (every node of a cluster alike)."""
        return {c.name: c.gpus_per_node * self.gpu_types[c.gpu_type].usd_per_hour for c in self.clusters.values()}

    def cost_usd_per_hour(self, node_ids: Iterable[str] | None = None) -> float:
        ids = self.nodes if node_ids is None else node_ids
        return sum(self.node_usd_per_hour(n) for n in ids)

    # ----- network ------------------------------------------------------------------------
    def bottleneck_gbps(self, src_nodes: Iterable[str], dst_nodes: Iterable[str]) -> float:
        """Aggregate bandwidth from one node set to another: the max flow through the graph.

        Nodes in both sets are excluded from the flow (their copy moves over NVLink instead).
        Returns 0 when no path exists.
        """
        src = frozenset(src_nodes)
        dst = frozenset(dst_nodes) - src
        for n in src | dst:
            self.node(n)
        if not src or not dst:
            return float("inf")
        key = (src, dst)
        if key not in self._flow_cache:
            self._flow_cache[key] = self._max_flow(src, dst)
        return self._flow_cache[key]

    def _max_flow(self, src: frozenset[str], dst: frozenset[str]) -> float:
        flow_graph = nx.DiGraph()
        for a, b, data in self._carrying_edges(src | dst):
            flow_graph.add_edge(a, b, capacity=data["capacity"])
            flow_graph.add_edge(b, a, capacity=data["capacity"])
        for n in src:
            flow_graph.add_edge("__source__", n)  # no capacity attribute = unbounded
        for n in dst:
            flow_graph.add_edge(n, "__sink__")
        value, _ = nx.maximum_flow(flow_graph, "__source__", "__sink__")
        return float(value)

    def _carrying_edges(self, terminals: frozenset[str]) -> list[tuple[str, str, dict]]:
        """The edges that can carry flow between ``terminals``: a vertex that is no terminal and has
        one neighbour left carries none (what enters must leave by the same edge), so such vertices
        are peeled off until none is left. Exact for any graph; on a fleet of thousands of nodes
        under a few switches it leaves the switches and the terminals, and the max flow takes
        milliseconds instead of a tenth of a second."""
        adjacent = {v: set(self.graph[v]) for v in self.graph}
        peel = [v for v, near in adjacent.items() if len(near) <= 1 and v not in terminals]
        while peel:
            v = peel.pop()
            for u in adjacent.pop(v, ()):
                adjacent[u].discard(v)
                if len(adjacent[u]) == 1 and u not in terminals:
                    peel.append(u)
        return [(a, b, d) for a, b, d in self.graph.edges(data=True) if a in adjacent and b in adjacent]

    def latency_s(self, src_nodes: Iterable[str], dst_nodes: Iterable[str]) -> float:
        """Largest path latency between any source and any destination (seconds)."""
        src_clusters = {self.node(n).cluster for n in src_nodes}
        dst_clusters = {self.node(n).cluster for n in dst_nodes}
        worst = 0.0
        for a in src_clusters:
            for b in dst_clusters:
                if a == b:
                    continue
                try:
                    ms = nx.shortest_path_length(self.graph, switch_of(a), switch_of(b), weight="latency_ms")
                except nx.NetworkXNoPath:
                    continue
                worst = max(worst, ms / 1000.0)
        return worst

    def sync_time_s(self, weight_bytes: float, train_gpus: Iterable[str], rollout_gpus: Iterable[str],
                    model: str = "two_stage", rollout_tp: int = 1) -> float:
        """Weight-sync time of ``weight_bytes`` from the training GPUs to the rollout GPUs.

        ``two_stage`` (Weave): the trainers send disjoint shards over parallel streams, so exactly one
        model copy crosses the bottleneck between the two node sets; then the receiving nodes
        all-gather it over their fabric (ring: (k-1)/k of a copy per node) and broadcast it to their
        GPUs over NVLink.
        ``flat`` (veRL's AllGather): every rollout replica (``rollout_tp`` GPUs) pulls a full copy,
        so ``replicas`` copies share the bottleneck.
        """
        return sync_time_s(self, weight_bytes, list(train_gpus), list(rollout_gpus), model, rollout_tp)

    def warm_switch_s(self, bytes_per_gpu: float, node_id: str) -> float:
        """Time to load one GPU's share of a job's state from host memory (bytes / host<->GPU bandwidth)."""
        return bytes_per_gpu * 8 / (self.node(node_id).pcie_gbps * 1e9)


# ----- loading ------------------------------------------------------------------------------
def load_topology(source: str | Path) -> Topology:
    """A preset name (``weave-testbed``, ``a100-32``, ``local``, or ``<preset>-x<N>`` for N times its
    nodes) or a topology YAML file."""
    text = str(source)
    spec = preset_spec(text)
    if spec is not None:
        return Topology(spec, source=f"preset {text}")
    path = Path(text)
    if not path.exists() and path.suffix not in (".yaml", ".yml") and "/" not in text:
        raise InputError(text, None, f"unknown topology preset (presets: {', '.join(PRESETS)}, "
                         "or <preset>-x<N>) and no such file")
    data = load_yaml_file(path)
    return topology_from_data(data, str(path))


def topology_from_data(data: object, source: str = "<topology>") -> Topology:
    if not isinstance(data, Mapping):
        raise InputError(source, None, "expected a mapping with keys name, clusters, links"
                         + (" (the file is empty)" if data is None else f" (got {type(data).__name__})"))
    try:
        spec = TopologySpec.model_validate(data)
    except ValidationError as exc:
        # Every problem of the file: the schema's, and the references that can still be checked.
        problems = Problems(source)
        problems.extend(validation_problems(source, exc))
        raw_types = data.get("gpu_types")
        known = {**BUILTIN_GPU_TYPES, **(raw_types if isinstance(raw_types, Mapping) else {})}
        for key, reason in _reference_problems(data, known):
            problems.add(key, reason)
        problems.raise_if_any()
        raise
    return Topology(spec, source=source)


def _reference_problems(data: Mapping, gpu_types: Mapping) -> list[tuple[str, str]]:
    """(key, reason) for unknown GPU types, repeated cluster names and links to unknown clusters, read
    from the raw (possibly otherwise invalid) topology data."""
    out: list[tuple[str, str]] = []
    clusters = data.get("clusters")
    clusters = clusters if isinstance(clusters, list) else []
    names: dict[str, int] = {}
    for i, cluster in enumerate(clusters):
        if not isinstance(cluster, Mapping):
            continue
        gpu_type = cluster.get("gpu_type")
        if isinstance(gpu_type, str) and gpu_type and gpu_type not in gpu_types:
            out.append((f"clusters[{i}].gpu_type",
                        f"unknown GPU type {gpu_type!r} (known: {', '.join(sorted(map(str, gpu_types)))})"))
        name = cluster.get("name")
        if isinstance(name, str):
            if name in names:
                out.append((f"clusters[{i}].name", f"duplicate cluster name {name!r} (also clusters[{names[name]}])"))
            names.setdefault(name, i)
    links = data.get("links")
    for i, link in enumerate(links if isinstance(links, list) else []):
        between = link.get("between") if isinstance(link, Mapping) else None
        if not isinstance(between, (list, tuple)):
            continue
        for k, end in enumerate(between):
            if isinstance(end, str) and names and end not in names:
                out.append((f"links[{i}].between[{k}]", f"unknown cluster {end!r} (clusters: {', '.join(names)})"))
    return out


def _disconnected(names: list[str], links: list) -> list[tuple[str, str]]:
    """Clusters no chain of links joins: a weight sync between them would have no path, so a
    disaggregated job could never span them (one problem per cluster cut off from the first)."""
    if len(names) < 2:
        return []
    graph = nx.Graph()
    graph.add_nodes_from(names)
    for link in links:
        between = link.get("between") if isinstance(link, Mapping) else None
        if isinstance(between, (list, tuple)) and len(between) == 2 and all(e in graph for e in between):
            graph.add_edge(*between)
    reachable = nx.node_connected_component(graph, names[0])
    return [("links", f"no link path between clusters {names[0]!r} and {name!r}: add "
             f"{{between: [{names[0]}, {name}], gbps: ...}} (or a chain of links)")
            for name in names if name not in reachable]


def topology_to_data(topology: Topology) -> dict:
    return topology.spec.model_dump(mode="json", exclude_defaults=False)
