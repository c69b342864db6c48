"""Own-job benchmark (issue 21): a user's own Workload and the built-in GRPO job on a dataset, co-scheduled
by an ``optimal`` plan on this machine's ``local`` topology, measured on real worker processes.

Run from the repository root::

    .venv/bin/python -m bench.own_job [--iterations 30] [--model tiny|DIR] [--dataset FILE]

The two jobs: ``own`` is ``examples/custom_job/digit_policy.py:LargestDigit`` (imported by every
worker from the example folder, as ``kind: digit_policy:LargestDigit``), ``grpo`` the built-in GRPO
job on ``examples/custom_job/prompts.jsonl`` (``--dataset``: another JSONL/parquet file with
``prompt`` and ``answer`` fields) with the ``exact`` reward, on the tiny char-level Llama or
``--model DIR``, a local Hugging Face causal-LM directory (its tokenizer and chat template).

a. reward curve: mean reward of the first and last 10 iterations of each job;
b. rollout tokens/s of each job (generated tokens over rollout phase time, the torch engine);
c. warm switch: ``to_device`` + ``to_host`` of each job's train state against a plain copy of the same
   bytes there and back (one thread, in this process);
d. iteration time against the plan after one ``profile fit``: fit the records of run (a), plan again
   at the median, run that plan, compare each job's steady iteration with the plan's ``iteration_s``
   (target within 10 %), with the time from a train phase's end to its weight sync's end (the
   trainer's offload and checkpoint, then the sync), which the fitted profiles do not model.

Figures only; nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

from bench.executor import steady, switch_bandwidth, verdict

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "custom_job"


def jobs_yaml(model: str, dataset: Path) -> str:
    own = (f'{{kind: "digit_policy:LargestDigit", dataset: "{EXAMPLE / "prompts.jsonl"}", batch: 64, group: 8, '
           f'hidden: 512, seed: 1}}')  # about the grpo job's cost per phase, so both fit their SLO together
    grpo = (f'{{kind: grpo, model: "{model}", dataset: "{dataset}", reward: exact, prompts_per_iteration: 8, '
            f'group_size: 8, max_new_tokens: 2, seed: 2}}')
    job = """  - name: {name}
    params_b: 0.0001
    slo: 3.0
    rollout: {{gpus: 1, gpu_type: CPU, duration_s: 0.05, host_mem_gb: 0.1}}
    train: {{gpus: 1, gpu_type: CPU, duration_s: 0.05, host_mem_gb: 0.1}}
    workload: {block}
"""
    return "jobs:\n" + job.format(name="own", block=own) + job.format(name="grpo", block=grpo)


def run(plan, topo, jobs, out: Path, iterations: int):
    from weave_rl.executor.local.devices import map_devices
    from weave_rl.executor.local.run import run_plan_local

    gpus = sorted({g for grp in plan.groups for jp in grp.jobs for s in jp.phases for g in s.gpus})
    return run_plan_local(plan, topo, jobs, out, iterations=iterations, devices=map_devices(gpus, None))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--model", default="tiny", help="tiny, or a local Hugging Face causal-LM directory")
    ap.add_argument("--dataset", type=Path, default=EXAMPLE / "prompts.jsonl")
    args = ap.parse_args(argv)
    # The workers are spawned: they get this sys.path and environment, and import digit_policy themselves.
    sys.path.insert(0, str(EXAMPLE))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH", "")]))
    from weave_rl.executor.inputs import load_run_inputs
    from weave_rl.executor.outputs import records_table
    from weave_rl.executor.workload import build_workload
    from weave_rl.planner.api import make_plan
    from weave_rl.planner.plan import save_plan
    from weave_rl.profiles.fit import fit_jobs
    from weave_rl.topology.topology import load_topology

    topo = load_topology("local")
    with tempfile.TemporaryDirectory(prefix="weave-own-job-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "jobs.yaml").write_text(jobs_yaml(args.model, args.dataset.resolve()))
        from weave_rl.profiles.jobs import load_jobs

        draft = load_jobs(tmp / "jobs.yaml", topo.gpu_types)
        plan = make_plan(topo, draft, policy="optimal", quantile=0.5, time_limit_s=10)
        save_plan(plan, tmp / "plan.yaml")
        plan, topo, jobs = load_run_inputs(tmp / "plan.yaml", tmp / "jobs.yaml", None)  # what weave run checks
        print(f"two jobs (own: digit_policy:LargestDigit; grpo: model {args.model}, {args.dataset.name}), "
              f"optimal plan on local: {len(plan.groups)} group(s), cycle {plan.groups[0].cycle_s:.3f} s; "
              f"{args.iterations} iterations")
        first = run(plan, topo, jobs, tmp / "run", args.iterations)
        frame = records_table(first.controller)

        print("\na. reward curve (mean reward, first 10 / last 10 iterations)")
        for job in ("own", "grpo"):
            rows = sorted((r for r in first.job_rows if r["job"] == job), key=lambda r: r["iteration"])
            rewards = [r.get("reward_mean", r.get("mean_reward")) for r in rows]
            head, tail = rewards[:10], rewards[-10:]
            up = sum(tail) / len(tail) - sum(head) / len(head)
            print(f"   {job}: {sum(head) / len(head):.3f} -> {sum(tail) / len(tail):.3f} ({up:+.3f})  "
                  f"{verdict(up > 0)}")

        print("\nb. rollout tokens/s (torch engine, one worker)")
        for job in ("own", "grpo"):
            rows = frame[(frame.job == job) & (frame.phase == "rollout")]
            print(f"   {job}: {rows.tokens.sum() / rows.duration_s.sum():,.0f} tokens/s "
                  f"({int(rows.tokens.sum()):,} tokens in {rows.duration_s.sum():.2f} s of rollout)")

        print("\nc. warm switch of the train state (to_device + to_host) vs a plain copy of the same bytes")
        torch.set_num_threads(1)
        for job in ("own", "grpo"):
            wl = build_workload(job, jobs[job].workload)
            nbytes, switch, copy = switch_bandwidth(wl, "train", torch.device("cpu"))
            print(f"   {job}: {nbytes / 1e6:.2f} MB, switch {switch / 1e9:.2f} GB/s, plain copy {copy / 1e9:.2f} GB/s "
                  f"({100 * switch / copy:.0f}%)")

        print("\nd. measured iteration vs the plan after one profile fit")
        fitted = fit_jobs(frame, jobs)
        plan2 = make_plan(topo, fitted, policy="optimal", quantile=0.5, time_limit_s=10)
        again = run(plan2, topo, fitted, tmp / "refit", max(10, args.iterations // 2))
        from weave_rl.cli.demo import after_train

        gaps = after_train(records_table(again.controller))
        worst = 0.0
        for grp in plan2.groups:
            for jp in grp.jobs:
                measured = steady(again, jp.name)
                dev = measured / jp.iteration_s - 1
                worst = max(worst, abs(dev))
                sync = sum(ph.duration_s for ph in jp.phases if ph.phase == "sync")
                print(f"   {jp.name}: plan {jp.iteration_s:.3f} s, measured steady {measured:.3f} s ({100 * dev:+.1f}%); "
                      f"train end -> sync end {gaps.get(jp.name, float('nan')):.3f} s measured, {sync:.3f} s planned")
        for r in plan2.rejected:
            print(f"   {r.name}: rejected by the refit plan ({r.reason})")
        print(f"   worst deviation {100 * worst:.1f}%  {verdict(worst <= 0.10)} (target within 10%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
