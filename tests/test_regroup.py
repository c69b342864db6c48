"""Regrouping (planner/regroup.py): windows of groups re-cut exactly, checked against a hand-solved
case, the candidate rules and the group timetables.

Prices (tests/testbed.py): a training node is 42.24 $/h, a rollout node 14.80 $/h.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from weave_rl.planner.columns import FreeNodes, group_timetable, materialize
from weave_rl.planner.halves import decomposed_plan
from weave_rl.planner.optimal import make_candidate
from weave_rl.planner.optimize import _candidate_column
from weave_rl.planner.regroup import eligible, regroup
from weave_rl.profiles.generators import generate
from weave_rl.profiles.jobs import jobs_from_data
from testbed import ROLLOUT_NODE, TESTBED, TRAIN_NODE, builder_for  # tests/ is on sys.path under pytest


def uniform_jobs(n, rollout_gpus=8):
    # Rollout 100 s, train 10 s, SLO 2: the cap (about 220 s) holds two rollouts on a node but
    # never three, and five trains on a training node.
    return jobs_from_data({"jobs": [{"name": f"j{i}", "params_b": 7, "slo": 2.0,
                                     "rollout": {"gpus": rollout_gpus, "gpu_type": "H20", "duration_s": 100,
                                                 "host_mem_gb": 100},
                                     "train": {"gpus": 8, "gpu_type": "H800", "duration_s": 10, "host_mem_gb": 100}}
                                    for i in range(n)]}, "jobs.yaml")


def assert_sound(model, builder, groups, jobs):
    """Each job once; every group within the candidate rules at its least cost, and timetabled."""
    covered = Counter(j for g in groups for j in g.jobs)
    assert set(covered) == set(jobs) and set(covered.values()) == {1}
    for g in groups:
        configs = builder._configs(list(g.jobs))
        assert configs, f"group {g.jobs} breaks the candidate rules"
        assert g.cost == pytest.approx(min(c.cost for c in configs))
        members, _ = materialize(model, _candidate_column(g, {}), FreeNodes(TESTBED))
        assert group_timetable(model, members, time_limit_s=10, threads=1).ok


def test_regroup_by_hand():
    # 20 jobs that all pair up, as the plan by halves leaves them: five groups of four, two rollout
    # nodes each, 5 * (42.24 + 2 * 14.80) = $359.20. Four groups of five (two pairs and one job
    # alone each) cost 4 * (42.24 + 3 * 14.80) = $346.56, the optimum: 20 jobs need four training
    # nodes at least, and four groups of five need three rollout nodes each.
    model, builder = builder_for(uniform_jobs(20))
    assert eligible(builder)
    train, rollout = builder.train_opts[0][0], builder.rollout_opts[0][0]
    start = [make_candidate(builder, list(range(4 * g, 4 * g + 4)), train, [rollout] * 4, [[0, 1], [2, 3]], [0] * 4)
             for g in range(5)]
    assert sum(g.cost for g in start) == pytest.approx(5 * (TRAIN_NODE + 2 * ROLLOUT_NODE))
    better = regroup(builder, start, time.perf_counter() + 5)
    assert sum(g.cost for g in better) == pytest.approx(4 * (TRAIN_NODE + 3 * ROLLOUT_NODE))
    assert sorted(len(g.jobs) for g in better) == [5, 5, 5, 5]
    assert_sound(model, builder, better, builder.job_ids)


def test_regroup_forms_only_timetabled_groups():
    # The same 20 jobs, with a timetable check that refuses any group holding both j0 and j1 (the
    # start has one): the optimum without them together still costs $346.56.
    model, builder = builder_for(uniform_jobs(20))
    train, rollout = builder.train_opts[0][0], builder.rollout_opts[0][0]
    start = [make_candidate(builder, list(range(4 * g, 4 * g + 4)), train, [rollout] * 4, [[0, 1], [2, 3]], [0] * 4)
             for g in range(5)]
    asked = []

    def timetabled(cand):
        asked.append(cand.jobs)
        return not {0, 1} <= set(cand.jobs)

    better = regroup(builder, start, time.perf_counter() + 5, timetabled=timetabled)
    assert (0, 1, 2, 3) in asked  # the start's group was checked, and mended
    assert all(not {0, 1} <= set(g.jobs) for g in better)
    assert sum(g.cost for g in better) == pytest.approx(4 * (TRAIN_NODE + 3 * ROLLOUT_NODE))
    assert_sound(model, builder, better, builder.job_ids)


@pytest.mark.parametrize("family,seed", [("RH", 1), ("Mixed", 2), ("TH", 3)])
def test_regroup_keeps_every_rule_and_never_costs_more(family, seed):
    jobs = generate(family, 40, seed)
    model, builder = builder_for(jobs)
    start = decomposed_plan(builder, time.perf_counter() + 20)
    better = regroup(builder, start, time.perf_counter() + 4)
    assert sum(g.cost for g in better) <= sum(g.cost for g in start) + 1e-6
    assert_sound(model, builder, better, builder.job_ids)


def test_regroup_leaves_multi_node_jobs_alone():
    # Rollouts on 16 GPUs take two nodes: outside the model, the groups come back as they were.
    model, builder = builder_for(uniform_jobs(6, rollout_gpus=16))
    assert not eligible(builder)
    train, rollout = builder.train_opts[0][0], builder.rollout_opts[0][0]
    start = [make_candidate(builder, [j], train, [rollout], [[0]], [0]) for j in builder.job_ids]
    assert regroup(builder, start, time.perf_counter() + 2) == start
