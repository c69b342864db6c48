"""The optimal policy and the exact timetable, on cases whose answers can be worked out by hand."""

import math

import pytest

from weave_rl.planner.api import make_plan
from weave_rl.planner.check import assert_valid
from weave_rl.planner.model import PlanningModel, ceil_ms
from weave_rl.planner.timetable import Member, solve_timetable
from weave_rl.profiles.generators import generate
from weave_rl.profiles.jobs import jobs_from_data
from weave_rl.topology.topology import load_topology

TESTBED = load_topology("weave-testbed")
NODE_8 = 8 * 1.85 + 8 * 5.28  # one H20 node + one H800 node = 57.04 $/h


def job(name, rollout, train, slo=2.0, **extra):
    return {"name": name, "params_b": 7, "slo": slo, **extra,
            "rollout": {"gpus": 8, "gpu_type": "H20", "duration_s": rollout, "host_mem_gb": 275.7},
            "train": {"gpus": 8, "gpu_type": "H800", "duration_s": train, "host_mem_gb": 240}}


def plan_for(jobs_list, topo=TESTBED, **kw):
    jobs = jobs_from_data({"jobs": jobs_list}, "jobs.yaml")
    plan = make_plan(topo, jobs, **kw)
    assert_valid(plan, topo, jobs)
    return plan, jobs


def gpus(node):
    return tuple(f"{node}:{i}" for i in range(8))


def test_single_job_is_its_solo_iteration():
    # SLO 1.05 rules colocation out: on its 8 H800 GPUs the rollout takes 100 x 4.0 / 3.35 = 119.4 s,
    # so rollout + train + two warm switches exceed 1.05 x solo (~165.6 s) = ~173.9 s.
    plan, _ = plan_for([job("A", 100, 60, slo=1.05)])
    assert plan.cost_usd_per_hour == pytest.approx(NODE_8)
    sync = ceil_ms(5.6 + 0.001 + 112 / 3600)
    assert plan.groups[0].cycle_s == pytest.approx(100 + 60 + sync)
    assert plan.lower_bound_usd_per_hour == pytest.approx(NODE_8)


def test_two_jobs_that_fit_each_others_bubbles_share_nodes():
    # B's rollout (50 s) fits in A's training (60 s) and B's training (40 s) in A's rollout (100 s).
    plan, _ = plan_for([job("A", 100, 60), job("B", 50, 40)])
    assert len(plan.groups) == 1
    assert plan.cost_usd_per_hour == pytest.approx(NODE_8)
    assert plan.solver.gap == 0


def test_tight_slos_keep_jobs_apart():
    # B alone takes ~95.6 s; sharing stretches it to A's ~165.6 s cycle, beyond 1.2x. Apart, each is
    # cheapest colocated on one H800 node ($42.24/h): A's ~181.5 s cycle within 2 x 165.6 s, B's
    # 50 x 4.0 / 3.35 + 40 + two warm switches = ~101.7 s within 1.2 x 95.6 s = ~114.7 s.
    plan, _ = plan_for([job("A", 100, 60), job("B", 50, 40, slo=1.2)])
    assert len(plan.groups) == 2
    assert plan.cost_usd_per_hour == pytest.approx(2 * 8 * 5.28)
    for g in plan.groups:
        assert g.jobs[0].phase("rollout").gpus == g.jobs[0].phase("train").gpus


def test_rollout_heavy_jobs_share_training_but_not_rollout():
    # Solo ~205.6 s, so the cycle may reach 1.4 x 205.6 = 287.9 s: two 150 s rollouts (+1.08 s switch
    # each) do not fit on one rollout node, two 50 s trainings do fit on one training node.
    plan, _ = plan_for([job("A", 150, 50, slo=1.4), job("B", 150, 50, slo=1.4)])
    assert plan.cost_usd_per_hour == pytest.approx(8 * 5.28 + 2 * 8 * 1.85)


def test_rejections_and_the_rest_planned():
    plan, _ = plan_for([job("A", 100, 60), job("tight", 50, 40, slo=0.9)])
    assert [r.name for r in plan.rejected] == ["tight"]
    assert "SLO" in plan.rejected[0].reason
    assert [j.name for g in plan.groups for j in g.jobs] == ["A"]


def test_timetable_wraps_modulo_cycle_and_respects_switches():
    jobs = jobs_from_data({"jobs": [job("A", 100, 60), job("B", 50, 40)]}, "jobs.yaml")
    model = PlanningModel(TESTBED, jobs)
    a, b = jobs.jobs
    tt = solve_timetable(model, [Member(a, gpus("rollout-000"), gpus("train-000")),
                                 Member(b, gpus("rollout-000"), gpus("train-000"))])
    assert tt.status == "OPTIMAL"
    # Lower bound by hand: A's own loop (100 + 60 + sync) dominates the shared loads
    # (rollout node 150 s + 2 switches, train node 100 s + 2 switches).
    assert tt.cycle_s == pytest.approx(model.solo["A"])


def test_off_policy_job_overlaps_rollout_with_training():
    # max_staleness 1: the loop may span two cycles, so the cycle drops to max(r, t, loop / 2).
    plan, jobs = plan_for([job("A", 100, 90, slo=1.0, max_staleness=1)], objective="iteration-time")
    solo = PlanningModel(TESTBED, jobs).solo["A"]
    assert plan.groups[0].cycle_s == pytest.approx(max(100.0, math.ceil(solo * 1000 / 2) / 1000))
    assert plan.groups[0].cycle_s < solo


def test_seed_job_lends_training_gpus_to_rollout():
    topo = load_topology("a100-32")
    jobs = generate("seed", 1, 0)
    plan = make_plan(topo, jobs, objective="iteration-time")
    assert_valid(plan, topo, jobs)
    bound = 60 * 20 / 32 + 30 * 12 / 32  # 48.75 s: all 32 GPUs on each phase
    cycle = plan.groups[0].cycle_s
    assert cycle < 0.6 * PlanningModel(topo, jobs).solo["seed-0"]  # static 20/12 split: ~90.7 s
    assert bound < cycle <= 1.10 * bound
    rollout = plan.groups[0].jobs[0].phase("rollout")
    assert len(rollout.gpus) == 32


@pytest.mark.parametrize("family", ["BL", "RH", "TH", "Mixed"])
def test_families_plans_are_valid_and_at_most_solo(family):
    jobs = generate(family, 8, 3)
    optimal = make_plan(TESTBED, jobs)
    solo = make_plan(TESTBED, jobs, policy="solo")
    assert_valid(optimal, TESTBED, jobs)
    assert optimal.cost_usd_per_hour <= solo.cost_usd_per_hour + 1e-6
    assert optimal.lower_bound_usd_per_hour <= optimal.cost_usd_per_hour + 1e-9


def test_too_short_time_limit_falls_back_to_weave():
    jobs = generate("Mixed", 12, 4)
    plan = make_plan(TESTBED, jobs, time_limit_s=1e-6)
    assert_valid(plan, TESTBED, jobs)
    assert plan.solver.status == "FALLBACK" and "weave" in plan.solver.note


@pytest.mark.parametrize("staleness", [0, 1])
def test_timetable_settles_at_its_lower_bound_first(staleness):
    # Two jobs on one rollout and one training node: the cycle is the shared load's lower bound,
    # and the first (constant-cycle) model finds it, as the full minimisation does.
    jobs = jobs_from_data({"jobs": [job("A", 100, 60), job("B", 80, 70, max_staleness=staleness)]}, "jobs.yaml")
    model = PlanningModel(TESTBED, jobs)
    members = [Member(j, gpus("rollout-000"), gpus("train-000")) for j in jobs.jobs]
    fast = solve_timetable(model, members, time_limit_s=5, enumerate_orders=False)
    full = solve_timetable(model, members, time_limit_s=5, try_lower_bound=False, enumerate_orders=False)
    assert fast.status == "OPTIMAL" and fast.cycle_s == pytest.approx(fast.lower_bound_s)
    assert full.cycle_s == pytest.approx(fast.cycle_s)


def test_timetable_minimises_the_cycle_when_its_lower_bound_is_not_reachable():
    # A (60 + 90 s) and off-policy B (120 + 90 s) share a rollout and a training node. The shared
    # loads give a lower bound of 180 s plus two warm switches (182.154 s), which no timetable
    # reaches: CP-SAT's constant-cycle model fails and its full model minimises (183.013 s is the
    # least: tests/test_cyclic.py).
    jobs = jobs_from_data({"jobs": [job("A", 60, 90, slo=4.0), job("B", 120, 90, slo=4.0, max_staleness=1)]},
                          "jobs.yaml")
    model = PlanningModel(TESTBED, jobs)
    members = [Member(j, gpus("rollout-000"), gpus("train-000")) for j in jobs.jobs]
    fast = solve_timetable(model, members, time_limit_s=2, enumerate_orders=False)
    full = solve_timetable(model, members, time_limit_s=2, try_lower_bound=False, enumerate_orders=False)
    assert fast.ok and fast.lower_bound_s == pytest.approx(182.154)
    assert fast.cycle_s > fast.lower_bound_s and full.cycle_s > fast.lower_bound_s
    assert min(fast.cycle_s, full.cycle_s) >= 183.013 - 1e-9
