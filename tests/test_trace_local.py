"""Trace mode on real workers: the same ``run_trace`` as ``weave simulate --trace``, on the local
backend in real seconds. Jobs arrive, the online planner admits them, workers start for the GPUs
their plan uses, each job runs its iterations and leaves (its GPUs released)."""

from __future__ import annotations

import os

import pytest
import torch

from weave_rl.executor.config import ElasticRules
from weave_rl.executor.local.backend import LocalBackend
from weave_rl.executor.trace import run_trace
from weave_rl.planner.online import OnlinePlanner
from weave_rl.profiles.jobs import JobSet, jobs_from_data
from weave_rl.topology.topology import load_topology

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 and not torch.cuda.is_available(),
                                reason="the local topology needs two devices")


# Two one-GPU nodes: the online planner gives A a train node and a rollout node, and B, arriving while
# A is live, joins A's group on them (co-scheduled round-robin). B arrives 0.5 s in and A has 30
# iterations, so A is still live then on any machine: its workers alone take longer than 0.5 s to
# start (spawn and import torch), and a fast machine once ran all of a 3-iteration A before a 1.5 s
# arrival, so B found the nodes free and opened its own group.
TOPOLOGY = """name: duo1
clusters:
  - {name: local, gpu_type: CPU, nodes: 2, gpus_per_node: 1, host_mem_gb: 16}
"""


def test_a_trace_runs_on_local_workers(tmp_path):
    (tmp_path / "duo1.yaml").write_text(TOPOLOGY)
    topo = load_topology(tmp_path / "duo1.yaml")
    gpu_type = "CPU"
    block = {"kind": "bandit", "batch": 16, "hidden": 32, "steps": 50}
    data = {"jobs": [{"name": name, "params_b": 0.0001, "slo": 3.0, "iterations": iterations, "arrival_s": arrival,
                      "rollout": {"gpus": 1, "gpu_type": gpu_type, "duration_s": 0.2, "host_mem_gb": 0.1},
                      "train": {"gpus": 1, "gpu_type": gpu_type, "duration_s": 0.2, "host_mem_gb": 0.1},
                      "workload": block} for name, arrival, iterations in (("A", 0.0, 30), ("B", 0.5, 3))]}
    jobs = jobs_from_data(data, "<test jobs>", topo.gpu_types)
    backend = LocalBackend(topo, jobs, {}, tmp_path / "run")  # no worker until a plan uses its GPU
    result = run_trace(topo, jobs, OnlinePlanner(topo, JobSet()), rules=ElasticRules.off(), backend=backend)
    records = result.records
    assert sorted({(r["job"], r["iteration"], r["phase"]) for r in records}) == sorted(
        (j, k, p) for j, n in (("A", 30), ("B", 3)) for k in range(n) for p in ("rollout", "train", "sync"))
    assert len(records) == 3 * 33
    log = result.extra["trace"]
    assert [a["job"] for a in log.admitted] == ["A", "B"]
    admitted = {a["job"]: a for a in log.admitted}
    last_a = max(r["end_s"] for r in records if r["job"] == "A")
    assert last_a > admitted["B"]["t"] >= 0.5  # B arrived 0.5 s into the run (real seconds), A still live
    assert admitted["B"]["group"] == admitted["A"]["group"]
    first_b = min(r["start_s"] for r in records if r["job"] == "B")
    assert first_b >= 0.5
    assert all(st.finished for st in result.controller.state.values())
    started = [e for e in backend.events if e["event"] == "worker_started"]
    assert sorted(e["gpu"] for e in started) == ["local-000:0", "local-001:0"]  # started when A was placed
    rows = [backend.job_rows[k] for k in sorted(backend.job_rows)]
    assert [(r["job"], r["ledger"], r["ledger_unique"]) for r in rows] == [
        (j, 16 * (k + 1), 16 * (k + 1)) for j, n in (("A", 30), ("B", 3)) for k in range(n)]
