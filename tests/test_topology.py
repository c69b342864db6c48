"""Topology presets, graph queries and the sync-time model, against hand-computed values."""

import pytest

from weave_rl.topology.catalog import BUILTIN_GPU_TYPES
from weave_rl.topology.topology import load_topology, node_of, topology_from_data
from weave_rl.core.errors import InputError

GB = 1e9


def gpus(node: str, n: int = 8) -> list[str]:
    return [f"{node}:{i}" for i in range(n)]


def test_weave_testbed_counts_and_cost():
    topo = load_topology("weave-testbed")
    assert topo.total_gpus == 656
    assert len(topo.gpus_in(cluster="rollout")) == 328
    assert len(topo.gpus_in(gpu_type="H800")) == 328
    assert len(topo.nodes_in(cluster="train")) == 41
    # 328 x 1.85 + 328 x 5.28 = 606.80 + 1731.84
    assert topo.cost_usd_per_hour() == pytest.approx(2338.64)
    assert topo.nodes["rollout-040"].host_mem_gb == 2048
    assert "rollout-041" not in topo.nodes
    assert topo.gpus_in(cluster="train")[9] == "train-001:1"


def test_a100_32_and_local_presets():
    a100 = load_topology("a100-32")
    assert a100.total_gpus == 32
    assert a100.cost_usd_per_hour() == pytest.approx(32 * BUILTIN_GPU_TYPES["A100"].usd_per_hour)
    local = load_topology("local")
    assert local.total_gpus >= 1
    assert list(local.nodes) == ["local-000"]


def test_catalog_has_paper_prices_and_all_types():
    for name in ("H20", "H800", "H100", "H200", "A100", "A800", "L40S"):
        assert name in BUILTIN_GPU_TYPES
    assert BUILTIN_GPU_TYPES["H20"].usd_per_hour == 1.85
    assert BUILTIN_GPU_TYPES["H800"].usd_per_hour == 5.28


def test_graph_shape():
    topo = load_topology("weave-testbed")
    g = topo.graph
    assert g.number_of_nodes() == 82 + 2
    assert g["switch:rollout"]["switch:train"]["capacity"] == 20
    assert g["rollout-007"]["switch:rollout"]["capacity"] == 400
    assert node_of("rollout-003:5") == "rollout-003"


def test_bottleneck_bandwidth_from_graph():
    topo = load_topology("weave-testbed")
    # Across clusters the 20 Gbit/s link is the bottleneck whatever the node counts.
    assert topo.bottleneck_gbps(["train-000", "train-001"], ["rollout-000"]) == pytest.approx(20)
    # Inside a cluster: limited by the senders' or receivers' fabric ports.
    assert topo.bottleneck_gbps(["train-000"], ["train-001", "train-002"]) == pytest.approx(400)
    assert topo.bottleneck_gbps(["train-000", "train-001"], ["train-002", "train-003"]) == pytest.approx(800)


def test_bottleneck_follows_a_custom_link():
    topo = topology_from_data({
        "name": "x",
        "clusters": [{"name": "a", "gpu_type": "H20", "nodes": 2}, {"name": "b", "gpu_type": "H800", "nodes": 2}],
        "links": [{"between": ["a", "b"], "gbps": 100}],
    })
    assert topo.bottleneck_gbps(["b-000", "b-001"], ["a-000", "a-001"]) == pytest.approx(100)


def test_bottleneck_around_a_ring_of_clusters_adds_both_ways_round():
    """Three clusters in a ring (a cycle, so no leaf peeling can cut it short): from a to b the flow
    takes the direct 100 Gbit/s link and the 30 Gbit/s detour through c (min(30, 50)); nodes of c
    that are neither sender nor receiver carry nothing, yet the detour through c's switch counts."""
    topo = topology_from_data({
        "name": "ring",
        "clusters": [{"name": "a", "gpu_type": "H20", "nodes": 3}, {"name": "b", "gpu_type": "H800", "nodes": 3},
                     {"name": "c", "gpu_type": "H800", "nodes": 3}],
        "links": [{"between": ["a", "b"], "gbps": 100}, {"between": ["a", "c"], "gbps": 30},
                  {"between": ["c", "b"], "gbps": 50}],
    })
    assert topo.bottleneck_gbps(["a-000", "a-001"], ["b-000", "b-001"]) == pytest.approx(130)
    # One sender: its own 400 Gbit/s port is no limit; a receiver in c adds c's fabric port.
    assert topo.bottleneck_gbps(["a-000"], ["b-000", "c-000"]) == pytest.approx(130)
    assert topo.bottleneck_gbps(["c-000"], ["c-001"]) == pytest.approx(400)


def test_sync_two_stage_vs_flat_hand_computed():
    topo = load_topology("weave-testbed")
    # 14 GB (7B in bf16) from 8 H800 to 8 H20 over the 20 Gbit/s link.
    # two_stage: one copy crosses: 14e9*8/20e9 = 5.6 s, + 1 ms latency, + NVLink broadcast 112/3600 s.
    t2 = topo.sync_time_s(14 * GB, gpus("train-000"), gpus("rollout-000"), "two_stage")
    assert t2 == pytest.approx(5.6 + 0.001 + 112 / 3600)
    # flat: 8 replicas each pull a full copy through the same link: 8 x 5.6 s + latency.
    tf = topo.sync_time_s(14 * GB, gpus("train-000"), gpus("rollout-000"), "flat")
    assert tf == pytest.approx(44.8 + 0.001)
    # flat with TP=2 replicas: 4 copies.
    assert topo.sync_time_s(14 * GB, gpus("train-000"), gpus("rollout-000"), "flat", rollout_tp=2) == pytest.approx(
        22.4 + 0.001)


def test_sync_two_stage_two_receiving_nodes():
    topo = load_topology("weave-testbed")
    train = gpus("train-000") + gpus("train-001")
    roll = gpus("rollout-000") + gpus("rollout-001")
    # cross 5.6 + 0.001, ring all-gather half a copy over 400 Gbit/s = 0.14, NVLink 112/3600.
    assert topo.sync_time_s(14 * GB, train, roll) == pytest.approx(5.601 + 0.14 + 112 / 3600)


def test_sync_inside_one_fabric_is_fast():
    topo = load_topology("a100-32")
    t = topo.sync_time_s(14 * GB, gpus("a100-000"), gpus("a100-001"))
    # 112 Gbit over the 200 Gbit/s fabric port + NVLink 112/4800; no latency inside a cluster.
    assert t == pytest.approx(112 / 200 + 112 / 4800)


def test_warm_switch_time():
    topo = load_topology("weave-testbed")
    # 32 GB per GPU over 256 Gbit/s PCIe = 1.0 s
    assert topo.warm_switch_s(32 * GB, "rollout-000") == pytest.approx(1.0)


@pytest.mark.parametrize("data, key, reason", [
    ({"name": "x", "clusters": [{"name": "a", "gpu_type": "H999", "nodes": 1}]}, "clusters[0].gpu_type",
     "unknown GPU type"),
    ({"name": "x", "clusters": [{"name": "a", "gpu_type": "H20", "nodes": 0}]}, "clusters[0].nodes", "greater than 0"),
    ({"name": "x", "clusters": [{"name": "a", "gpu_type": "H20", "nodes": 1, "colour": 3}]}, "clusters[0].colour",
     "unknown key"),
    ({"name": "x", "clusters": [{"name": "a", "gpu_type": "H20", "nodes": "many"}]}, "clusters[0].nodes",
     "integer"),
    ({"name": "x", "clusters": [{"name": "a", "gpu_type": "H20", "nodes": 1}],
      "links": [{"between": ["a", "zz"], "gbps": 10}]}, "links[0].between[1]", "unknown cluster"),
    ({"name": "x", "clusters": [{"name": "a", "gpu_type": "H20", "nodes": 1}],
      "gpu_types": {"X1": {"tflops_bf16": -1, "hbm_gb": 1, "hbm_tbps": 1, "usd_per_hour": 1}}},
     "gpu_types.X1.tflops_bf16", "greater than 0"),
])
def test_bad_topologies_name_key_and_reason(data, key, reason):
    with pytest.raises(InputError) as err:
        topology_from_data(data, "topo.yaml")
    text = str(err.value)
    assert text.startswith(f"topo.yaml: {key}: "), text
    assert reason in text


def test_file_overrides_and_adds_gpu_types(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        "name: mine\n"
        "gpu_types:\n  H20: {tflops_bf16: 148, hbm_gb: 96, hbm_tbps: 4.0, usd_per_hour: 1.0}\n"
        "  MI300X: {tflops_bf16: 1307, hbm_gb: 192, hbm_tbps: 5.3, usd_per_hour: 3.0}\n"
        "clusters:\n  - {name: r, gpu_type: H20, nodes: 2}\n  - {name: m, gpu_type: MI300X, nodes: 1}\n"
        "links:\n  - {between: [r, m], gbps: 100}\n"
    )
    topo = load_topology(path)
    assert topo.cost_usd_per_hour() == pytest.approx(16 * 1.0 + 8 * 3.0)


def test_clusters_no_link_joins_are_one_clear_error(tmp_path):
    """Without a link path a weight sync between the clusters has no route (the planner used to die
    with a ValueError traceback): the file is refused, naming the clusters cut off."""
    path = tmp_path / "t.yaml"
    path.write_text("name: cut\nclusters:\n  - {name: a, gpu_type: H20, nodes: 1}\n  - {name: b, gpu_type: H20, nodes: 1}\n"
                    "  - {name: c, gpu_type: H800, nodes: 1}\nlinks:\n  - {between: [a, b], gbps: 10}\n")
    with pytest.raises(InputError) as info:
        load_topology(path)
    assert str(info.value) == (f"{path}: links: no link path between clusters 'a' and 'c': add "
                               "{between: [a, c], gbps: ...} (or a chain of links)")


def test_missing_file_and_unknown_preset():
    with pytest.raises(InputError, match="nope.yaml: file not found"):
        load_topology("nope.yaml")
    with pytest.raises(InputError, match="unknown topology preset"):
        load_topology("weave-testbedd")
