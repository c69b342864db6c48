"""The throughput objective (``make_plan(..., objective="throughput")``, ``weave plan --objective
throughput``): most job-iterations per $, every admissible job placed, checked against the
exhaustive search of bench/bruteforce.py and by hand.

Prices on weave-testbed: a training node (8 H800) is 42.24 $/h, a rollout node (8 H20) 14.80 $/h.
"""

from __future__ import annotations

import pytest

from bench.bruteforce import brute_force_throughput
from weave_rl.core.errors import InputError
from weave_rl.planner.api import make_plan
from weave_rl.planner.check import check_plan, format_violations
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.plan import load_plan
from weave_rl.planner.throughput import iterations_per_usd, plan_max_throughput
from weave_rl.profiles.generators import generate
from weave_rl.profiles.jobs import jobs_from_data, jobs_to_data
from weave_rl.topology.topology import load_topology

from test_bruteforce import exhaustive  # tests/ is on sys.path under pytest
from testbed import colocated_jobs

TRAIN, ROLLOUT = 8 * 5.28, 8 * 1.85


def job(name: str, rollout_s: float, train_s: float, slo: float) -> dict:
    return {"name": name, "params_b": 7, "slo": slo,
            "rollout": {"gpus": 8, "gpu_type": "H20", "duration_s": rollout_s, "host_mem_gb": 275.7},
            "train": {"gpus": 8, "gpu_type": "H800", "duration_s": train_s, "host_mem_gb": 240.0}}


@pytest.fixture(scope="module")
def topo():
    return load_topology("weave-testbed")


def checked(topo, jobs, **kwargs):
    plan = make_plan(topo, jobs, policy="optimal", objective="throughput", threads=2, **kwargs)
    violations = check_plan(plan, topo, jobs)
    assert not violations, format_violations(violations)
    assert plan.objective == "throughput" and plan.solver.status == "OPTIMAL"
    return plan


def test_two_rollout_heavy_jobs_buy_a_second_rollout_node(topo):
    # The cost objective's plan: both jobs time-share one H800 node, every phase taking its turn
    # (rollouts slowed to 200 x 4.0 / 3.35 = 238.8 s there): a cycle of 2 x (238.8 + 30) s plus four
    # warm switches, ~541.6 s, within SLO 2.5 x ~236 s, for 42.24 $/h: 2 x 3600 / 541.6 / 42.24 =
    # 0.315 per $. (Sharing one rollout node apart, 57.04 $/h, is no better: 0.31 per $.) A rollout
    # node each (71.84 $/h) lets both run at their solo time, 2 x 3600 / 235.6 / 71.84 = 0.425 per
    # $: the throughput objective buys it, the cost objective does not.
    jobs = jobs_from_data({"jobs": [job("R1", 200, 30, 2.5), job("R2", 200, 30, 2.5)]}, "jobs.yaml")
    cheap = make_plan(topo, jobs, policy="optimal", threads=2, time_limit_s=2)
    assert cheap.cost_usd_per_hour == pytest.approx(TRAIN)
    assert cheap.groups[0].cycle_s == pytest.approx(2 * (200 * 4.0 / 3.35 + 30) + 4, abs=1.0)
    assert iterations_per_usd(cheap) < 0.32
    plan = checked(topo, jobs)
    assert plan.cost_usd_per_hour == pytest.approx(TRAIN + 2 * ROLLOUT)  # 71.84
    solo = PlanningModel(topo, jobs).solo["R1"]
    assert solo == pytest.approx(235.633)  # 200 + 30 + the 7B sync: 14 GB over the 20 Gbit/s link, 5.6 s
    assert [g.cycle_s for g in plan.groups] == [pytest.approx(solo)]
    assert iterations_per_usd(plan) == pytest.approx(2 * 3600 / solo / (TRAIN + 2 * ROLLOUT))  # 0.425
    assert plan.solver.objective == pytest.approx(iterations_per_usd(plan), rel=1e-6)


def test_incompatible_jobs_run_alone(topo):
    # SLO 1: no job can stretch; each runs alone at its solo time, one group of two nodes each.
    jobs = jobs_from_data({"jobs": [job("A", 100, 60, 1.0), job("B", 50, 40, 1.0)]}, "jobs.yaml")
    plan = checked(topo, jobs)
    solo = PlanningModel(topo, jobs).solo
    assert plan.cost_usd_per_hour == pytest.approx(2 * (TRAIN + ROLLOUT))  # 114.08
    assert iterations_per_usd(plan) == pytest.approx((3600 / solo["A"] + 3600 / solo["B"]) / 114.08)


HAND = [
    [job("A", 100, 60, 2.0), job("B", 50, 40, 2.0)],
    [job("R1", 200, 30, 1.2), job("R2", 200, 30, 1.2), job("C", 50, 40, 1.0)],
    [job("R1", 200, 30, 2.5), job("R2", 200, 30, 2.5), job("R3", 150, 40, 2.0)],
]


@pytest.mark.parametrize("case", range(len(HAND)))
def test_hand_made_instances_agree_with_brute_force(topo, case):
    jobs = jobs_from_data({"jobs": HAND[case]}, "jobs.yaml")
    best, _ = exhaustive(brute_force_throughput, topo, jobs, every_job=False)
    assert iterations_per_usd(checked(topo, jobs)) == pytest.approx(best, rel=1e-9)


@pytest.mark.parametrize("family, seed", [("BL", 0), ("Mixed", 1), ("RH", 2), ("TH", 3), ("Mixed", 4)])
def test_generated_instances_agree_with_brute_force(topo, family, seed):
    jobs = generate(family, 6, seed)
    best, _ = exhaustive(brute_force_throughput, topo, jobs)
    plan = checked(topo, jobs)
    assert not plan.rejected
    assert iterations_per_usd(plan) == pytest.approx(best, rel=1e-9)
    # Never below the cost objective's plan on its own figure, where that plan is one of this
    # objective's groups (the cost objective's model also holds jobs colocated: rollout and train
    # on the same GPUs, which this objective does not consider).
    by_cost = make_plan(topo, jobs, threads=2, time_limit_s=2)
    if not colocated_jobs(by_cost):
        assert iterations_per_usd(plan) >= iterations_per_usd(by_cost) * (1 - 1e-9)


def test_every_job_placed_even_when_it_lowers_the_ratio(topo):
    # C alone is a poor 3600 / ~91 s per 57.04 $/h next to the pair; it is still placed.
    jobs = jobs_from_data({"jobs": [job("A", 100, 60, 2.0), job("B", 50, 40, 2.0), job("C", 50, 40, 1.0)]},
                          "jobs.yaml")
    plan = checked(topo, jobs)
    assert sorted(plan.jobs) == ["A", "B", "C"] and not plan.rejected


def test_bad_input_is_refused_clearly(topo):
    jobs = generate("Mixed", 6, 1)
    with pytest.raises(ValueError, match="optimal policy"):
        make_plan(topo, jobs, policy="weave", objective="throughput")
    with pytest.raises(ValueError, match="unknown objective"):
        make_plan(topo, jobs, objective="tokens")
    with pytest.raises(InputError, match="enumerates every candidate group"):
        plan_max_throughput(PlanningModel(topo, jobs), enumeration_budget=3)


def test_cli_plans_with_the_throughput_objective(tmp_path, capsys):
    from weave_rl.cli.app import main

    jobs = jobs_from_data({"jobs": [job("R1", 200, 30, 2.5), job("R2", 200, 30, 2.5)]}, "jobs.yaml")
    (tmp_path / "jobs.yaml").write_text(__import__("yaml").safe_dump(jobs_to_data(jobs)))
    out = tmp_path / "plan.yaml"
    assert main(["plan", "-t", "weave-testbed", "-j", str(tmp_path / "jobs.yaml"), "--objective", "throughput",
                 "-o", str(out)]) == 0
    plan = load_plan(out)
    assert plan.objective == "throughput" and plan.cost_usd_per_hour == pytest.approx(TRAIN + 2 * ROLLOUT)
    assert main(["plan", "-t", "weave-testbed", "-j", str(tmp_path / "jobs.yaml"), "--objective", "throughput",
                 "--policy", "weave"]) == 2
    assert "optimal policy" in capsys.readouterr().err
