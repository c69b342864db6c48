"""``weave_rl.planner.export``: every target's output checked field by field against committed example plans
(``tests/example_plans.py``), with hand-checked values on micro-a, micro-c and the seed plan."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from weave_rl.planner.export import ExportOptions, export_data, export_plan
from weave_rl.planner.export.k8s_schema import manifest_problems
from weave_rl.planner.export.layout import global_ranks, rank_offsets
from weave_rl.planner.plan import load_plan, plan_from_data
from weave_rl.topology.topology import load_topology, node_of
from weave_rl.core.errors import InputError

from example_plans import EXAMPLES, PLANS  # tests/ is on sys.path under pytest

ROOT = Path(__file__).resolve().parent.parent


def example(name):
    topology, _ = EXAMPLES[name]
    return load_plan(PLANS / name), load_topology(str(topology))


def data(name, target):
    plan, topo = example(name)
    warnings = []
    out = export_data(plan, topo, target, ExportOptions(plan_name=Path(name).stem), warnings)
    return out, warnings


def gpus_of(job, phase):
    return list(job.phase(phase).gpus)


def ranks_of(mapping: str) -> list[int]:
    if mapping.startswith("list(range("):
        a, b = mapping.removeprefix("list(range(").removesuffix("))").split(",")
        return list(range(int(a), int(b)))
    return json.loads(mapping)


# ----- hand-checked values ----------------------------------------------------------------------
def test_rank_order_is_topology_nodes_times_gpu_index():
    _, topo = example("micro-c.yaml")  # clusters rollout (2 x 8), train (2 x 8)
    assert rank_offsets(topo) == {"rollout-000": 0, "rollout-001": 8, "train-000": 16, "train-001": 24}
    assert global_ranks(topo, ["train-001:3", "rollout-001:0"]) == [8, 27]


def test_roll_micro_a_and_micro_c():
    out, warnings = data("micro-a.yaml", "roll")
    a1 = out["A1.roll.yaml"]
    assert a1["num_gpus_per_node"] == 8
    assert a1["actor_infer"] == {"device_mapping": "list(range(0,8))"}  # rollout-000:0..7
    assert a1["actor_train"] == {"device_mapping": "list(range(8,16))"}  # train-000:0..7
    assert a1["reference"] == a1["actor_train"]
    assert a1["weave_placement"]["node_first_rank"] == {"rollout-000": 0, "train-000": 8}
    assert warnings == []
    out, _ = data("micro-c.yaml", "roll")
    assert out["C1.roll.yaml"]["actor_infer"]["device_mapping"] == "list(range(0,16))"
    assert out["C1.roll.yaml"]["actor_train"]["device_mapping"] == "list(range(16,32))"
    assert out["D2.roll.yaml"]["actor_infer"]["device_mapping"] == "list(range(8,16))"  # rollout-001


def test_verl_micro_a_split_pools_and_seed_hybrid_engine():
    out, warnings = data("micro-a.yaml", "verl")
    a1 = out["A1.verl.yaml"]
    assert a1["trainer"] == {"nnodes": 1, "n_gpus_per_node": 8}
    assert a1["rollout"] == {"nnodes": 1, "n_gpus_per_node": 8}
    assert a1["actor_rollout_ref"] == {"hybrid_engine": False}
    wp = a1["weave_placement"]
    assert wp["resource_pool_spec"] == {"trainer_pool": [8], "rollout_pool": [8]}
    assert wp["mapping"]["Rollout"] == "rollout_pool" and wp["mapping"]["Actor"] == "trainer_pool"
    assert wp["nodes"] == {"trainer_pool": ["train-000"], "rollout_pool": ["rollout-000"]}
    assert wp["cuda_visible_devices"]["rollout_pool"] == {"rollout-000": "0,1,2,3,4,5,6,7"}
    assert (wp["group"], wp["job"]) == ("g0", "A1") and warnings == []
    out, _ = data("seed-a100-32.yaml", "verl")  # rollout and train on the same 32 A100
    seed = out["seed-0.verl.yaml"]
    assert seed["trainer"] == {"nnodes": 4, "n_gpus_per_node": 8}
    assert "rollout" not in seed and seed["actor_rollout_ref"] == {"hybrid_engine": True}
    assert seed["weave_placement"]["resource_pool_spec"] == {"global_pool": [8, 8, 8, 8]}
    assert seed["weave_placement"]["mapping"]["ActorRollout"] == "global_pool"


def test_k8s_micro_c_one_deployment_per_pool():
    out, _ = data("micro-c.yaml", "k8s")
    docs = out["g0.k8s.yaml"]
    assert [d["metadata"]["name"] for d in docs] == ["weave-micro-c-g0-rollout", "weave-micro-c-g0-train"]
    rollout, train = docs
    assert rollout["spec"]["replicas"] == 2
    pod = rollout["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "rollout"}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                            "values": ["rollout-000", "rollout-001"]}]}]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == rollout["spec"]["selector"]["matchLabels"]
    # quantities as strings: the Kubernetes Python client's V1ResourceRequirements takes dict(str, str)
    assert pod["containers"][0]["resources"] == {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}
    labels = rollout["metadata"]["labels"]
    assert labels["weave.io/group"] == "g0" and labels["weave.io/pool"] == "rollout"
    assert labels["weave.io/role"] == "rollout"
    assert {k: v for k, v in labels.items() if k.startswith("job.")} == {
        "job.weave.io/C1": "rollout", "job.weave.io/D1": "rollout", "job.weave.io/D2": "rollout"}
    assert train["metadata"]["labels"]["weave.io/role"] == "train"
    assert train["metadata"]["annotations"]["weave.io/nodes"] == "train-000,train-001"
    out, _ = data("seed-a100-32.yaml", "k8s")
    seed = out["g0.k8s.yaml"]
    assert len(seed) == 1 and seed[0]["metadata"]["labels"]["weave.io/role"] == "rollout-train"
    assert seed[0]["spec"]["replicas"] == 4


def test_ray_micro_a_bundles_and_time_sharing():
    out, _ = data("micro-a.yaml", "ray")
    a1 = out["A1.ray.json"]
    rollout, train = a1["placement_groups"]
    assert rollout["roles"] == ["rollout", "sync"] and train["roles"] == ["train"]
    assert rollout["bundles"] == [{"GPU": 8, "CPU": 8}] and rollout["strategy"] == "STRICT_PACK"
    assert rollout["bundle_label_selector"] == [{"weave.io/node": "rollout-000"}]
    assert rollout["bundle_gpu_ids"] == [[f"rollout-000:{i}" for i in range(8)]]
    assert train["bundle_nodes"] == ["train-000"] and train["cuda_visible_devices"] == ["0,1,2,3,4,5,6,7"]
    assert a1["time_shared_with"] == ["A2"]
    out, _ = data("micro-c.yaml", "ray")
    c1 = out["C1.ray.json"]["placement_groups"][0]
    assert c1["strategy"] == "STRICT_SPREAD" and c1["bundle_nodes"] == ["rollout-000", "rollout-001"]
    assert out["D2.ray.json"]["time_shared_with"] == ["C1", "D1"]  # train-000 is shared with both


# ----- every example plan, every target: the output says what the plan says --------------------
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_outputs_match_the_plan_field_by_field(name):
    plan, topo = example(name)
    offsets = rank_offsets(topo)
    rank_to_gpu = {offsets[n] + i: f"{n}:{i}" for n, node in topo.nodes.items() for i in range(node.gpus)}
    roll, _ = data(name, "roll")
    verl, _ = data(name, "verl")
    ray, _ = data(name, "ray")
    k8s, _ = data(name, "k8s")
    assert sorted(k8s) == sorted(f"{g.name}.k8s.yaml" for g in plan.groups)
    for group in plan.groups:
        docs = k8s[f"{group.name}.k8s.yaml"]
        pinned = [n for d in docs for n in d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]]
        assert sorted(pinned) == sorted(group.nodes)  # every node of the group, once
        for d in docs:
            assert manifest_problems(d) == []
            assert d["spec"]["replicas"] == len(d["metadata"]["annotations"]["weave.io/nodes"].split(","))
            gpus = d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
            assert gpus == str(topo.nodes[pinned[0]].gpus)
        for job in group.jobs:
            r = roll[f"{job.name}.roll.yaml"]
            assert sorted(rank_to_gpu[k] for k in ranks_of(r["actor_infer"]["device_mapping"])) == sorted(gpus_of(job, "rollout"))
            assert sorted(rank_to_gpu[k] for k in ranks_of(r["actor_train"]["device_mapping"])) == sorted(gpus_of(job, "train"))
            v = verl[f"{job.name}.verl.yaml"]["weave_placement"]
            spec, nodes = v["resource_pool_spec"], v["nodes"]
            train_pool = "global_pool" if "global_pool" in spec else "trainer_pool"
            assert sum(spec[train_pool]) == len(gpus_of(job, "train"))
            assert nodes[train_pool] == sorted({node_of(g) for g in gpus_of(job, "train")}, key=list(topo.nodes).index)
            if "rollout_pool" in spec:
                assert sum(spec["rollout_pool"]) == len(gpus_of(job, "rollout"))
            pgs = ray[f"{job.name}.ray.json"]["placement_groups"]
            by_role = {role: pg for pg in pgs for role in pg["roles"]}
            for phase in ("rollout", "train", "sync"):
                pg = by_role[phase]
                assert sorted(g for b in pg["bundle_gpu_ids"] for g in b) == sorted(gpus_of(job, phase))
                assert [b["GPU"] for b in pg["bundles"]] == [len(b) for b in pg["bundle_gpu_ids"]]


# ----- hand-made plans: awkward placements ------------------------------------------------------
def odd_plan(rollout, train):
    def phase(name, start, gpus):
        return {"phase": name, "start_s": start, "duration_s": 10.0, "gpus": gpus}
    return plan_from_data({
        "policy": "optimal", "topology": "micro-c", "cost_usd_per_hour": 1.0,
        "solver": {"name": "cpsat", "status": "OPTIMAL"},
        "groups": [{"name": "g0", "cycle_s": 40.0, "nodes": ["rollout-000", "rollout-001", "train-000"],
                    "jobs": [{"name": "X", "solo_iteration_s": 30.0, "iteration_s": 40.0,
                              "phases": [phase("rollout", 0, rollout), phase("train", 10, train),
                                         phase("sync", 20, rollout)]}]}]})


def test_uneven_and_scattered_gpus_warn():
    _, topo = example("micro-c.yaml")
    rollout = [f"rollout-000:{i}" for i in (0, 1, 2, 3)] + [f"rollout-001:{i}" for i in range(8)]
    plan = odd_plan(rollout, [f"train-000:{i}" for i in range(8)])
    warnings = []
    verl = export_data(plan, topo, "verl", ExportOptions(plan_name="odd"), warnings)["X.verl.yaml"]
    assert "rollout" not in verl  # 4 + 8 GPUs: no nnodes x n_gpus_per_node
    assert verl["trainer"] == {"nnodes": 1, "n_gpus_per_node": 8}
    assert verl["weave_placement"]["resource_pool_spec"]["rollout_pool"] == [4, 8]
    assert verl["weave_placement"]["cuda_visible_devices"]["rollout_pool"]["rollout-000"] == "0,1,2,3"
    roll = export_data(plan, topo, "roll", ExportOptions(plan_name="odd"), warnings)["X.roll.yaml"]
    assert roll["actor_infer"]["device_mapping"] == "[0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15]"
    assert any("4+8 GPUs" in w for w in warnings) and any("not contiguous" in w for w in warnings)


def test_partial_overlap_is_an_error_for_verl_only():
    _, topo = example("micro-c.yaml")
    plan = odd_plan([f"rollout-000:{i}" for i in range(8)], [f"rollout-000:{i}" for i in range(4)])
    with pytest.raises(InputError, match="overlap in part"):
        export_data(plan, topo, "verl")
    assert export_data(plan, topo, "ray")["X.ray.json"]["placement_groups"][1]["bundles"] == [{"GPU": 4, "CPU": 4}]


def test_gpu_outside_the_topology_is_an_error():
    _, topo = example("micro-a.yaml")  # one node per cluster
    plan = odd_plan(["rollout-001:0"], ["train-000:0"])
    with pytest.raises(InputError, match=r"groups\[0\].jobs\[0\].phases\[0\].gpus: GPU 'rollout-001:0' is not in"):
        export_data(plan, topo, "roll", ExportOptions(source="odd.yaml"))


# ----- files and the command line ---------------------------------------------------------------
def test_written_files_read_back(tmp_path):
    plan, topo = example("micro-a.yaml")
    for target in ("verl", "roll", "k8s", "ray"):
        result = export_plan(plan, topo, target, tmp_path / target, ExportOptions(plan_name="micro-a"))
        assert result.warnings == []
    assert sorted(p.name for p in (tmp_path / "verl").iterdir()) == ["A1.verl.yaml", "A2.verl.yaml"]
    assert yaml.safe_load((tmp_path / "roll" / "A2.roll.yaml").read_text())["actor_infer"]["device_mapping"] == \
        "list(range(0,8))"
    k8s_text = (tmp_path / "k8s" / "g0.k8s.yaml").read_text()
    assert "&id" not in k8s_text  # no YAML aliases in manifests
    assert [d["kind"] for d in yaml.safe_load_all(k8s_text)] == ["Deployment", "Deployment"]
    assert json.loads((tmp_path / "ray" / "A1.ray.json").read_text())["job"] == "A1"


def weave(*args):
    return subprocess.run([sys.executable, "-m", "weave_rl.cli.app", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_cli_export_and_its_errors(tmp_path):
    plan, topo_file = str(PLANS / "micro-a.yaml"), str(EXAMPLES["micro-a.yaml"][0])
    proc = weave("plan", "export", plan, "--to", "roll", "-o", str(tmp_path), "-t", topo_file)
    assert proc.returncode == 0, proc.stderr
    assert "A1.roll.yaml" in proc.stdout and (tmp_path / "A2.roll.yaml").exists()
    proc = weave("plan", "export", str(PLANS / "seed-a100-32.yaml"), "--to", "k8s", "-o", str(tmp_path / "k"))
    assert proc.returncode == 0, proc.stderr  # the plan's topology a100-32 is a preset
    cases = [
        (["--to", "slurm", "-o", str(tmp_path), "-t", topo_file], "--to: unknown target 'slurm'"),
        (["--to", "roll", "-o", str(tmp_path)], "micro-a.yaml: topology: cannot load the plan's topology 'micro-a'"),
    ]
    for args, expected in cases:
        proc = weave("plan", "export", plan, *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert expected in proc.stderr.replace("\n", ""), proc.stderr
    proc = weave("plan", "export", str(tmp_path / "none.yaml"), "--to", "ray", "-o", str(tmp_path))
    assert proc.returncode == 2 and "none.yaml: file not found" in proc.stderr
