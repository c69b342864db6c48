"""The plan built half by half (planner/halves.py): each half's LP against hand values and the
enumerated optimum, and the plan itself.

Prices (tests/testbed.py): a training node is 42.24 $/h, a rollout node 14.80 $/h.
"""

from __future__ import annotations

import math
import time
from collections import Counter

import pytest

import weave_rl.planner.optimize as optimize
from weave_rl.planner.check import assert_valid
from weave_rl.planner.columns import FreeNodes, group_timetable, materialize
from weave_rl.planner.halves import decomposed_plan, half, phases_apart
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.optimize import _candidate_column, plan_optimal
from weave_rl.planner.pricing import Pricing, price_exact
from weave_rl.profiles.generators import generate
from weave_rl.profiles.jobs import jobs_from_data
from testbed import ROLLOUT_NODE, TESTBED, TRAIN_NODE, builder_for  # tests/ is on sys.path under pytest


def two_jobs():
    # Rollout 100 s, train 20 s each; j0's SLO is 4, j1's is 1 (its cap is its solo loop, about
    # 126 s). Both rollouts (200 s) never fit j1's cap, so they need two rollout nodes; both trains
    # fit one training node.
    return jobs_from_data({"jobs": [{"name": f"j{i}", "params_b": 7, "slo": slo,
                                     "rollout": {"gpus": 8, "gpu_type": "H20", "duration_s": 100, "host_mem_gb": 100},
                                     "train": {"gpus": 8, "gpu_type": "H800", "duration_s": 20, "host_mem_gb": 100}}
                                    for i, slo in enumerate((4.0, 1.0))]}, "jobs.yaml")


def halves(builder, seconds: float = 30):
    return {kind: half(builder, kind).solve(time.perf_counter() + seconds) for kind in ("rollout", "train")}


def test_each_halfs_lp_by_hand():
    model, builder = builder_for(two_jobs())
    assert phases_apart(builder)  # H20 rollouts, H800 trains
    by_kind = halves(builder)
    assert by_kind["rollout"].proven and by_kind["train"].proven
    assert by_kind["rollout"].bound == pytest.approx(2 * ROLLOUT_NODE)
    assert by_kind["train"].bound == pytest.approx(TRAIN_NODE)
    # The two halves are met together: one training node and two rollout nodes.
    exact = plan_optimal(model, time_limit_s=30).plan
    assert exact.cost_usd_per_hour == pytest.approx(TRAIN_NODE + 2 * ROLLOUT_NODE)


def test_a_bin_holds_at_most_k_jobs():
    # Ten jobs whose trains all fit one node: with groups of at most 2, the training half needs 5 nodes.
    jobs = jobs_from_data({"jobs": [{"name": f"j{i}", "params_b": 7, "slo": 4.0,
                                     "rollout": {"gpus": 8, "gpu_type": "H20", "duration_s": 100, "host_mem_gb": 100},
                                     "train": {"gpus": 8, "gpu_type": "H800", "duration_s": 5, "host_mem_gb": 100}}
                                    for i in range(10)]}, "jobs.yaml")
    _, builder = builder_for(jobs, k=2)
    result = half(builder, "train").solve(time.perf_counter() + 30)
    assert result.proven and result.bound == pytest.approx(5 * TRAIN_NODE)


@pytest.mark.parametrize("family,seed", [("RH", 1), ("RH", 2), ("TH", 3), ("BL", 4), ("Mixed", 5)])
def test_the_halves_lps_never_exceed_an_optimum_without_colocated_jobs(family, seed):
    # Every group's pool and classes are bins of the halves, so a plan whose phases sit apart costs
    # at least the two LPs together (the optimum may also colocate jobs: RH s2, $245.12 against $259.92).
    jobs = generate(family, 9, seed)
    model, builder = builder_for(jobs)
    exact = plan_optimal(model, time_limit_s=60).plan
    assert exact.solver.status == "OPTIMAL" and not exact.rejected
    by_kind = halves(builder, 60)
    assert all(h.proven for h in by_kind.values())
    if not any(j.phase("rollout").gpus == j.phase("train").gpus for g in exact.groups for j in g.jobs):
        assert sum(h.bound for h in by_kind.values()) <= exact.cost_usd_per_hour + 1e-6


@pytest.mark.parametrize("family,seed", [("RH", 1), ("Mixed", 2), ("Mixed", 3), ("BL", 1)])
def test_plan_by_halves_covers_every_job_once(family, seed):
    jobs = generate(family, 40, seed)
    model, builder = builder_for(jobs)
    groups = decomposed_plan(builder, time.perf_counter() + 20)
    assert groups
    covered = Counter(j for g in groups for j in g.jobs)
    assert set(covered) == set(builder.job_ids) and set(covered.values()) == {1}
    for g in groups:
        assert len(g.jobs) <= builder.k
        assert g.cost == pytest.approx(sum(builder.price[c] * n for c, n in g.nodes))
        # Within the group's cap: its pool's trains (a shared pool switches), and its timetable.
        cap = min(builder.cap[j] for j in g.jobs)
        assert len({t.gpus for t in g.trains}) == 1  # the halves' pools: one training option for all
        assert all(t in builder.train_opts[j] for j, t in zip(g.jobs, g.trains))
        assert len(g.jobs) == 1 or sum(t.duration_s + t.switch_s for t in g.trains) <= cap + 1e-6
        members, _ = materialize(model, _candidate_column(g, {}), FreeNodes(TESTBED))
        assert group_timetable(model, members, time_limit_s=10, threads=1).ok
    # The rollout classes it starts from cost at least the rollout half's LP.
    rollout_cost = sum(builder.price[c] * n for g in groups for c, n in g.nodes if c == "rollout")
    assert rollout_cost >= half(builder, "rollout").solve(time.perf_counter() + 20).bound - 1e-6 > 0


def test_optimal_starts_from_the_plan_by_halves_where_the_lp_has_not_settled(monkeypatch):
    # Column generation that never completes a pricing (as on 300 RH jobs in 30 s but for the
    # pricing that goes on in the background).
    def unproven(*args, **kwargs):
        found = price_exact(*args, **kwargs)
        return Pricing(found.columns, -math.inf, False, found.nodes)

    monkeypatch.setattr(optimize, "price_exact", unproven)
    jobs = generate("RH", 40, 3)
    model = PlanningModel(TESTBED, jobs)
    said: list[str] = []
    result = plan_optimal(model, time_limit_s=20, enumeration_budget=0, progress=said.append)
    plan = result.plan
    assert_valid(plan, TESTBED, jobs)
    assert any(m.startswith("plan by halves") for m in said)
    assert "LP dive: skipped (the LP has not settled)" in said
    # One option of one node per phase: the plan by halves is regrouped.
    assert any(m.startswith("regrouped: ") for m in said)
    halved = float(next(m for m in said if m.startswith("plan by halves")).rsplit("$", 1)[1].replace(",", ""))
    assert plan.cost_usd_per_hour <= halved + 1e-6
    # No pricing proved anything: the bound is the work or packing bound, and the note says so.
    assert "column generation proved no bound in time" in plan.solver.note
    assert 0 < plan.lower_bound_usd_per_hour <= plan.cost_usd_per_hour
