"""Timetables by enumeration (planner/cyclic.py) against CP-SAT's (planner/timetable.py) and the checker."""

import random

import pytest

from weave_rl.planner.check import check_plan
from weave_rl.planner.cyclic import least_cycle
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.optimal import group_plan
from weave_rl.planner.plan import Plan, SolverInfo
from weave_rl.planner.timetable import Member, solve_timetable
from weave_rl.profiles.jobs import JobSet, jobs_from_data
from weave_rl.topology.topology import load_topology

TESTBED = load_topology("weave-testbed")


def job(name, rollout, train, slo=5.0, staleness=0):
    return {"name": name, "params_b": 7, "slo": slo, "max_staleness": staleness,
            "rollout": {"gpus": 8, "gpu_type": "H20", "duration_s": rollout, "host_mem_gb": 50},
            "train": {"gpus": 8, "gpu_type": "H800", "duration_s": train, "host_mem_gb": 50}}


def gpus(node):
    return tuple(f"{node}:{i}" for i in range(8))


def checked(model, members, tt):
    """The timetable laid out as a one-group plan passes the independent checker."""
    nodes = sorted({g.rpartition(":")[0] for m in members for g in m.rollout_gpus + m.train_gpus})
    group = group_plan(model, "g0", members, nodes, tt)
    plan = Plan(policy="optimal", quantile=model.quantile, topology=TESTBED.name, cost_usd_per_hour=group.usd_per_hour,
                solver=SolverInfo(name="test", status="OPTIMAL"), groups=[group])
    return check_plan(plan, TESTBED, JobSet(jobs=tuple(m.job for m in members)))


def test_the_least_cycle_above_the_lower_bound_is_proven():
    # A (60 + 90 s) and off-policy B (120 + 90 s) share a rollout and a training node: the shared loads
    # give 180 s plus two warm switches (182.154 s), which no timetable reaches. The enumeration proves
    # 183.013 s least in milliseconds; CP-SAT finds no shorter cycle (183.013-183.824 s in 10 s, unproven).
    jobs = jobs_from_data({"jobs": [job("A", 60, 90, slo=4.0), job("B", 120, 90, slo=4.0, staleness=1)]},
                          "jobs.yaml")
    model = PlanningModel(TESTBED, jobs)
    members = [Member(j, gpus("rollout-000"), gpus("train-000")) for j in jobs.jobs]
    enumerated = solve_timetable(model, members, time_limit_s=10)
    cp_sat = solve_timetable(model, members, time_limit_s=10, enumerate_orders=False)
    assert enumerated.status == "OPTIMAL" and cp_sat.ok
    assert enumerated.cycle_s == pytest.approx(183.013) == pytest.approx(enumerated.lower_bound_s)
    assert enumerated.cycle_s <= cp_sat.cycle_s
    assert not checked(model, members, enumerated)


def random_group(rng):
    """2-4 jobs on 1-2 rollout and training nodes, some colocated on a training node, some off-policy."""
    n = rng.choice([2, 3, 3, 4])
    jobs = jobs_from_data({"jobs": [job(f"J{i}", rng.randint(20, 200), rng.randint(20, 200),
                                        slo=50.0, staleness=rng.choice([0, 0, 1])) for i in range(n)]}, "jobs.yaml")
    members = []
    for j in jobs.jobs:
        if rng.random() < 0.15:
            g = gpus(rng.choice(["train-000", "train-001"]))
            members.append(Member(j, g, g))
        else:
            members.append(Member(j, gpus(rng.choice(["rollout-000", "rollout-001"])),
                                  gpus("train-000" if rng.random() < 0.7 else "train-001")))
    return PlanningModel(TESTBED, jobs), members


def test_enumeration_agrees_with_cp_sat_on_tight_random_groups():
    # Each group's cycle capped within 2 % of its least cycle, so that about half have no timetable.
    rng = random.Random(7)
    decided = infeasible = 0
    for _ in range(25):
        model, members = random_group(rng)
        free = solve_timetable(model, members, enforce_slo=False, time_limit_s=5)
        cap = free.cycle_s * rng.uniform(0.98, 1.02)
        enumerated = solve_timetable(model, members, enforce_slo=False, cycle_cap_s=cap, time_limit_s=10)
        cp_sat = solve_timetable(model, members, enforce_slo=False, cycle_cap_s=cap, time_limit_s=10,
                                 enumerate_orders=False)
        assert enumerated.status in ("OPTIMAL", "INFEASIBLE")
        if cp_sat.status in ("OPTIMAL", "INFEASIBLE"):
            decided += 1
            assert enumerated.status == cp_sat.status
            if cp_sat.ok:
                assert enumerated.cycle_s == pytest.approx(cp_sat.cycle_s)
        elif cp_sat.ok:  # CP-SAT's cycle unproven: the enumeration's is no longer
            assert enumerated.cycle_s <= cp_sat.cycle_s + 1e-9
        first = solve_timetable(model, members, enforce_slo=False, cycle_cap_s=cap, time_limit_s=10, least=False)
        assert first.ok == enumerated.ok  # whether one exists, without proving the least
        if enumerated.ok:
            assert enumerated.cycle_s <= first.cycle_s <= cap + 1e-9
            assert not checked(model, members, enumerated) and not checked(model, members, first)
        infeasible += enumerated.status == "INFEASIBLE"
    assert decided >= 20 and 0 < infeasible < 25


def test_a_search_over_its_budget_gives_no_answer():
    jobs = jobs_from_data({"jobs": [job("A", 100, 60), job("B", 50, 40)]}, "jobs.yaml")
    dur = {"A": {"rollout": 100_000, "train": 60_000, "sync": 5_000},
           "B": {"rollout": 50_000, "train": 40_000, "sync": 5_000}}
    sw = {(n, k): 1_000 for n in dur for k in ("rollout", "train")}
    shared = [[("A", "rollout"), ("B", "rollout")], [("A", "train"), ("B", "train")]]
    stale = {"A": 0, "B": 0}
    assert jobs.names == ["A", "B"]
    found = least_cycle(["A", "B"], dur, sw, stale, shared, 165_000, 400_000)
    # By hand: A's loop (165 s) bounds the cycle, and B's rollout and train fit A's train and rollout.
    assert found.cycle == 165_000
    assert least_cycle(["A", "B"], dur, sw, stale, shared, 165_000, 400_000, node_budget=2) is None
    # Both trains plus switches (102 s) exceed a 101 s cycle: no order fits.
    assert least_cycle(["A", "B"], dur, sw, stale, shared, 1_000, 101_000).cycle is None
