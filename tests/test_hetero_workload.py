"""The Hetero workload family (profiles/generators.py ``_hetero``): mixed job shapes, training that may
use 8 or 16 GPUs, rollout that may run on H800, 7B-70B models, Table 6 phase times."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from weave_rl.planner.api import make_plan
from weave_rl.planner.check import check_plan, format_violations
from weave_rl.planner.plan import Plan
from weave_rl.profiles.generators import (HETERO_FLEX_MAX_B, HETERO_FLEX_TRAIN_GPUS, HETERO_HOST_MEM_GB,
                                          HETERO_SHAPES, SYNTHETIC, generate)
from weave_rl.profiles.jobs import jobs_from_data, jobs_to_data, load_jobs
from weave_rl.topology.topology import load_topology

SEEDS = (1, 2, 3)
N = 200


@pytest.fixture(scope="module")
def drawn():
    return {seed: generate("Hetero", N, seed) for seed in SEEDS}


def test_same_seed_same_jobs_and_any_case():
    a = generate("Hetero", 30, 4)
    assert a == generate("hetero", 30, 4) == generate("HETERO", 30, 4)
    assert jobs_to_data(a) == jobs_to_data(generate("Hetero", 30, 4))
    assert a != generate("Hetero", 30, 5)
    assert len(generate("Hetero", 0, 4)) == 0


def test_cli_generates_the_family_in_any_case(tmp_path, capsys):
    from weave_rl.cli.app import main

    out = tmp_path / "hetero.yaml"
    assert main(["jobs", "generate", "hetero", "-n", "7", "-s", "3", "-o", str(out)]) == 0
    assert load_jobs(out) == generate("Hetero", 7, 3)
    assert main(["jobs", "generate", "huge", "-n", "7", "-o", str(tmp_path / "x.yaml")]) != 0
    assert "Hetero" in capsys.readouterr().err


def test_shares_of_the_mix(drawn):
    # Per 200 jobs: half 8 + 8, a sixth each of the others (binomial sd 7.1 and 5.3: +-3 sd and more).
    for seed, jobs in drawn.items():
        shapes = Counter((j.rollout.gpus, j.train.gpus) for j in jobs)
        assert set(shapes) == {(8, 8), (16, 16), (16, 8), (32, 16)}, seed
        assert 78 <= shapes[(8, 8)] <= 122, (seed, shapes)
        for shape in [(16, 16), (16, 8), (32, 16)]:
            assert 16 <= shapes[shape] <= 52, (seed, shapes)
        # Flexible training: a quarter of the jobs up to 32B; rollout on H800 too: a fifth of all jobs.
        small = [j for j in jobs if j.params_b <= HETERO_FLEX_MAX_B]
        flex = sum(j.train.gpu_options != (j.train.gpus,) for j in small)
        assert 0.13 * len(small) <= flex <= 0.37 * len(small), (seed, flex, len(small))
        h800 = sum(j.rollout.gpu_types != ("H20",) for j in jobs)
        assert 20 <= h800 <= 60, (seed, h800)
        assert {j.params_b for j in jobs} == {7, 14, 32, 70}, seed
    # Every variety turns up in the pooled 600 jobs: each shape with each of its sizes, flex and not.
    pooled = [j for jobs in drawn.values() for j in jobs]
    assert {(j.rollout.gpus, j.train.gpus, j.params_b) for j in pooled} == {
        (r, t, m) for (r, t), sizes in HETERO_SHAPES.items() for m in sizes}
    assert {(j.train.gpus, len(j.train.gpu_options)) for j in pooled} == {(8, 1), (8, 2), (16, 1), (16, 2)}


def test_every_job_validates_and_round_trips(drawn):
    for jobs in drawn.values():
        assert jobs_from_data(jobs_to_data(jobs), "hetero.yaml") == jobs
        assert len(set(jobs.names)) == N


def test_every_job_is_consistent(drawn):
    for jobs in drawn.values():
        arrivals = []
        for i, job in enumerate(jobs):
            r, t = job.rollout, job.train
            assert job.name == f"hetero-{i:03d}"
            assert job.params_b in HETERO_SHAPES[(r.gpus, t.gpus)], job.name
            assert (r.host_mem_gb, t.host_mem_gb) == HETERO_HOST_MEM_GB[int(job.params_b)]
            assert (r.gpu_type, t.gpu_type, t.gpu_types) == ("H20", "H800", ("H800",))
            assert r.gpu_types in {("H20",), ("H20", "H800")}
            assert r.gpu_options == (r.gpus,)
            assert t.gpu_options in {(t.gpus,), HETERO_FLEX_TRAIN_GPUS}
            if t.gpu_options == HETERO_FLEX_TRAIN_GPUS:
                assert job.params_b <= HETERO_FLEX_MAX_B and t.gpus in HETERO_FLEX_TRAIN_GPUS
                # The other width follows duration_at's default model: linear in 1 / gpus.
                other = 24 - t.gpus
                assert t.duration_at(0.5, other) == pytest.approx(t.duration_s.quantile(0.5) * t.gpus / other)
            if "H800" in r.gpu_types:
                assert r.duration_at(0.5, r.gpus, "H800") == pytest.approx(r.duration_s.quantile(0.5) * 4.0 / 3.35)
            # Phase times at the reference point lie in one of the nine Table 6 classes, to 0.1 s.
            roll, train = r.duration_s.quantile(0.5), t.duration_s.quantile(0.5)
            assert any(rlo <= roll <= rhi and tlo <= train <= thi
                       for sizes in SYNTHETIC.values() for (rlo, rhi), (tlo, thi) in sizes.values()), job.name
            assert round(roll, 1) == roll and round(train, 1) == train
            assert 1.0 <= job.slo <= 2.0 and round(job.slo, 2) == job.slo
            assert 50 <= job.iterations <= 300
            arrivals.append(job.arrival_s)
        assert arrivals[0] == 0 and arrivals == sorted(arrivals)
        assert 1400 < np.diff(arrivals).mean() < 2200  # exponential gaps, mean 1800 s


def test_small_instance_is_planned_validly_and_optimal_beats_weave():
    jobs = generate("Hetero", 10, 11)
    assert len({(j.rollout.gpus, j.train.gpus) for j in jobs}) >= 3  # a mixed instance, not all 8 + 8
    assert any(len(j.train.gpu_options) > 1 for j in jobs) and any(len(j.rollout.gpu_types) > 1 for j in jobs)
    topo = load_topology("weave-testbed")  # 41 + 41 nodes: room for Solo-D of all ten
    assert not make_plan(topo, jobs, policy="solo").rejected
    weave = make_plan(topo, jobs, policy="weave")
    opt = make_plan(topo, jobs, policy="optimal", time_limit_s=5, threads=2)
    for plan in (weave, opt):
        found = check_plan(Plan.model_validate(plan.model_dump()), topo, jobs)
        assert not found, format_violations(found)
    assert not opt.rejected and sum(len(g.jobs) for g in opt.groups) == len(jobs)
    assert opt.cost_usd_per_hour <= weave.cost_usd_per_hour + 1e-6
