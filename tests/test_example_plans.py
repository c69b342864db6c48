"""Every committed example plan passes the independent checker against its inputs."""

import pytest

from weave_rl.planner.check import check_plan, format_violations
from weave_rl.planner.plan import load_plan
from weave_rl.profiles.jobs import load_jobs
from weave_rl.topology.topology import load_topology

from example_plans import EXAMPLES, PLANS  # tests/ is on sys.path under pytest


def test_every_plan_in_plans_is_listed():
    assert sorted(p.name for p in PLANS.glob("*.yaml")) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_plan_is_valid(name):
    topology, jobs = EXAMPLES[name]
    topo = load_topology(str(topology))
    plan = load_plan(PLANS / name)
    violations = check_plan(plan, topo, load_jobs(jobs, topo.gpu_types))
    assert not violations, format_violations(violations)
    assert not plan.rejected
