"""Export gaps of issue 24: Kubernetes quantities as strings, the veRL and ROLL file headers (which
keys the framework reads, which are the operator's, how ROLL ranks map to nodes), ROLL's whole-node
reservation warning, and a plan that records where its topology came from (``topology_source``) so
``plan export``, ``simulate`` and ``run`` need no ``--topology``."""

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from weave_rl.planner.export import ExportOptions, export_data, export_plan
from weave_rl.planner.plan import load_plan, plan_from_data, plan_topology_ref, topology_source_for
from weave_rl.topology.topology import load_topology

ROOT = Path(__file__).resolve().parent.parent
INPUTS = ROOT / "plans" / "inputs"


def weave(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "weave_rl.cli.app", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def one_job_plan(rollout, train):
    def phase(name, start, gpus):
        return {"phase": name, "start_s": start, "duration_s": 10.0, "gpus": gpus}
    return plan_from_data({
        "policy": "optimal", "topology": "micro-c", "cost_usd_per_hour": 1.0,
        "solver": {"name": "cpsat", "status": "OPTIMAL"},
        "groups": [{"name": "g0", "cycle_s": 40.0, "nodes": ["rollout-000", "train-000"],
                    "jobs": [{"name": "X", "solo_iteration_s": 30.0, "iteration_s": 40.0,
                              "phases": [phase("rollout", 0, rollout), phase("train", 10, train),
                                         phase("sync", 20, rollout)]}]}]})


MICRO_C = load_topology(str(INPUTS / "micro-c.topology.yaml"))  # rollout 2 x 8, train 2 x 8


def test_k8s_gpu_quantities_are_strings():
    plan = one_job_plan([f"rollout-000:{i}" for i in range(8)], [f"train-000:{i}" for i in range(8)])
    docs = export_data(plan, MICRO_C, "k8s")["g0.k8s.yaml"]
    for doc in docs:
        resources = doc["spec"]["template"]["spec"]["containers"][0]["resources"]
        assert resources == {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}


def test_verl_file_header_names_the_keys_verl_reads_and_the_operators(tmp_path):
    plan = one_job_plan([f"rollout-000:{i}" for i in range(8)], [f"train-000:{i}" for i in range(8)])
    export_plan(plan, MICRO_C, "verl", tmp_path, ExportOptions(plan_name="p"))
    text = (tmp_path / "X.verl.yaml").read_text()
    head = [line for line in text.splitlines() if line.startswith("#")]
    assert head[1] == "# Keys veRL reads (Hydra overrides of ppo_trainer.yaml or fully_async_ppo_trainer.yaml):"
    assert head[2] == ("#   trainer.nnodes=1 trainer.n_gpus_per_node=8 rollout.nnodes=1 rollout.n_gpus_per_node=8 "
                       "actor_rollout_ref.hybrid_engine=false")
    assert "weave_placement" in head[3] and "rejects unknown keys" in head[4]
    data = yaml.safe_load(text)
    del data["weave_placement"]  # what the header says to do: the rest is exactly the overrides listed
    flat = [f"{s}.{k}={str(v).lower()}" for s, body in data.items() for k, v in body.items()]
    assert " ".join(flat) == head[2].removeprefix("#   ")


def test_roll_header_maps_ranks_to_nodes_and_warns_on_partial_nodes(tmp_path):
    plan = one_job_plan([f"rollout-000:{i}" for i in range(4)], [f"train-000:{i}" for i in range(8)])
    result = export_plan(plan, MICRO_C, "roll", tmp_path, ExportOptions(plan_name="p"))
    # rollout-000 holds ranks 0-7 (ROLL node 0), train-000 ranks 16-23 (ROLL node 2); the job has 4 of node 0
    assert result.warnings == ["ROLL: job X holds 4 of node rollout-000's 8 GPUs (ranks 0-3); ROLL reserves whole "
                               "nodes (node rank = rank // num_gpus_per_node), so it would claim all 8, 4 beyond "
                               "what the plan holds"]
    head = [line for line in (tmp_path / "X.roll.yaml").read_text().splitlines() if line.startswith("#")]
    assert head[-3:] == ["# Ranks -> nodes: ROLL node rank = rank // num_gpus_per_node (8); in topology order:",
                         "#   ranks 0-7 -> rollout-000 (ROLL node 0)", "#   ranks 16-23 -> train-000 (ROLL node 2)"]
    whole = one_job_plan([f"rollout-000:{i}" for i in range(8)], [f"train-000:{i}" for i in range(8)])
    assert export_plan(whole, MICRO_C, "roll", tmp_path / "w", ExportOptions(plan_name="p")).warnings == []


def test_topology_source_is_relative_to_the_plan_file(tmp_path):
    topo = tmp_path / "inputs" / "t.yaml"
    topo.parent.mkdir()
    shutil.copy(INPUTS / "micro-a.topology.yaml", topo)
    (tmp_path / "plans").mkdir()
    assert topology_source_for(str(topo), tmp_path / "plans" / "p.yaml") == "../inputs/t.yaml"
    assert topology_source_for("a100-32", tmp_path / "p.yaml") == "a100-32"  # a preset stays a name


def test_plan_records_its_topology_and_export_and_simulate_find_it(tmp_path):
    work = tmp_path / "w"
    (work / "inputs").mkdir(parents=True)
    for name in ("micro-a.topology.yaml", "micro-a.jobs.yaml"):
        shutil.copy(INPUTS / name, work / "inputs" / name)
    proc = weave("plan", "-t", "inputs/micro-a.topology.yaml", "-j", "inputs/micro-a.jobs.yaml",
                 "-o", "plans/a.yaml", "--time-limit", "20", cwd=work)
    assert proc.returncode == 0, proc.stderr
    plan = load_plan(work / "plans" / "a.yaml")
    assert plan.topology == "micro-a" and plan.topology_source == "../inputs/micro-a.topology.yaml"
    # from another working directory, with no --topology
    proc = weave("plan", "export", str(work / "plans" / "a.yaml"), "--to", "k8s", "-o", str(tmp_path / "k8s"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "k8s").iterdir()) == [f"{g.name}.k8s.yaml" for g in plan.groups]
    proc = weave("simulate", str(work / "plans" / "a.yaml"), "--jobs", str(work / "inputs" / "micro-a.jobs.yaml"),
                 "--iterations", "2", "--no-plots", "--out", str(tmp_path / "sim"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "sim" / "metrics.json").exists()
    from weave_rl.executor.inputs import load_run_inputs  # what weave run loads, without --topology

    _, topo, _ = load_run_inputs(work / "plans" / "a.yaml", work / "inputs" / "micro-a.jobs.yaml", None, check=False)
    assert topo.name == "micro-a"
    # the online planner's new plan (here: another folder) records the topology relative to itself
    proc = weave("plan", "replan", "plans/a.yaml", "-j", "inputs/micro-a.jobs.yaml", "-o", "later/x/b.yaml",
                 "--time-limit", "20", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert load_plan(work / "later" / "x" / "b.yaml").topology_source == "../../inputs/micro-a.topology.yaml"
    proc = weave("plan", "export", str(work / "later" / "x" / "b.yaml"), "--to", "roll", "-o", str(tmp_path / "roll"))
    assert proc.returncode == 0, proc.stderr
    # the recorded file gone: one line naming the key, exit 2
    (work / "inputs" / "micro-a.topology.yaml").unlink()
    proc = weave("plan", "export", str(work / "plans" / "a.yaml"), "--to", "ray", "-o", str(tmp_path / "ray"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "a.yaml: topology_source: cannot load the plan's topology" in proc.stderr.replace("\n", "")


def test_plans_without_a_source_keep_their_meaning():
    plan = load_plan(ROOT / "plans" / "seed-a100-32.yaml")  # written before topology_source existed
    assert plan.topology_source is None
    assert plan_topology_ref(plan, ROOT / "plans" / "seed-a100-32.yaml") == "a100-32"  # a preset
    assert plan_topology_ref(load_plan(ROOT / "plans" / "micro-a.yaml"), "x.yaml") is None  # a file it never named
