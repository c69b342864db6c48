"""The workloads that compare with the Weave paper: the ``paper`` phase split of the micro-benchmark
jobs (profiles/generators.py MICRO_SPLITS) and the ``Production`` trace family.

Prices: an 8-GPU H20 node 14.80 $/h, an 8-GPU H800 node 42.24 $/h; Solo-D gives every job its own
nodes (8 + 8 = 57.04 $/h; C's 16 + 16 = 114.08 $/h).
"""

from __future__ import annotations

import numpy as np
import pytest

from bench.planner import MICRO, micro_jobs
from weave_rl.planner.api import make_plan
from weave_rl.planner.check import check_plan, format_violations
from weave_rl.planner.model import PlanningModel
from weave_rl.planner.throughput import iterations_per_usd
from weave_rl.profiles.generators import MICRO_SPLITS, generate, micro_job
from weave_rl.profiles.jobs import JobSet, load_jobs
from weave_rl.topology.topology import load_topology


@pytest.fixture(scope="module")
def topo():
    return load_topology("weave-testbed")


def solo(topo, letter: str, split: str = "paper") -> float:
    job = micro_job(letter, split=split)
    return PlanningModel(topo, JobSet(jobs=[job])).solo[job.name]


def test_paper_split_has_table_4_solo_times_and_the_stated_ratios(topo):
    # Table 4 Solo-D: (a) 257.7 s, (b) 525.4 s, (c) 574.6 s; this model's sync is part of the solo.
    assert solo(topo, "A") == pytest.approx(257.7, abs=0.1)
    assert solo(topo, "D") == pytest.approx(525.4, abs=0.1) and solo(topo, "E") == pytest.approx(525.4, abs=0.1)
    assert solo(topo, "C") == pytest.approx(574.6, abs=0.1)
    (rd, td), (re, te) = MICRO_SPLITS["paper"]["D"], MICRO_SPLITS["paper"]["E"]
    assert rd / td == pytest.approx(2.5, abs=0.01) and re / te == pytest.approx(6.0, abs=0.03)
    # D's rollout fits in C's training and D's two 16-GPU trainings (148.3 / 2 each) in C's rollout.
    (rc, tc) = MICRO_SPLITS["paper"]["C"]
    assert rd < tc and 2 * td / 2 < rc
    # The original split is unchanged and still micro_job's default.
    assert micro_job("A").rollout.duration_s.quantile(0.5) == 140.0
    assert MICRO_SPLITS["original"]["D"] == (300.0, 120.0)


@pytest.mark.parametrize("key, cost, vs_solo", [
    ("a", 57.04, 2.0),  # 2 A on one node pair at their solo time: half the $ for the same iterations
    ("b", 86.64, 171.12 / 86.64),  # one H800 node + an H20 node per job, at the solo times: 1.975x
    # C + 2 D on 2 + 2 nodes at C's 574.6 s: 3 / 574.6 iterations/s against Solo-D's
    # 1 / 574.6 + 2 / 525.4 at twice the price.
    ("c", 114.08, 2 * (3 / 574.6) / (1 / 574.6 + 2 / 525.4)),
])
def test_throughput_objective_reaches_the_papers_configurations(topo, key, cost, vs_solo):
    _, _, types, _, _, options = next(m for m in MICRO if m[0] == key)
    jobs = micro_jobs(types, options, "paper")
    plan = make_plan(topo, jobs, objective="throughput", threads=2)
    assert not check_plan(plan, topo, jobs), format_violations(check_plan(plan, topo, jobs))
    assert plan.cost_usd_per_hour == pytest.approx(cost)
    solo_plan = make_plan(topo, jobs, policy="solo")
    assert iterations_per_usd(plan) / iterations_per_usd(solo_plan) == pytest.approx(vs_solo, rel=2e-3)


def test_production_trace_has_the_papers_statistics():
    jobs = generate("Production", 200, seed=0)
    assert jobs == generate("Production", 200, seed=0) and len(set(jobs.names)) == 200
    arrivals = np.array([j.arrival_s for j in jobs])
    assert arrivals[0] == 0 and 1.5 < np.diff(arrivals).mean() / 3600 < 2.2  # paper: 370.2 h / 200 = 1.85 h
    hours = [j.iterations * (j.rollout.duration_s.quantile(0.5) + j.train.duration_s.quantile(0.5)) / 3600
             for j in jobs]
    assert 24 < np.mean(hours) < 32  # paper: mean 27.9 h
    assert {j.params_b for j in jobs} == {3, 7, 14, 32}
    assert any(j.rollout.gpus > 8 or j.train.gpus > 8 for j in jobs)
    for j in jobs:
        for phase in (j.rollout, j.train):
            d = phase.duration_s
            assert d.quantile(0.5) < d.quantile(0.95) < d.quantile("max")
        assert 1.0 <= j.slo <= 2.0


def test_cli_generates_the_production_family(tmp_path):
    from weave_rl.cli.app import main

    out = tmp_path / "prod.yaml"
    assert main(["jobs", "generate", "Production", "-n", "5", "-s", "3", "-o", str(out)]) == 0
    assert load_jobs(out) == generate("Production", 5, 3)
