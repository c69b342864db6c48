"""Property-based tests (hypothesis) on random small instances: every plan passes the independent
checker; ``optimal`` places at least as many jobs as ``weave`` and ``solo`` and, when it places as
many, costs no more; admitting after a release keeps a valid plan."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weave_rl.planner.api import make_plan
from weave_rl.planner.check import check_plan
from weave_rl.planner.online import OnlinePlanner
from weave_rl.planner.plan import Plan
from weave_rl.profiles.generators import HOST_MEM_GB
from weave_rl.profiles.jobs import JobSet, jobs_from_data
from testbed import small_testbed  # tests/ is on sys.path under pytest

SMALL = small_testbed("small", 4)

# More examples on demand: WEAVE_HYPOTHESIS_EXAMPLES=300 pytest tests/test_properties.py
SETTINGS = settings(max_examples=int(os.environ.get("WEAVE_HYPOTHESIS_EXAMPLES", 40)), deadline=None,
                    derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def job_specs(draw, name: str) -> dict:
    size = draw(st.sampled_from(sorted(HOST_MEM_GB)))
    roll_mem, train_mem = HOST_MEM_GB[size]
    wide = draw(st.booleans())
    return {"name": name, "params_b": size, "slo": draw(st.floats(1.0, 2.0)).__round__(2),
            "max_staleness": draw(st.sampled_from([0, 0, 1])),
            "rollout": {"gpus": 8, "gpu_type": "H20", "duration_s": draw(st.integers(20, 400)),
                        "host_mem_gb": roll_mem, **({"gpu_options": [8, 16]} if wide else {})},
            "train": {"gpus": 8, "gpu_type": "H800", "duration_s": draw(st.integers(20, 400)),
                      "host_mem_gb": train_mem}}


@st.composite
def instances(draw) -> JobSet:
    n = draw(st.integers(1, 6))
    return jobs_from_data({"jobs": [draw(job_specs(f"j{i}")) for i in range(n)]}, "random.yaml")


def placed(plan: Plan) -> int:
    return sum(len(g.jobs) for g in plan.groups)


@SETTINGS
@given(instances())
def test_every_policy_emits_valid_plans_and_optimal_is_cheapest(jobs):
    plans = {p: make_plan(SMALL, jobs, policy=p, time_limit_s=20) for p in ("optimal", "weave", "solo", "colocate")}
    for policy, plan in plans.items():
        assert not check_plan(plan, SMALL, jobs), policy
        assert placed(plan) + len(plan.rejected) == len(jobs.jobs)
    best = plans["optimal"]
    for other in ("weave", "solo"):
        assert placed(best) >= placed(plans[other])
        if placed(best) == placed(plans[other]):
            assert best.cost_usd_per_hour <= plans[other].cost_usd_per_hour + 1e-6
    if best.lower_bound_usd_per_hour is not None:
        assert best.lower_bound_usd_per_hour <= best.cost_usd_per_hour + 1e-6


@SETTINGS
@given(instances(), st.data())
def test_admit_after_release_keeps_a_valid_plan(jobs, data):
    op = OnlinePlanner(SMALL, JobSet(jobs=[]))
    for spec in jobs.jobs:
        op.admit(spec)
    assert not check_plan(Plan.model_validate(op.plan.model_dump()), SMALL, jobs)
    victim = data.draw(st.sampled_from(jobs.jobs))
    op.release(victim.name)
    adm = op.admit(victim)
    plan = Plan.model_validate(adm.plan.model_dump())
    assert not check_plan(plan, SMALL, jobs)
    assert placed(plan) + len(plan.rejected) == len(jobs.jobs)
