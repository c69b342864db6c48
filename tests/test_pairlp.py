"""The joint LP by pairs (planner/pairlp.py): its value against hand values and against the LP over
every enumerated candidate group, its Lagrangian bound at any duals, and the bound by whole nodes.

Prices (tests/testbed.py): a training node is 42.24 $/h, a rollout node 14.80 $/h.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from ortools.linear_solver import pywraplp

from weave_rl.planner.check import assert_valid
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.optimize import _allow_colocation, plan_optimal
from weave_rl.planner.pairlp import JointLP, PairLP, applies, whole_nodes
from weave_rl.profiles.generators import generate
from weave_rl.profiles.jobs import jobs_from_data
from testbed import ROLLOUT_NODE, TESTBED, TRAIN_NODE, builder_for  # tests/ is on sys.path under pytest


def uniform_jobs(n):
    # Rollout 100 s, train 10 s, SLO 2: the cap (about 220 s) holds two rollouts on a node but
    # never three, and five trains on a training node.
    return jobs_from_data({"jobs": [{"name": f"j{i}", "params_b": 7, "slo": 2.0,
                                     "rollout": {"gpus": 8, "gpu_type": "H20", "duration_s": 100, "host_mem_gb": 100},
                                     "train": {"gpus": 8, "gpu_type": "H800", "duration_s": 10, "host_mem_gb": 100}}
                                    for i in range(n)]}, "jobs.yaml")


def enumerated_lp(builder) -> float:
    """The set-partitioning LP over every candidate group the builder enumerates (GLOP)."""
    candidates = builder.build()
    assert builder.complete
    cheapest: dict[tuple, float] = {}
    for c in candidates:
        cheapest[c.jobs] = min(c.cost, cheapest.get(c.jobs, math.inf))
    solver = pywraplp.Solver.CreateSolver("GLOP")
    rows = {j: solver.Constraint(1, 1) for j in builder.job_ids}
    objective = solver.Objective()
    for jobs, cost in cheapest.items():
        var = solver.NumVar(0, 1, "")
        for j in jobs:
            rows[j].SetCoefficient(var, 1)
        objective.SetCoefficient(var, cost)
    objective.SetMinimization()
    assert solver.Solve() == pywraplp.Solver.OPTIMAL
    return objective.Value()


def test_pair_lp_by_hand():
    # 20 jobs that all pair up: a group of five (two pairs, one alone) costs 42.24 + 3 * 14.80 =
    # $86.64 for five jobs, the least per job of any group (four jobs, two pairs: $71.84 for
    # four), so the LP is 4 * 86.64 = $346.56, which four such groups reach.
    _, builder = builder_for(uniform_jobs(20))
    assert applies(builder)
    lp = PairLP(builder)
    result = lp.solve(time.perf_counter() + 30)
    assert result.proven
    assert result.bound == pytest.approx(4 * (TRAIN_NODE + 3 * ROLLOUT_NODE))
    assert result.lp_value == pytest.approx(result.bound)
    # Every column is a group of the candidate rules at its least cost.
    for g in lp.columns:
        configs = builder._configs(list(g.jobs))
        assert configs and g.cost == pytest.approx(min(c.cost for c in configs))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pair_lp_equals_the_lp_over_every_candidate(seed):
    _, builder = builder_for(generate("RH", 10, seed))
    assert applies(builder)
    result = PairLP(builder).solve(time.perf_counter() + 30)
    assert result.proven
    assert result.bound == pytest.approx(enumerated_lp(builder), abs=1e-3)


def test_lagrangian_bound_holds_at_any_duals():
    # At any duals, sum(duals) plus each leader's least reduced cost (below 0) is at most the LP:
    # were a group of negative reduced cost missed, it could exceed it.
    _, builder = builder_for(generate("RH", 10, 2))
    optimum = enumerated_lp(builder)
    lp = PairLP(builder)
    rng = np.random.default_rng(0)
    for _ in range(30):
        dual = rng.uniform(0, 40, len(builder.job_ids))
        found, bound = lp.price(dual, time.perf_counter() + 30)
        assert bound is not None and bound <= optimum + 1e-6
        for g in found:  # each group found has a negative reduced cost
            assert g.cost - sum(dual[lp.pos[j]] for j in g.jobs) < 0


def test_three_rollouts_on_a_node_are_outside_the_model():
    # TH jobs' rollouts are short: three fit one node, and the LP by pairs would miss such groups.
    _, builder = builder_for(generate("TH", 20, 1))
    assert not applies(builder)


def test_whole_nodes_by_hand():
    # Training half 60 nodes ($2,534.40), rollout half 192 ($2,841.60), joint LP $5,385.69: with
    # 60 training nodes the rollout nodes must cost 5,385.69 - 2,534.40 = $2,851.29, 192.66 nodes,
    # so 193: $5,390.80 (61 training nodes and 192 cost $5,418.24).
    assert whole_nodes(5385.69, 2534.4, 2841.6, TRAIN_NODE, ROLLOUT_NODE) == pytest.approx(5390.80)
    # Above $5,405.60 (60 + 194), 61 + 192 = $5,418.24 is the least (60 + 195 = $5,420.40).
    assert whole_nodes(5406.0, 2534.4, 2841.6, TRAIN_NODE, ROLLOUT_NODE) == pytest.approx(5418.24)
    # A weak joint bound leaves the halves' sum.
    assert whole_nodes(5000.0, 2534.4, 2841.6, TRAIN_NODE, ROLLOUT_NODE) == pytest.approx(5376.0)


def test_joint_bound_is_at_least_the_halves_and_at_most_a_plan():
    jobs = generate("RH", 40, 3)
    model, builder = builder_for(jobs)
    joint = JointLP(builder, time.perf_counter() + 5)
    joint.start(time.perf_counter() + 20, background=False)
    assert joint.settled(time.perf_counter())
    bound = joint.bound()
    assert bound >= joint.train.bound + joint.rollout.bound - 1e-6
    assert bound >= joint.pair.bound - 1e-6
    plan = plan_optimal(model, time_limit_s=20).plan
    assert_valid(plan, TESTBED, jobs)
    assert bound <= plan.cost_usd_per_hour + 1e-6
    # The plan's model also holds every job colocated, which the joint LP knows nothing of: its
    # bound is the joint one made valid for those (planner/optimize.py _allow_colocation).
    allowed = _allow_colocation(model, builder, bound, (joint.train.bound, joint.rollout.bound), joint)
    assert allowed <= bound + 1e-6
    assert plan.lower_bound_usd_per_hour >= allowed - 1e-6
    # In a forked process, the same LP and bound, read once it is proven.
    other = JointLP(builder, time.perf_counter() + 5)
    other.start(time.perf_counter() + 20, background=True)
    assert other.settled(time.perf_counter() + 20)
    assert other.bound() == pytest.approx(bound)
    other.close()
    assert not other.running


@pytest.mark.parametrize("threads", [1, 2])
def test_unsettled_pair_lp_skips_column_generation(monkeypatch, threads):
    # The LP by pairs cut short (as on 300 RH jobs): column generation, which would not settle
    # either, is skipped; the plan by halves is regrouped and the bound is the pairs' by whole nodes.
    # On two threads the LP by pairs runs in a forked process, on one here.
    original = PairLP._generate

    def unsettled(self, deadline, center, seeds, progress, report):
        def unproven(bound):
            bound.proven = False
            if report:
                report(bound)

        result = original(self, min(deadline, time.perf_counter() + 0.5), center, seeds, progress, unproven)
        result.proven = False
        return result

    monkeypatch.setattr(PairLP, "_generate", unsettled)
    jobs = generate("RH", 40, 3)
    model = PlanningModel(TESTBED, jobs)
    said: list[str] = []
    plan = plan_optimal(model, time_limit_s=20, enumeration_budget=0, progress=said.append, threads=threads).plan
    assert_valid(plan, TESTBED, jobs)
    assert "column generation skipped: the LP by pairs did not settle" in said
    assert any(m.startswith("regrouped: ") for m in said)
    assert plan.lower_bound_usd_per_hour <= plan.cost_usd_per_hour + 1e-6
    assert "planner/pairlp.py" in plan.solver.note or "planner/halves.py" in plan.solver.note
