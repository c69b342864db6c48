"""The exhaustive brute force (bench/bruteforce.py) on instances whose optimum is known by hand, and
against the ``optimal`` policy on small generated instances.

Prices on weave-testbed: a training node (8 H800) is 8 * 5.28 = 42.24 $/h, a rollout node (8 H20)
8 * 1.85 = 14.80 $/h, so one job alone costs 57.04 $/h.
"""

from __future__ import annotations

import pytest

from bench.bruteforce import BruteForceStats, brute_force_cost
from weave_rl.planner.api import make_plan
from weave_rl.planner.model import PlanningModel
from weave_rl.profiles.generators import generate
from weave_rl.profiles.jobs import jobs_from_data
from weave_rl.topology.topology import load_topology

from testbed import colocated_jobs  # tests/ is on sys.path under pytest

TRAIN, ROLLOUT = 8 * 5.28, 8 * 1.85
ALONE = TRAIN + ROLLOUT  # 57.04


def job(name: str, rollout_s: float, train_s: float, slo: float, params_b: float = 7,
        rollout_mem: float = 275.7, train_mem: float = 240.0) -> dict:
    return {"name": name, "params_b": params_b, "slo": slo,
            "rollout": {"gpus": 8, "gpu_type": "H20", "duration_s": rollout_s, "host_mem_gb": rollout_mem},
            "train": {"gpus": 8, "gpu_type": "H800", "duration_s": train_s, "host_mem_gb": train_mem}}


@pytest.fixture(scope="module")
def topo():
    return load_topology("weave-testbed")


def exhaustive(brute_force, topo, jobset, *, every_job: bool = True):
    """``brute_force(model, 5)`` on ``jobset`` (``brute_force_cost`` or ``brute_force_throughput``): its
    optimum and groups, checked to be exact (no timetable solve at its limit, none rejected) and, with
    ``every_job``, to place every job."""
    stats = BruteForceStats()
    best, groups = brute_force(PlanningModel(topo, jobset), 5, stats=stats)
    assert not stats.unknown and not stats.rejected
    if every_job:
        assert sorted(name for g in groups for cls in g for name in cls) == sorted(jobset.names)
    return best, groups


def solve(topo, *jobs: dict):
    jobset = jobs_from_data({"jobs": list(jobs)}, "jobs.yaml")
    stats = BruteForceStats()
    cost, groups = brute_force_cost(PlanningModel(topo, jobset), 5, stats=stats)
    assert not stats.unknown
    return cost, groups, jobset


def test_one_job_alone(topo):
    cost, groups, _ = solve(topo, job("A", 100, 60, 1.0))
    assert cost == pytest.approx(ALONE)
    assert groups == [[("A",)]]


def test_two_compatible_jobs_share_both_nodes(topo):
    # Rollouts 100 + 50 (+ switches) fit under B's cap 2 * (90 + sync); trains likewise.
    cost, groups, _ = solve(topo, job("A", 100, 60, 2.0), job("B", 50, 40, 2.0))
    assert cost == pytest.approx(ALONE)  # 57.04
    assert groups == [[("A", "B")]]


def test_two_incompatible_jobs_run_alone(topo):
    # SLO 1: a shared cycle would be at most B's solo time (~96 s) but A's own loop is ~166 s.
    cost, groups, _ = solve(topo, job("A", 100, 60, 1.0), job("B", 50, 40, 1.0))
    assert cost == pytest.approx(2 * ALONE)  # 114.08
    assert sorted(groups) == [[("A",)], [("B",)]]


def test_rollout_heavy_jobs_share_training_only(topo):
    # Two 200 s rollouts exceed the cap 1.2 * solo (~283 s) on one node; their 30 s trains share one.
    # C (SLO 1, solo ~96 s) cannot join anyone: every other job's own loop is longer than its cap.
    cost, groups, _ = solve(topo, job("R1", 200, 30, 1.2), job("R2", 200, 30, 1.2), job("C", 50, 40, 1.0))
    assert cost == pytest.approx(TRAIN + 2 * ROLLOUT + ALONE)  # 71.84 + 57.04 = 128.88
    assert sorted(groups) == [[("C",)], [("R1",), ("R2",)]]


@pytest.mark.parametrize("count, expected", [(3, TRAIN + 3 * ROLLOUT), (4, 2 * TRAIN + 4 * ROLLOUT)])
def test_host_memory_caps_the_training_group(topo, count, expected):
    # 32B jobs: 520.4 GB of train state each, so at most three share a 2048 GB training node.
    jobs = [job(f"J{i}", 200, 10, 1.5, params_b=32, rollout_mem=490.3, train_mem=520.4) for i in range(count)]
    cost, groups, _ = solve(topo, *jobs)
    assert cost == pytest.approx(expected)  # 86.64 for three, 143.68 for four
    assert max(sum(len(cls) for cls in g) for g in groups) <= 3


def test_hand_made_instances_agree_with_optimal(topo):
    instances = [
        [job("A", 100, 60, 2.0), job("B", 50, 40, 2.0)],
        [job("A", 100, 60, 1.0), job("B", 50, 40, 1.0)],
        [job("R1", 200, 30, 1.2), job("R2", 200, 30, 1.2), job("C", 50, 40, 1.0)],
        [job(f"J{i}", 200, 10, 1.5, params_b=32, rollout_mem=490.3, train_mem=520.4) for i in range(4)],
    ]
    for jobs in instances:
        cost, _, jobset = solve(topo, *jobs)
        plan = make_plan(topo, jobset, policy="optimal", threads=2, time_limit_s=60)
        assert_agrees(plan, cost)


@pytest.mark.parametrize("family, seed", [("BL", 0), ("Mixed", 1)])
def test_generated_instances_agree_with_optimal(topo, family, seed):
    jobset = generate(family, 6, seed)
    cost, _ = exhaustive(brute_force_cost, topo, jobset)
    plan = make_plan(topo, jobset, policy="optimal", threads=2, time_limit_s=60)
    assert_agrees(plan, cost)


def assert_agrees(plan, cost: float) -> None:
    """The optimal plan costs what the brute force over groups with rollout and train apart finds,
    or less where it colocates a job (rollout and train on the same GPUs, which the brute force
    does not enumerate): a plan without colocated jobs is one of the brute force's."""
    if colocated_jobs(plan):
        assert plan.cost_usd_per_hour <= cost + 1e-6
    else:
        assert plan.cost_usd_per_hour == pytest.approx(cost)
