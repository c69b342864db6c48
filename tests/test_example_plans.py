"""Every committed example plan passes the independent checker against its inputs."""

from pathlib import Path

import pytest

from planner.check import check_plan, format_violations
from planner.plan import load_plan
from profiles.jobs import load_jobs
from topology.topology import load_topology

PLANS = Path(__file__).resolve().parent.parent / "plans"
INPUTS = PLANS / "inputs"
EXAMPLES = {
    "micro-a.yaml": (INPUTS / "micro-a.topology.yaml", INPUTS / "micro-a.jobs.yaml"),
    "micro-b.yaml": (INPUTS / "micro-b.topology.yaml", INPUTS / "micro-b.jobs.yaml"),
    "micro-c.yaml": (INPUTS / "micro-c.topology.yaml", INPUTS / "micro-c.jobs.yaml"),
    "seed-a100-32.yaml": ("a100-32", INPUTS / "seed.jobs.yaml"),
    "mixed-20.yaml": ("weave-testbed", INPUTS / "mixed-20.jobs.yaml"),
}


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
