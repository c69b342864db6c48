"""Drift: the injection syntax, the EWMA detector, and replanning at the group's cycle boundary."""

import pytest

from weave_rl.executor.config import ElasticRules
from weave_rl.executor.drift import DriftDetector, DriftReplanner, parse_drift
from weave_rl.executor.outputs import job_metrics
from weave_rl.executor.run import simulate_plan
from weave_rl.executor.sim import SimModel
from weave_rl.planner.api import make_plan
from weave_rl.planner.online import OnlinePlanner
from weave_rl.profiles.jobs import JobSet
from weave_rl.core.errors import InputError

from test_sim import job, plan_of, solo_group, topo


def test_step_drift_spec():
    jobs = JobSet(jobs=[job("A"), job("B")])
    f = parse_drift("A:rollout:1.5@1000,*:train:0.5@2000", jobs).injector(jobs, lambda name: 1.0)
    assert f("A", "rollout", 999) == 1.0 and f("A", "rollout", 1000) == 1.5
    assert f("B", "rollout", 5000) == 1.0 and f("B", "train", 2000) == 0.5


def test_templates_ramp_over_each_jobs_life():
    jobs = JobSet(jobs=[job("A"), job("B", arrival_s=100.0)])
    f = parse_drift("mixed:1.0", jobs).injector(jobs, lambda name: 1000.0)
    assert f("A", "rollout", 500) == pytest.approx(1.5)  # increasing, half way: 1 + 1.0 * 0.5
    assert f("B", "rollout", 1100) == pytest.approx(0.5)  # decreasing, at the end: 1 / (1 + 1.0)
    assert f("A", "train", 500) == 1.0
    up = parse_drift("increasing:0.5", jobs).injector(jobs, lambda name: 1000.0)
    assert up("B", "rollout", 50) == 1.0 and up("B", "rollout", 2000) == pytest.approx(1.5)


@pytest.mark.parametrize("text", ["A:roll:1.5@3", "A:rollout:0@3", "A:rollout:x@3", "sideways:1", "A:rollout:2"])
def test_bad_drift_specs(text):
    with pytest.raises(InputError):
        parse_drift(text, JobSet(jobs=[job("A")]))


def test_detector_needs_k_iterations_past_the_threshold():
    det = DriftDetector(lambda *a: 100.0, threshold=0.15, k=3, alpha=0.5, min_samples=3)

    def feed(k, width):
        return det.observe({"job": "A", "phase": "rollout", "iteration": k, "gpus": 8, "gpu_type": "H20",
                            "width_s": width})

    assert [feed(k, 100.0) for k in range(3)] == [None, None, None]
    # EWMA 1.0 -> 1.25 -> 1.375 -> 1.4375: over 15% from the first drifted iteration on.
    assert feed(3, 150.0) is None and feed(4, 150.0) is None
    assert feed(5, 150.0) == ("A", "rollout", pytest.approx(1.4375), 3)
    assert feed(6, 150.0) is None  # restarted after reporting


def test_drift_triggers_a_refit_and_a_replan_at_the_cycle_boundary():
    # SLO 1.0: neither job may share, so the replan can only resize A's own group.
    t = topo(2, 2)
    jobs = JobSet(jobs=[job("A", slo=1.0), job("B", slo=1.0)])
    plan = make_plan(t, jobs, policy="solo")
    drift = parse_drift("A:rollout:1.5@1000", jobs).injector(jobs, lambda name: 1.0)
    holder = {}

    def setup(controller, backend):
        holder["r"] = DriftReplanner(controller, OnlinePlanner(t, jobs, plan), migration_cost_s=0.0)

    r = simulate_plan(plan, t, jobs, iterations=16, rules=ElasticRules.off(), model=SimModel(link_sharing=False),
                      drift=drift, setup=setup)
    log = holder["r"].log
    assert len(log) == 1 and log[0]["job"] == "A" and "rollout at 1.44x" in log[0]["reason"]
    a = r.controller.job_plans["A"][1]
    assert a.phase("rollout").duration_s == pytest.approx(150.0)  # refitted from the drifted runs
    m = job_metrics(r.controller)
    assert m["A"]["steady_iteration_s"] == pytest.approx(202.0, abs=0.01)  # 150 + 50 + 2
    assert m["A"]["planned_iteration_s"] == pytest.approx(202.0, abs=0.01)
    b = r.controller.state["B"]
    gaps = [b.iteration_ends[k + 1] - b.iteration_ends[k] for k in range(15)]
    assert gaps == pytest.approx([152.0] * 15, abs=0.01)  # the other group never noticed
    switch = [e for e in r.controller.events if e["event"] == "switch"]
    assert len(switch) == 1 and switch[0]["jobs"] == ["A"]
