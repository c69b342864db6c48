"""The optimal planner's group model on one-cluster and two-cluster topologies: rejections name
their real reason, and a plan that places fewer jobs says so."""

from __future__ import annotations

import pytest

from weave_rl.planner.api import make_plan
from weave_rl.planner.check import check_plan
from weave_rl.profiles.jobs import jobs_from_data
from weave_rl.topology.topology import topology_from_data

# The ``local`` preset's shape on a machine with two devices: one node, 2 GPUs (fixed here, since
# the preset itself follows the machine it runs on).
LOCAL2 = topology_from_data({"name": "local2", "clusters": [
    {"name": "local", "gpu_type": "A100", "nodes": 1, "gpus_per_node": 2, "host_mem_gb": 64}]}, "local2.yaml")


def small_job(name, rollout, train, slo, gpus=1, gpu_type="A100", mem=4.0):
    return {"name": name, "params_b": 1, "slo": slo,
            "rollout": {"gpus": gpus, "gpu_type": gpu_type, "duration_s": rollout, "host_mem_gb": mem},
            "train": {"gpus": gpus, "gpu_type": gpu_type, "duration_s": train, "host_mem_gb": mem}}


def planned(topo, jobs_list, **kw):
    jobs = jobs_from_data({"jobs": jobs_list}, "jobs.yaml")
    plan = make_plan(topo, jobs, time_limit_s=kw.pop("time_limit_s", 5), **kw)
    assert not check_plan(plan, topo, jobs)
    return plan, jobs


def test_a_job_that_can_only_share_is_rejected_for_the_slo_it_would_break():
    # A alone holds the only node (rollout 60 s on GPU 0, train 40 s on GPU 1: a 100.005 s loop).
    # B could only join A's group, whose cycle is at least A's own loop: above B's cap
    # 1.2 x solo 80.005 s = 96.006 s.
    plan, _ = planned(LOCAL2, [small_job("A", 60, 40, 2.0), small_job("B", 50, 30, 1.2)])
    assert [j.name for g in plan.groups for j in g.jobs] == ["A"]
    (rejection,) = plan.rejected
    assert rejection.name == "B"
    reason = rejection.reason
    assert "no room" not in reason
    assert "does not fit alone on the nodes the plan leaves free" in reason
    assert "1 x A100 node in cluster local, 0 free" in reason
    assert "breaks an SLO" in reason and "g0 with A" in reason
    assert "at least 100.0 s (A's own loop)" in reason
    assert "B's cap 1.2 x solo 80.0 s = 96.0 s" in reason
    assert "1 of 2 jobs placed" in plan.solver.note


def test_a_job_the_empty_topology_cannot_host_says_so():
    # 2 + 2 GPUs apart need 4 GPUs of a 2-GPU node; colocated on 2 GPUs both warm switches stretch
    # the cycle past solo, and SLO 1.0 allows no slowdown.
    plan, _ = planned(LOCAL2, [small_job("wide", 60, 40, 1.0, gpus=2)])
    assert not plan.groups
    reason = plan.rejected[0].reason
    assert reason.startswith("the topology cannot host it even empty")
    assert "needs 4 A100 GPUs in cluster local, which has 2" in reason
    assert "colocated on the same 2 A100 GPUs: its cycle is" in reason and "above its cap 1 x solo" in reason
    assert plan.solver.note.startswith("no job placed")
    assert plan.cost_usd_per_hour == 0

